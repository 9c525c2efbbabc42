"""Network data: a MATPOWER case (``.m`` text or MATPOWER-style arrays) as flat numpy arrays.

A :class:`Case` holds one network in internal, 0-based, contiguous bus order with every
quantity in the unit MATPOWER uses in its tables (MW, MVAr, per-unit impedance on the system
base, degrees, kV). Conversions to per unit happen in the kernels' callers (``ybus.py``), never
in the kernels.

Reader: :func:`read_matpower` parses the subset of MATPOWER's case format (version 2) that power
flow needs: ``mpc.baseMVA``, ``mpc.bus``, ``mpc.gen``, ``mpc.branch`` (other fields such as
``gencost`` are skipped). :func:`case_from_ppc` builds the same object from the arrays of a
pandapower/PYPOWER "ppc" (0-based bus numbers, optional pandapower branch column ``BR_G`` at 23).
Column meanings follow MATPOWER's ``caseformat`` (bus: BUS_I TYPE PD QD GS BS AREA VM VA BASE_KV
ZONE VMAX VMIN; gen: GEN_BUS PG QG QMAX QMIN VG MBASE GEN_STATUS PMAX PMIN; branch: F_BUS T_BUS
BR_R BR_X BR_B RATE_A RATE_B RATE_C TAP SHIFT BR_STATUS ANGMIN ANGMAX).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

PQ, PV, REF, NONE = 1, 2, 3, 4


class CaseFormatError(ValueError):
    """A case file or case array that cannot be read; the message names the file/field and why."""


@dataclass
class Case:
    """One network, 0-based internal bus order; units as in MATPOWER tables.

    Bus arrays (n_bus): ``bus_id`` original number, ``bus_type`` (1 PQ, 2 PV, 3 ref, 4 isolated),
    ``pd_mw``/``qd_mvar`` load, ``gs_mw``/``bs_mvar`` shunt at V = 1 pu, ``vm_pu``/``va_deg``
    initial voltage, ``base_kv``, ``vmax_pu``/``vmin_pu``.
    Generator arrays (n_gen): ``gen_bus`` (internal index), ``pg_mw``, ``qg_mvar``, ``qmax_mvar``,
    ``qmin_mvar``, ``vg_pu`` voltage setpoint, ``mbase_mva``, ``gen_status`` (1 in service),
    ``pmax_mw``, ``pmin_mw``.
    Branch arrays (n_branch): ``f_bus``/``t_bus`` (internal), ``r_pu``/``x_pu``/``b_pu`` series
    impedance and total line charging on the system base, ``g_pu`` total shunt conductance
    (pandapower's transformer magnetizing losses; 0 for MATPOWER files), ``rate_a_mva`` (0 = no
    limit), ``tap`` off-nominal turns ratio at the from side (1.0 for lines; MATPOWER's 0 is
    converted to 1), ``shift_deg`` phase shift, ``br_status`` (1 in service).
    """

    base_mva: float
    bus_id: np.ndarray
    bus_type: np.ndarray
    pd_mw: np.ndarray
    qd_mvar: np.ndarray
    gs_mw: np.ndarray
    bs_mvar: np.ndarray
    vm_pu: np.ndarray
    va_deg: np.ndarray
    base_kv: np.ndarray
    vmax_pu: np.ndarray
    vmin_pu: np.ndarray
    gen_bus: np.ndarray
    pg_mw: np.ndarray
    qg_mvar: np.ndarray
    qmax_mvar: np.ndarray
    qmin_mvar: np.ndarray
    vg_pu: np.ndarray
    mbase_mva: np.ndarray
    gen_status: np.ndarray
    pmax_mw: np.ndarray
    pmin_mw: np.ndarray
    f_bus: np.ndarray
    t_bus: np.ndarray
    r_pu: np.ndarray
    x_pu: np.ndarray
    b_pu: np.ndarray
    g_pu: np.ndarray
    rate_a_mva: np.ndarray
    tap: np.ndarray
    shift_deg: np.ndarray
    br_status: np.ndarray
    name: str = ""

    @property
    def n_bus(self) -> int:
        return len(self.bus_id)

    @property
    def n_gen(self) -> int:
        return len(self.gen_bus)

    @property
    def n_branch(self) -> int:
        return len(self.f_bus)

    def copy(self) -> "Case":
        kw = {f.name: (getattr(self, f.name).copy() if isinstance(getattr(self, f.name), np.ndarray)
                       else getattr(self, f.name)) for f in fields(self)}
        return Case(**kw)

    def bus_index(self, bus_number: int) -> int:
        """Internal index of the bus with MATPOWER number ``bus_number``."""
        hits = np.flatnonzero(self.bus_id == bus_number)
        if len(hits) != 1:
            raise KeyError(f"bus {bus_number} is not in case {self.name!r}")
        return int(hits[0])


_ASSIGN = re.compile(r"mpc\.(\w+)\s*=\s*", re.M)


def _strip_comments(text: str) -> str:
    # MATPOWER case files use % comments; strings in them never contain '%'.
    return "\n".join(line.split("%", 1)[0] for line in text.splitlines())


def _parse_matrix(body: str, key: str, where: str) -> np.ndarray:
    rows = []
    for chunk in re.split(r"[;\n]", body):
        chunk = chunk.strip()
        if not chunk:
            continue
        try:
            rows.append([float(tok) for tok in chunk.replace(",", " ").split()])
        except ValueError as exc:
            raise CaseFormatError(f"{where}: mpc.{key}: cannot read row {chunk[:60]!r} ({exc})") from None
    if not rows:
        raise CaseFormatError(f"{where}: mpc.{key} is empty")
    width = max(len(r) for r in rows)
    if any(len(r) != width for r in rows):
        raise CaseFormatError(f"{where}: mpc.{key}: rows of different lengths")
    return np.asarray(rows, dtype=np.float64)


def parse_matpower(text: str, where: str = "<string>") -> dict:
    """The numeric fields of a MATPOWER case text: {'baseMVA': float, 'bus': array, ...}."""
    text = _strip_comments(text)
    out: dict = {}
    for m in _ASSIGN.finditer(text):
        key, start = m.group(1), m.end()
        if text.startswith("[", start):
            end = text.find("]", start)
            if end < 0:
                raise CaseFormatError(f"{where}: mpc.{key}: missing closing ']'")
            if key in ("bus", "gen", "branch"):
                out[key] = _parse_matrix(text[start + 1:end], key, where)
        elif key == "baseMVA":
            val = text[start:text.find(";", start)].strip()
            try:
                out[key] = float(val)
            except ValueError:
                raise CaseFormatError(f"{where}: mpc.baseMVA: {val!r} is not a number") from None
    for key in ("baseMVA", "bus", "gen", "branch"):
        if key not in out:
            raise CaseFormatError(f"{where}: mpc.{key} is missing")
    return out


def read_matpower(path: str | Path) -> Case:
    """Read a MATPOWER version-2 case file (``.m``) into a :class:`Case`."""
    path = Path(path)
    data = parse_matpower(path.read_text(), str(path))
    return case_from_ppc(data["baseMVA"], data["bus"], data["gen"], data["branch"],
                         name=path.stem, where=str(path))


def case_from_ppc(base_mva, bus, gen, branch, name: str = "", where: str = "ppc") -> Case:
    """A :class:`Case` from MATPOWER-style tables (bus numbers arbitrary positive or 0-based)."""
    bus = np.atleast_2d(np.asarray(bus, dtype=np.float64))
    gen = np.atleast_2d(np.asarray(gen, dtype=np.float64))
    branch = np.atleast_2d(np.asarray(branch, dtype=np.float64))
    for key, arr, width in (("bus", bus, 13), ("gen", gen, 10), ("branch", branch, 11)):
        if arr.shape[1] < width:
            raise CaseFormatError(f"{where}: mpc.{key} has {arr.shape[1]} columns, needs >= {width}")
    base_mva = float(base_mva)
    if not base_mva > 0:
        raise CaseFormatError(f"{where}: mpc.baseMVA = {base_mva} is not positive")
    ids = bus[:, 0].astype(np.int64)
    if len(np.unique(ids)) != len(ids):
        raise CaseFormatError(f"{where}: mpc.bus: duplicate bus numbers")
    lookup = {int(b): i for i, b in enumerate(ids)}

    def internal(col: np.ndarray, key: str) -> np.ndarray:
        try:
            return np.array([lookup[int(b)] for b in col], dtype=np.int64)
        except KeyError as exc:
            raise CaseFormatError(f"{where}: mpc.{key} refers to bus {exc.args[0]}, not in mpc.bus") from None

    f_bus, t_bus = internal(branch[:, 0], "branch"), internal(branch[:, 1], "branch")
    r, x = branch[:, 2].copy(), branch[:, 3].copy()
    bad = np.flatnonzero((r == 0) & (x == 0))
    if len(bad):
        raise CaseFormatError(f"{where}: mpc.branch row {bad[0] + 1}: zero impedance (r = x = 0)")
    asym_cols = [c for c in (21, 22, 24, 25) if c < branch.shape[1]]  # pandapower BR_R/X/G/B_ASYM
    if branch.shape[1] > 23 and np.any(branch[:, asym_cols] != 0):
        raise CaseFormatError(f"{where}: mpc.branch: asymmetric branch data (pandapower BR_*_ASYM) is not supported")
    tap = branch[:, 8].copy()
    tap[tap == 0] = 1.0
    g = branch[:, 23].copy() if branch.shape[1] > 23 else np.zeros(len(branch))
    btype = bus[:, 1].astype(np.int8)
    if not np.all(np.isin(btype, (PQ, PV, REF, NONE))):
        raise CaseFormatError(f"{where}: mpc.bus: bus type must be 1, 2, 3 or 4")
    vm = bus[:, 7].copy()
    vm[~np.isfinite(vm) | (vm <= 0)] = 1.0
    return Case(
        base_mva=base_mva, bus_id=ids, bus_type=btype,
        pd_mw=bus[:, 2].copy(), qd_mvar=bus[:, 3].copy(), gs_mw=bus[:, 4].copy(), bs_mvar=bus[:, 5].copy(),
        vm_pu=vm, va_deg=np.nan_to_num(bus[:, 8]), base_kv=bus[:, 9].copy(),
        vmax_pu=bus[:, 11].copy(), vmin_pu=bus[:, 12].copy(),
        gen_bus=internal(gen[:, 0], "gen"), pg_mw=gen[:, 1].copy(), qg_mvar=np.nan_to_num(gen[:, 2]),
        qmax_mvar=gen[:, 3].copy(), qmin_mvar=gen[:, 4].copy(), vg_pu=gen[:, 5].copy(),
        mbase_mva=np.where(gen[:, 6] > 0, gen[:, 6], base_mva), gen_status=(gen[:, 7] > 0).astype(np.int8),
        pmax_mw=gen[:, 8].copy(), pmin_mw=gen[:, 9].copy(),
        f_bus=f_bus, t_bus=t_bus, r_pu=r, x_pu=x, b_pu=branch[:, 4].copy(), g_pu=g,
        rate_a_mva=branch[:, 5].copy(), tap=tap, shift_deg=branch[:, 9].copy(),
        br_status=(branch[:, 10] > 0).astype(np.int8), name=name,
    )
