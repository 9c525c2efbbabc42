"""Case files a grid engineer brings, by suffix, into a :class:`~plants.grid.case.Case`.

- ``.m``: MATPOWER version-2 text (:func:`plants.grid.case.read_matpower`);
- ``.mat``: MATPOWER ``savecase`` / pandapower ``to_mpc`` output, a MAT-file holding one struct
  (usually ``mpc``) with ``baseMVA``, ``bus``, ``gen``, ``branch`` (read with ``scipy.io.loadmat``);
- ``.py``: PYPOWER ``savecase`` output or a PYPOWER case module: ``ppc["bus"] = array([...])``
  assignments, read as literals with ``ast`` (the file is never executed);
- ``.json``: a pandapower network (``pandapower.to_json``), converted by pandapower itself to its
  power-flow case (``pandapower.converter.to_ppc``; pandapower must be installed).

Every failure is a :class:`~plants.grid.case.CaseFormatError` naming the file and the field.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np

from plants.grid.case import Case, CaseFormatError, case_from_ppc, parse_matpower

SUFFIXES = (".m", ".mat", ".py", ".json")
_FIELDS = ("baseMVA", "bus", "gen", "branch")


def read_case(path: str | Path) -> Case:
    """The case in ``path`` (format by suffix, see the module docstring)."""
    path = Path(path)
    suffix = path.suffix.lower()
    readers = {".m": _read_m, ".mat": _read_mat, ".py": _read_py, ".json": _read_pandapower_json}
    if suffix not in readers:
        raise CaseFormatError(f"{path}: unknown case format {suffix or '(no suffix)'!r}; "
                              f"readable: {', '.join(SUFFIXES)}")
    try:
        data = readers[suffix](path)
    except OSError as exc:
        raise CaseFormatError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return case_from_ppc(data["baseMVA"], data["bus"], data["gen"], data["branch"], name=path.stem,
                         where=str(path))


def _read_m(path: Path) -> dict:
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        if raw[:6] == b"MATLAB":
            raise CaseFormatError(f"{path}: a MAT-file (binary), not MATPOWER text: name it .mat") from None
        text = raw.decode("latin-1")  # comments in a legacy encoding; the numbers are ASCII
    return parse_matpower(text, str(path))


def _read_mat(path: Path) -> dict:
    from scipy.io import loadmat

    try:
        mat = loadmat(str(path), squeeze_me=True, struct_as_record=False)
    except Exception as exc:  # scipy raises ValueError/TypeError/MatReadError on a bad file
        raise CaseFormatError(f"{path}: not a readable MAT-file ({type(exc).__name__}: {exc})") from None
    names = [k for k in mat if not k.startswith("__")]
    holder = None
    for k in ["mpc"] + names:  # MATPOWER and pandapower save the struct as `mpc`
        v = mat.get(k)
        if v is not None and all(hasattr(v, f) for f in _FIELDS):
            holder = {f: getattr(v, f) for f in _FIELDS}
            break
    if holder is None and all(f in mat for f in _FIELDS):  # the fields saved as top-level variables
        holder = {f: mat[f] for f in _FIELDS}
    if holder is None:
        raise CaseFormatError(f"{path}: no struct with fields baseMVA, bus, gen, branch (variables: "
                              f"{', '.join(names) or 'none'})")
    return {k: _matrix(path, k, v) for k, v in holder.items()}


def _matrix(path: Path, key: str, value) -> np.ndarray | float:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise CaseFormatError(f"{path}: mpc.{key}: not numeric ({type(value).__name__})") from None
    if key == "baseMVA":
        if arr.size != 1:
            raise CaseFormatError(f"{path}: mpc.baseMVA: expected one number, got shape {arr.shape}")
        return float(arr.reshape(-1)[0])
    if arr.ndim == 1:  # squeeze_me turns a one-row table into a vector
        arr = arr[None, :]
    if arr.ndim != 2 or arr.size == 0:
        raise CaseFormatError(f"{path}: mpc.{key}: expected a non-empty table, got shape {arr.shape}")
    return arr


def _read_py(path: Path) -> dict:
    """PYPOWER's case modules: ``ppc = {...}`` and ``ppc["key"] = array([...])`` / number, read as
    literals (``array(...)`` unwrapped); nothing in the file runs."""
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        tree = ast.parse(text, filename=str(path))
    except SyntaxError as exc:
        raise CaseFormatError(f"{path}: line {exc.lineno}: not Python ({exc.msg})") from None
    found: dict = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target = node.targets[0]
        if isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant) \
                and target.slice.value in _FIELDS:
            found[target.slice.value] = (node.value, node.lineno)
        elif isinstance(node.value, ast.Dict):  # ppc = {"baseMVA": 100.0, "bus": array([...]), ...}
            for k, v in zip(node.value.keys, node.value.values):
                if isinstance(k, ast.Constant) and k.value in _FIELDS:
                    found.setdefault(k.value, (v, node.lineno))
    missing = [f for f in _FIELDS if f not in found]
    if missing:
        raise CaseFormatError(f"{path}: ppc[{missing[0]!r}] is missing (PYPOWER case: ppc[\"bus\"] = array([...]))")
    out = {}
    for key, (value, line) in found.items():
        if isinstance(value, ast.Call) and len(value.args) == 1 and not value.keywords:
            value = value.args[0]  # array([...]) / np.array([...])
        try:
            literal = ast.literal_eval(value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            raise CaseFormatError(f"{path}: line {line}: ppc[{key!r}] is not a literal number or table") from None
        out[key] = _matrix(path, key, literal)
    return out


def _read_pandapower_json(path: Path) -> dict:
    try:
        import pandapower as pp
        from pandapower.converter import to_ppc
    except ImportError:
        raise CaseFormatError(f"{path}: a pandapower JSON network needs pandapower installed "
                              "(pip install pandapower), or export it with pandapower.converter.to_mpc "
                              "to a .mat file") from None
    try:
        net = pp.from_json(str(path))
    except Exception as exc:  # pandapower raises many types on a bad file
        raise CaseFormatError(f"{path}: not a pandapower JSON network ({type(exc).__name__}: {exc})") from None
    try:
        ppc = to_ppc(net, init="flat", calculate_voltage_angles=True)
    except Exception as exc:
        raise CaseFormatError(f"{path}: pandapower could not convert the network to a case "
                              f"({type(exc).__name__}: {exc})") from None
    return {k: _matrix(path, k, ppc[k]) for k in _FIELDS}
