"""A safe arithmetic expression over named signals: the reward of `[gym].reward`.

The expression is parsed with `ast` and only this grammar is accepted (anything else is a
ConfigError naming the construct), then compiled into nested closures: no `eval`, no
attribute access on Python objects, no calls but the listed functions.

    numbers          1, 0.5, 1e-3
    signals          x.<state>  y.<output> (true)  meas.<output> (measured, what the policy
                     sees)  u.<input> (applied)  cmd.<input> (commanded: the action after the
                     loop's clip to physical bounds)  du.<input> (change of the applied input
                     over the step)  t_s (simulated s at the end of the step)
    operators        + - * / ** unary -, comparisons < <= > >= (1.0 or 0.0)
    functions        abs min max sqrt exp log clip(v, lo, hi) where(cond, a, b)

Signals are in plant units (spec units: g/L, %, L/h, ...). Each variable evaluates to a
float (single env) or to a float64 array over the envs (vector env): the same closures
serve both, element-wise.
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Callable

import numpy as np

from hil.errors import ConfigError

BLOCKS = {"x": "states", "y": "outputs", "meas": "outputs", "u": "inputs", "cmd": "inputs", "du": "inputs"}
SCALARS = ("t_s",)

_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.Pow: operator.pow}
_CMP = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge}


def _exp_libm(v: float) -> float:
    try:
        return math.exp(v)
    except OverflowError:
        return math.inf


def _log_libm(v: float) -> float:
    if v > 0.0 or v != v:
        return math.log(v)  # log(inf) = inf, log(nan) = nan
    return -math.inf if v == 0.0 else math.nan


def _libm(fn: Callable[[float], float]) -> Callable:
    """`fn` element-wise through the C library's function, as the compiled reward calls it.

    numpy's own exp and log are SIMD implementations on CPUs with AVX-512 and may differ from the
    C library's in the last bit (seen: 4.4e-16 in a reward of 3.135 on an AMD EPYC), while the
    Numba kernels (hil/gym/fused.py) call the C library's: the numpy path would then not be the
    fused step bit for bit. Element-wise Python calls cost ~0.1 us each: this path is the
    reference, not the fast one."""
    ufunc = np.frompyfunc(fn, 1, 1)

    def apply(v):
        if isinstance(v, float):
            return fn(v)
        return ufunc(np.asarray(v, dtype=np.float64)).astype(np.float64)

    return apply


_FUNCS = {"abs": (1, np.abs), "sqrt": (1, np.sqrt), "exp": (1, _libm(_exp_libm)), "log": (1, _libm(_log_libm)),
          "min": (2, np.minimum), "max": (2, np.maximum), "clip": (3, np.clip),
          "where": (3, lambda c, a, b: np.where(np.asarray(c) != 0, a, b))}

Signals = dict  # block name -> array (n,) or (N, n); "t_s" -> float or (N,)


class Expression:
    """A compiled reward expression. `used` lists the (block, name) signals it reads."""

    def __init__(self, text: str, spec, key: str = "gym.reward"):
        self.text, self.key = text, key
        self.used: list[tuple[str, str]] = []
        try:
            tree = ast.parse(text, mode="eval")
        except SyntaxError as exc:
            raise ConfigError(key, f"not an expression: {exc.msg} at column {exc.offset}") from None
        self._spec = spec
        self._fn = self._compile(tree.body)

    def __call__(self, sig: Signals):
        """Value over the signals (float, or float64 array over envs)."""
        return self._fn(sig)

    def _err(self, node, why: str) -> ConfigError:
        return ConfigError(self.key, f"{why} (column {getattr(node, 'col_offset', 0) + 1} of {self.text!r})")

    def _compile(self, node) -> Callable:
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
                raise self._err(node, f"only numbers may be constants, not {node.value!r}")
            v = float(node.value)
            return lambda s: v
        if isinstance(node, ast.Name):
            if node.id in SCALARS:
                name = node.id
                return lambda s: s[name]
            if node.id in ("pi", "e"):
                v = math.pi if node.id == "pi" else math.e
                return lambda s: v
            raise self._err(node, f"unknown name {node.id!r}: signals are x.<state>, y.<output>, meas.<output>, "
                                  "u.<input>, cmd.<input>, du.<input>, or t_s")
        if isinstance(node, ast.Attribute):
            if not isinstance(node.value, ast.Name) or node.value.id not in BLOCKS:
                raise self._err(node, f"unknown signal block in {ast.unparse(node)!r} (blocks: {', '.join(BLOCKS)})")
            block, name = node.value.id, node.attr
            kind = BLOCKS[block]
            try:
                i = self._spec.index(kind, name)
            except KeyError as exc:
                raise self._err(node, str(exc.args[0])) from None
            self.used.append((block, name))
            return lambda s: s[block][..., i]
        if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
            op, a, b = _BIN[type(node.op)], self._compile(node.left), self._compile(node.right)
            return lambda s: op(a(s), b(s))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            a = self._compile(node.operand)
            return (lambda s: -a(s)) if isinstance(node.op, ast.USub) else a
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMP:
            op, a, b = _CMP[type(node.ops[0])], self._compile(node.left), self._compile(node.comparators[0])
            return lambda s: np.asarray(op(a(s), b(s)), dtype=np.float64)
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCS or node.keywords:
                raise self._err(node, f"unknown function in {ast.unparse(node)!r} (functions: {', '.join(_FUNCS)})")
            n_args, fn = _FUNCS[node.func.id]
            if len(node.args) != n_args:
                raise self._err(node, f"{node.func.id}() takes {n_args} argument(s), got {len(node.args)}")
            args = [self._compile(a) for a in node.args]
            return lambda s: fn(*(a(s) for a in args))
        raise self._err(node, f"{type(node).__name__} is not allowed in a reward expression")
