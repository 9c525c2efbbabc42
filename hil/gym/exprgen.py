"""The reward expression (hil/gym/expr.py) as Python source for a Numba kernel.

`Expression` evaluates `[gym].reward` with numpy over the signals (a float per instance in
the single env, arrays in the vector env). The vector env's compiled step (hil/gym/fused.py)
evaluates it per instance inside the kernel instead: this module turns the same validated
grammar into the text of one scalar function

    def reward_of(x, y, meas, u, cmd, du, t_s):   # rows of one instance, t_s float (s)
        return <expression>

with every signal an index into its row (`y.dissolved_oxygen` -> `y[1]`) and every operation
with numpy's float64 scalar semantics, which the single env uses (NaN propagates through
min/max/clip, a comparison is 1.0 or 0.0, x / 0 is +-inf or NaN: the kernel is compiled with
error_model="numpy"; `**` is C pow, as numpy's scalar power). The grammar is checked by
`Expression` first; anything else here is a bug, not a user error.
"""

from __future__ import annotations

import ast
import math

from hil.gym.expr import BLOCKS, SCALARS, Expression

_BIN = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Pow: "**"}
_CMP = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}
_FUNCS = {"abs": "_abs", "sqrt": "_sqrt", "exp": "_exp", "log": "_log", "min": "_min", "max": "_max",
          "clip": "_clip", "where": "_where"}

#: numpy-semantics scalar helpers the generated function calls (defined in hil/gym/fused.py's
#: template, so that the generated module is self-contained for Numba's cache).
HELPERS = '''
@njit(cache=True, nogil=True, inline="always")
def _abs(a):
    return np.abs(a)


@njit(cache=True, nogil=True, inline="always")
def _sqrt(a):
    return np.sqrt(a)


@njit(cache=True, nogil=True, inline="always")
def _exp(a):
    return np.exp(a)


@njit(cache=True, nogil=True, inline="always")
def _log(a):
    return np.log(a)


@njit(cache=True, nogil=True, inline="always")
def _min(a, b):
    return np.minimum(a, b)


@njit(cache=True, nogil=True, inline="always")
def _max(a, b):
    return np.maximum(a, b)


@njit(cache=True, nogil=True, inline="always")
def _clip(a, lo, hi):
    return np.minimum(np.maximum(a, lo), hi)


@njit(cache=True, nogil=True, inline="always")
def _where(c, a, b):
    return a if c != 0.0 else b
'''


def reward_source(expr: Expression, name: str = "reward_of") -> str:
    """`def name(x, y, meas, u, cmd, du, t_s): return ...` for a validated Expression."""
    body = _emit(ast.parse(expr.text, mode="eval").body, expr)
    return (f"@njit(cache=True, nogil=True, error_model=\"numpy\")\n"
            f"def {name}(x, y, meas, u, cmd, du, t_s):\n"
            f"    return float({body})\n")


def _emit(node, expr: Expression) -> str:
    spec = expr._spec
    if isinstance(node, ast.Constant):
        return repr(float(node.value))
    if isinstance(node, ast.Name):
        if node.id in SCALARS:
            return node.id
        if node.id in ("pi", "e"):
            return repr(math.pi if node.id == "pi" else math.e)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in BLOCKS:
        return f"{node.value.id}[{spec.index(BLOCKS[node.value.id], node.attr)}]"
    if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
        return f"({_emit(node.left, expr)} {_BIN[type(node.op)]} {_emit(node.right, expr)})"
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return f"({'-' if isinstance(node.op, ast.USub) else '+'}{_emit(node.operand, expr)})"
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMP:
        a, b = _emit(node.left, expr), _emit(node.comparators[0], expr)
        return f"(1.0 if {a} {_CMP[type(node.ops[0])]} {b} else 0.0)"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS:
        return f"{_FUNCS[node.func.id]}({', '.join(_emit(a, expr) for a in node.args)})"
    raise AssertionError(f"reward expression {expr.text!r}: {ast.dump(node)} passed Expression but has no code")
