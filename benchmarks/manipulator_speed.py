"""ABA and the Panda plant step against Pinocchio, called the same way (Franka Panda, 7 joints).

How the comparison is made fair (benchmarks/README.md):
- Identical work: hil's `aba` and Pinocchio's `aba` on the same URDF (fingers locked), the same
  (q, dq, tau) states; the answers are checked to agree (max |ddq difference| < 1e-9 rad/s^2 on
  1000 states, and again on the arrays written while timing) before any figure is printed.
- Same call path: from Python, one call per state, both cycling over the same 64 states with the
  same slicing (`hil` through `dynamics.aba_buf(chain.buf, q, dq, tau, ddq)`, Pinocchio through
  `pin.aba(model, data, q, dq, tau)`, its documented Python API; `hil_chain_method` is the
  same kernel through the `Chain.aba` method, one Python frame more). hil writes ddq into the
  caller's array (out argument), Pinocchio returns its own (its Python API has no out=). Batched: N states in one call (hil's `aba_batch`) against Pinocchio in a Python loop and
  against Pinocchio's own batched C++ call `pin.abaInParallel` on 1 thread.
- In-kernel: hil's ABA in a Numba loop is compared with Pinocchio's C++ figure. That figure is a
  documented constant, NOT measured here (`PINOCCHIO_CPP_ABA_US`, see its comment); the
  measured stand-in is `pin.abaInParallel` on 1 thread per state (Pinocchio's C++ loop, called
  once from Python).
- Timing: fair.interleaved: blocks interleaved, order rotated, thread CPU time, >= 3 repeats,
  medians with min/max over repeats. Ratios are peer / hil (> 1: hil faster; < 1: a loss).

Human-readable lines go to stderr; the last line of stdout is one JSON object:

    python_call_us       {hil, pin, hil_chain_method}: us per ABA called from Python, summaries
                         over repeats (hil: aba_buf; hil_chain_method: Chain.aba, informational)
    batch_us_per_state   {hil_aba_batch, pin_python_loop, pin_aba_in_parallel_1thread,
                          hil_numba_loop}: us per state over N states in one call
    ratios               peer / hil for each comparison
    max_abs_diff_qdd     {vs_pin_python, batch_vs_pin, batch_vs_pin_parallel} (rad/s^2)
    kernel_vs_pinocchio_cpp  hil's in-kernel median against the documented constant
    step_us / step_python_call_us  one full 1 ms plant step (4 sub-steps: drives, current loop,
                          friction, stops, ABA, gripper, held object in contact), in a Numba loop
                          and called from Python (what the loop pays); no peer
    references:          hil_aba_alloc_per_call_us (hil's ABA allocating its 13 work arrays per
                          call), textbook_6x6_numba_aba_us (a textbook Numba ABA on 6x6 matrices
                          and numpy products, allocating), its max |ddq - hil|, MuJoCo mj_step
                          (different work: it integrates; no ratio) and mj_forward's agreement
    goals, goals_met, goal_met (every goal), headline (rows of the generated results table)

Usage: python benchmarks/manipulator_speed.py [--quick] [--batch 256]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import fair  # noqa: E402

from numba import njit  # noqa: E402

from plants.manipulator import dynamics as dyn  # noqa: E402
from plants.manipulator.arm import DEFAULT_SUBSTEPS, ArmModel, step  # noqa: E402
from plants.manipulator.chain import PANDA_LOCK, PANDA_URDF, Chain, load_panda  # noqa: E402
from plants.manipulator.layout import MODE_POSITION  # noqa: E402

#: Pinocchio's own C++ ABA on the Panda, us per call: NOT measured by this benchmark. Source: the
#: manipulator issue (issue 11, "Performance"): "Measured on this machine kind: Pinocchio ABA
#: 2.30 us in C++, 2.79 us through its Python bindings" (a C++ timing loop outside this
#: repository; its method and load are not recorded). Shown beside hil's in-kernel figure
#: labelled as such; `pin.abaInParallel` on 1 thread is the C++ figure measured in this run.
PINOCCHIO_CPP_ABA_US = 2.30
AGREE = 1e-9  # rad/s^2: hil and Pinocchio must agree to this on every checked state
GOALS = {
    "python_call_ratio_pin_over_hil": 1.0,   # called from Python: hil <= 1.0x pin.aba's time
    "kernel_aba_us": PINOCCHIO_CPP_ABA_US,    # in-kernel: <= Pinocchio's C++ figure
    "step_us": 50.0,                          # one 1 ms plant step with contact
    "max_abs_diff_qdd": AGREE,
}



def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@njit(nogil=True)
def _aba_loop(n, parent, jtype, Et, rt, I, arm, g, Q, dQ, TAU, fext, ddq, E, r, v, c, pA, IA, U, D, u, acc, T, tmp):
    m = Q.shape[0]
    for k in range(n):
        j = k % m
        dyn.aba(parent, jtype, Et, rt, I, arm, g, Q[j], dQ[j], TAU[j], fext, ddq,
                E, r, v, c, pA, IA, U, D, u, acc, T, tmp)


@njit(nogil=True)
def _step_loop(n, x, u, p, dt, n_sub, mf, mi, wf):
    t = 0.0
    for _ in range(n):
        t = step(t, x, u, p, dt, n_sub, mf, mi, wf)
    return t


# --- naive references -----------------------------------------------------------------
@njit(nogil=True)
def alloc_aba(parent, jtype, Et, rt, I, arm, g, q, dq, tau, fext):
    """hil's ABA with its work arrays allocated per call (the "naive Numba" reference)."""
    nb = q.size
    ddq = np.empty(nb)
    dyn.aba(parent, jtype, Et, rt, I, arm, g, q, dq, tau, fext, ddq,
            np.empty((nb, 3, 3)), np.empty((nb, 3)), np.empty((nb, 6)), np.empty((nb, 6)),
            np.empty((nb, 6)), np.empty((nb, 6, 6)), np.empty((nb, 6)), np.empty(nb), np.empty(nb),
            np.empty((nb, 6)), np.empty((6, 3, 3)), np.empty(6))
    return ddq


@njit(nogil=True)
def _alloc_loop(n, parent, jtype, Et, rt, I, arm, g, Q, dQ, TAU, fext):
    m = Q.shape[0]
    s = 0.0
    for k in range(n):
        j = k % m
        s += alloc_aba(parent, jtype, Et, rt, I, arm, g, Q[j], dQ[j], TAU[j], fext)[0]
    return s


# a textbook ABA: 6x6 matrices and products (numpy @), allocated per call
@njit(nogil=True)
def _crm(v):
    out = np.zeros((6, 6))
    w = v[:3]
    vl = v[3:]
    wx = np.array([[0.0, -w[2], w[1]], [w[2], 0.0, -w[0]], [-w[1], w[0], 0.0]])
    vx = np.array([[0.0, -vl[2], vl[1]], [vl[2], 0.0, -vl[0]], [-vl[1], vl[0], 0.0]])
    out[:3, :3] = wx
    out[3:, 3:] = wx
    out[3:, :3] = vx
    return out


@njit(nogil=True)
def _xform(E, r):
    X = np.zeros((6, 6))
    rx = np.array([[0.0, -r[2], r[1]], [r[2], 0.0, -r[0]], [-r[1], r[0], 0.0]])
    X[:3, :3] = E
    X[3:, 3:] = E
    X[3:, :3] = -E @ rx
    return X


@njit(nogil=True)
def naive_aba(parent, Et, rt, I, g, q, dq, tau):
    nb = q.size
    Xs = np.zeros((nb, 6, 6))
    v = np.zeros((nb, 6))
    c = np.zeros((nb, 6))
    IA = np.zeros((nb, 6, 6))
    pA = np.zeros((nb, 6))
    U = np.zeros((nb, 6))
    D = np.zeros(nb)
    u = np.zeros(nb)
    a = np.zeros((nb, 6))
    ddq = np.zeros(nb)
    S = np.zeros(6)
    S[2] = 1.0
    for i in range(nb):
        cq, sq = np.cos(q[i]), np.sin(q[i])
        Rz = np.array([[cq, sq, 0.0], [-sq, cq, 0.0], [0.0, 0.0, 1.0]])
        Xs[i] = _xform(Rz @ Et[i], rt[i])
        vJ = S * dq[i]
        if parent[i] >= 0:
            v[i] = Xs[i] @ v[parent[i]] + vJ
        else:
            v[i] = vJ
        c[i] = _crm(v[i]) @ vJ
        IA[i] = I[i].copy()
        pA[i] = -_crm(v[i]).T @ (I[i] @ v[i])
    for i in range(nb - 1, -1, -1):
        U[i] = IA[i] @ S
        D[i] = S @ U[i]
        u[i] = tau[i] - S @ pA[i]
        if parent[i] >= 0:
            Ia = IA[i] - np.outer(U[i], U[i]) / D[i]
            pa = pA[i] + Ia @ c[i] + U[i] * u[i] / D[i]
            IA[parent[i]] += Xs[i].T @ Ia @ Xs[i]
            pA[parent[i]] += Xs[i].T @ pa
    a0 = np.zeros(6)
    a0[3:] = -g
    for i in range(nb):
        ap = a[parent[i]] if parent[i] >= 0 else a0
        a[i] = Xs[i] @ ap + c[i]
        ddq[i] = (u[i] - U[i] @ a[i]) / D[i]
        a[i] += S * ddq[i]
    return ddq


@njit(nogil=True)
def _naive_loop(n, parent, Et, rt, I, g, Q, dQ, TAU):
    m = Q.shape[0]
    s = 0.0
    for k in range(n):
        j = k % m
        s += naive_aba(parent, Et, rt, I, g, Q[j], dQ[j], TAU[j])[0]
    return s


def random_states(tree, n, seed):
    rng = np.random.default_rng(seed)
    q = rng.uniform(tree.q_lower, tree.q_upper, (n, tree.nb))
    dq = rng.uniform(-1.5, 1.5, (n, tree.nb)) * tree.velocity_limit
    tau = rng.uniform(-1.0, 1.0, (n, tree.nb)) * tree.effort_limit
    return q, dq, tau


def mujoco_reference(chain, Q, dQ, TAU, blocks, repeats):
    try:
        import mujoco
    except ImportError:
        return None, None
    root = ET.parse(PANDA_URDF).getroot()
    for link in root.findall("link"):
        for tag in ("visual", "collision"):
            for el in link.findall(tag):
                link.remove(el)
    for j in root.findall("joint"):
        if j.get("name") in PANDA_LOCK:
            j.set("type", "fixed")
            for tag in ("axis", "limit", "dynamics", "mimic"):
                for el in j.findall(tag):
                    j.remove(el)
    # keep the fixed links as they are (MuJoCo fuses them into their parent by default)
    model = mujoco.MjModel.from_xml_string(ET.tostring(root, encoding="unicode"))
    model.dof_damping[:] = 0.0
    model.dof_frictionloss[:] = 0.0
    model.dof_armature[:] = 0.0
    model.jnt_limited[:] = 0
    data = mujoco.MjData(model)
    err = 0.0
    ddq = np.zeros(7)
    for k in range(min(200, Q.shape[0])):
        data.qpos[:] = Q[k]
        data.qvel[:] = dQ[k]
        data.qfrc_applied[:] = TAU[k]
        mujoco.mj_forward(model, data)
        chain.aba(Q[k], dQ[k], TAU[k], ddq)
        err = max(err, float(np.abs(data.qacc - ddq).max()))
    model.opt.timestep = 1e-3

    def run(n):
        mujoco.mj_resetData(model, data)
        data.qpos[:] = Q[0]
        for _ in range(n):
            mujoco.mj_step(model, data)

    t = fair.interleaved({"mj_step": lambda: run(200)}, {"mj_step": 200}, blocks, repeats)
    return t["mj_step"], err


def pinocchio_model():
    import pinocchio as pin

    full = pin.buildModelFromUrdf(str(PANDA_URDF))
    q_lock = pin.neutral(full)
    for n, val in PANDA_LOCK.items():
        q_lock[full.joints[full.getJointId(n)].idx_q] = val
    return pin, pin.buildReducedModel(full, [full.getJointId(n) for n in PANDA_LOCK], q_lock)


def _check(name: str, diff: float) -> float:
    if not diff < AGREE:  # NaN fails too
        raise AssertionError(f"{name}: hil and Pinocchio disagree (max |ddq difference| {diff:.3e} >= {AGREE:g} "
                             "rad/s^2); no timing is reported for different answers")
    return diff


def compare_aba(chain, blocks: int, repeats: int, n_batch: int, calls: int = 256) -> dict:
    """hil's ABA against Pinocchio's, same states, same call paths; answers checked first."""
    pin, pmodel = pinocchio_model()
    pdata = pmodel.createData()
    tree = chain.tree
    Q, dQ, TAU = random_states(tree, 1000, seed=0)
    ddq = np.zeros(chain.nb)
    ddq_buf = np.zeros(chain.nb)
    aba_buf, buf = dyn.aba_buf, chain.buf  # the call from Python: aba_buf(buf, q, dq, tau, ddq)
    d_one = 0.0
    for k in range(1000):
        ref = pin.aba(pmodel, pdata, Q[k], dQ[k], TAU[k])
        aba_buf(buf, Q[k], dQ[k], TAU[k], ddq_buf)
        d_one = max(d_one, float(np.abs(ref - chain.aba(Q[k], dQ[k], TAU[k], ddq)).max()),
                    float(np.abs(ref - ddq_buf).max()))
    _check("one call per state, 1000 states (Chain.aba and aba_buf)", d_one)

    # --- called from Python, one state per call, the same 64 states, the same slicing
    Qs, dQs, TAUs = Q[:64].copy(), dQ[:64].copy(), TAU[:64].copy()
    aba = chain.aba
    pin_aba = pin.aba

    def hil_python():
        for k in range(calls):
            j = k & 63
            aba_buf(buf, Qs[j], dQs[j], TAUs[j], ddq)

    def hil_chain_method():
        for k in range(calls):
            j = k & 63
            aba(Qs[j], dQs[j], TAUs[j], ddq)

    def pin_python():
        for k in range(calls):
            j = k & 63
            pin_aba(pmodel, pdata, Qs[j], dQs[j], TAUs[j])

    py = fair.interleaved({"hil": hil_python, "pin": pin_python, "hil_chain_method": hil_chain_method},
                          {"hil": calls, "pin": calls, "hil_chain_method": calls}, blocks, repeats)
    last = pin_aba(pmodel, pdata, Qs[(calls - 1) & 63], dQs[(calls - 1) & 63], TAUs[(calls - 1) & 63])
    _check("one call per state, the last state written while timing", float(np.abs(ddq - last).max()))

    # --- N states in one call
    Qb, dQb, TAUb = random_states(tree, n_batch, seed=1)
    DDQ_hil = np.full((n_batch, chain.nb), np.nan)
    DDQ_pin = np.full((n_batch, chain.nb), np.nan)
    pool = pin.ModelPool(pmodel, 1)
    Qf, dQf, TAUf = (np.asfortranarray(a.T) for a in (Qb, dQb, TAUb))  # Pinocchio's batch layout: a column per state
    A_par = np.full((chain.nb, n_batch), np.nan, order="F")
    w = chain.ws
    loop_args = (chain.parent, chain.jtype, chain.E_tree, chain.r_tree, chain.inertia, chain.armature,
                 chain.gravity, Qb, dQb, TAUb, chain.f_ext, ddq, w.E, w.r, w.v, w.c, w.pA, w.IA,
                 w.U, w.D, w.u, w.acc, chain.T, chain.tmp)

    def hil_batch():
        chain.aba_batch(Qb, dQb, TAUb, DDQ_hil)

    def pin_loop():
        for k in range(n_batch):
            DDQ_pin[k] = pin_aba(pmodel, pdata, Qb[k], dQb[k], TAUb[k])

    def pin_parallel():
        pin.abaInParallel(1, pool, Qf, dQf, TAUf, A_par)

    def hil_numba_loop():
        _aba_loop(n_batch, *loop_args)

    def batch_diffs():
        return (float(np.abs(DDQ_hil - DDQ_pin).max()), float(np.abs(DDQ_hil - A_par.T).max()))

    hil_batch(), pin_loop(), pin_parallel()
    d_b, d_par = batch_diffs()
    _check(f"batch of {n_batch}, pin.aba loop", d_b)
    _check(f"batch of {n_batch}, pin.abaInParallel", d_par)
    sides = {"hil_aba_batch": hil_batch, "pin_python_loop": pin_loop, "pin_aba_in_parallel_1thread": pin_parallel,
             "hil_numba_loop": hil_numba_loop}
    DDQ_hil[:] = np.nan
    DDQ_pin[:] = np.nan
    A_par[:] = np.nan
    bt = fair.interleaved(sides, dict.fromkeys(sides, n_batch), blocks, repeats)
    d_b, d_par = batch_diffs()  # the arrays the timed calls wrote
    _check("batch after timing, pin.aba loop", d_b)
    _check("batch after timing, pin.abaInParallel", d_par)
    return {"python_call_us": py, "batch_us_per_state": bt, "batch_states": n_batch, "calls_per_block": calls,
            "max_abs_diff_qdd": {"vs_pin_python": d_one, "batch_vs_pin": d_b, "batch_vs_pin_parallel": d_par}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="few blocks (a smoke run: figures indicative only)")
    ap.add_argument("--batch", type=int, default=256, help="states per batched call")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    blocks = 4 if args.quick else 41
    repeats = 3 if args.quick else args.repeats

    tree = load_panda()
    chain = Chain(tree)
    r = compare_aba(chain, blocks, repeats, args.batch)
    py, bt = r["python_call_us"], r["batch_us_per_state"]
    ratios = {
        "python_call_pin_over_hil": fair.ratio(py["pin"], py["hil"]),
        "python_call_pin_over_hil_chain_method": fair.ratio(py["pin"], py["hil_chain_method"]),
        "batch_pin_python_loop_over_hil_batch": fair.ratio(bt["pin_python_loop"], bt["hil_aba_batch"]),
        "batch_pin_parallel_1thread_over_hil_batch": fair.ratio(bt["pin_aba_in_parallel_1thread"], bt["hil_aba_batch"]),
        "pin_parallel_1thread_over_hil_numba_loop": fair.ratio(bt["pin_aba_in_parallel_1thread"], bt["hil_numba_loop"]),
    }
    kernel_us = bt["hil_numba_loop"]["median"]
    log(f"answers agree: max |ddq hil - pin| {r['max_abs_diff_qdd']}")
    log(f"from Python, per call: hil aba_buf {py['hil']['median']:.3f} us, pin.aba {py['pin']['median']:.3f} us "
        f"-> pin/hil {ratios['python_call_pin_over_hil']:.2f}; through Chain.aba {py['hil_chain_method']['median']:.3f} us "
        f"-> pin/hil {ratios['python_call_pin_over_hil_chain_method']:.2f}")
    for k, v in bt.items():
        log(f"batch of {args.batch}, per state: {k} {v['median']:.3f} us (min {v['min']:.3f}, max {v['max']:.3f} over repeats)")
    log(f"in-kernel hil {kernel_us:.3f} us vs Pinocchio C++ {PINOCCHIO_CPP_ABA_US} us (documented constant, "
        f"not measured here) -> {PINOCCHIO_CPP_ABA_US / kernel_us:.2f}")

    # textbook ABA and hil's ABA allocating per call (no peer: references for the kernel's design)
    Qs, dQs, TAUs = random_states(tree, 64, seed=0)
    ddq = np.zeros(7)
    naive_err = 0.0
    for k in range(64):
        nd = naive_aba(chain.parent, chain.E_tree, chain.r_tree, chain.inertia, chain.gravity, Qs[k], dQs[k], TAUs[k])
        naive_err = max(naive_err, float(np.abs(nd - chain.aba(Qs[k], dQs[k], TAUs[k], ddq)).max()))
    alloc_args = (chain.parent, chain.jtype, chain.E_tree, chain.r_tree, chain.inertia, chain.armature,
                  chain.gravity, Qs, dQs, TAUs, chain.f_ext)
    refs = fair.interleaved(
        {"textbook_6x6_numba_aba_us": lambda: _naive_loop(64, chain.parent, chain.E_tree, chain.r_tree, chain.inertia,
                                                           chain.gravity, Qs, dQs, TAUs),
         "hil_aba_alloc_per_call_us": lambda: _alloc_loop(256, *alloc_args)},
        {"textbook_6x6_numba_aba_us": 64, "hil_aba_alloc_per_call_us": 256}, blocks, repeats)

    # full plant step: position mode, object held in contact
    arm = ArmModel.panda()
    arm.us("control_mode")[:] = MODE_POSITION
    arm.xs("tau_motor")[:] = chain.gravity_torque(arm.xs("q"), np.zeros(7))
    arm.xs("object_held")[:] = 1.0
    arm.xs("gripper_width")[:] = 0.049
    arm.us("gripper_width_command")[:] = 0.0
    arm.us("gripper_force_command")[:] = 20.0
    arm.us("q_command")[:] = arm.xs("q") + 0.1
    x0 = arm.x.copy()
    _step_loop(5, arm.x, arm.u, arm.p, 1e-3, DEFAULT_SUBSTEPS, arm.mf, arm.mi, arm.wf)
    arm.x[:] = x0

    def py_steps():
        for _ in range(100):
            step(0.0, arm.x, arm.u, arm.p, 1e-3, DEFAULT_SUBSTEPS, arm.mf, arm.mi, arm.wf)

    st = fair.interleaved(
        {"numba": lambda: _step_loop(100, arm.x, arm.u, arm.p, 1e-3, DEFAULT_SUBSTEPS, arm.mf, arm.mi, arm.wf),
         "python": py_steps}, {"numba": 100, "python": 100}, blocks, repeats)
    arm.compute_outputs()
    step_us = st["numba"]["median"]
    log(f"plant step (1 ms, {DEFAULT_SUBSTEPS} sub-steps, contact): {step_us:.2f} us in Numba, "
        f"{st['python']['median']:.2f} us from Python; contact force {arm.ys('contact_force')[0]:.2f} N, "
        f"held {arm.ys('object_held')[0]:.0f}")

    Qm, dQm, TAUm = random_states(tree, 200, seed=2)
    mj, mj_err = mujoco_reference(chain, Qm, dQm, TAUm, blocks, repeats)
    log("mujoco not installed: reference skipped" if mj is None else
        f"mujoco mj_step from Python: {mj['median']:.3f} us; mj_forward qacc vs hil: {mj_err:.2e}")

    max_diff = max(r["max_abs_diff_qdd"].values())
    goals_met = {
        "python_call_ratio_pin_over_hil": ratios["python_call_pin_over_hil"] >= GOALS["python_call_ratio_pin_over_hil"],
        "kernel_aba_us": kernel_us <= GOALS["kernel_aba_us"],
        "step_us": step_us <= GOALS["step_us"],
        "max_abs_diff_qdd": max_diff < GOALS["max_abs_diff_qdd"],
    }
    assert set(goals_met) == set(GOALS)
    n = args.batch
    headline = [
        dict(figure="ABA called from Python, per call", hil=py["hil"]["median"], peer=py["pin"]["median"],
             peer_name="pin.aba from Python", ratio=ratios["python_call_pin_over_hil"], unit="us",
             goal="ratio >= 1", met=goals_met["python_call_ratio_pin_over_hil"]),
        dict(figure=f"ABA over {n} states in one call, per state", hil=bt["hil_aba_batch"]["median"],
             peer=bt["pin_python_loop"]["median"], peer_name="pin.aba in a Python loop",
             ratio=ratios["batch_pin_python_loop_over_hil_batch"], unit="us"),
        dict(figure=f"ABA over {n} states in one call, per state", hil=bt["hil_aba_batch"]["median"],
             peer=bt["pin_aba_in_parallel_1thread"]["median"], peer_name="pin.abaInParallel, 1 thread (C++ loop)",
             ratio=ratios["batch_pin_parallel_1thread_over_hil_batch"], unit="us"),
        dict(figure="ABA in-kernel (Numba loop), per call", hil=kernel_us, peer=PINOCCHIO_CPP_ABA_US,
             peer_name="Pinocchio C++, documented constant (issue 11), NOT measured here",
             ratio=PINOCCHIO_CPP_ABA_US / kernel_us, unit="us", goal=GOALS["kernel_aba_us"],
             met=goals_met["kernel_aba_us"]),
        dict(figure="1 ms plant step, 4 sub-steps, contact (Numba loop)", hil=step_us, unit="us",
             goal=GOALS["step_us"], met=goals_met["step_us"]),
        dict(figure="max |qdd hil - Pinocchio| (rad/s^2)", hil=max_diff, goal=AGREE, met=goals_met["max_abs_diff_qdd"]),
    ]
    for row in headline:
        if "ratio" in row:
            log(f"{row['figure']}: {row['peer_name']} / hil = {row['ratio']:.2f}" + ("  (a loss)" if row["ratio"] < 1 else ""))
    result = dict(
        python_call_us=py,
        batch_us_per_state=bt,
        batch_states=n,
        ratios=ratios,
        max_abs_diff_qdd=r["max_abs_diff_qdd"],
        kernel_vs_pinocchio_cpp=dict(hil_us=kernel_us, pinocchio_cpp_us=PINOCCHIO_CPP_ABA_US,
                                     pinocchio_cpp_measured_here=False,
                                     pinocchio_cpp_source="issue 11 (Performance), a C++ timing outside this repository",
                                     ratio_pinocchio_over_hil=PINOCCHIO_CPP_ABA_US / kernel_us),
        step_us=step_us,
        step_python_call_us=st["python"]["median"],
        step_spread_us=st,
        substeps=DEFAULT_SUBSTEPS,
        references=dict(
            hil_aba_alloc_per_call_us=refs["hil_aba_alloc_per_call_us"],
            textbook_6x6_numba_aba_us=refs["textbook_6x6_numba_aba_us"],
            textbook_max_abs_diff_qdd=naive_err,
            mujoco_mj_step_us=mj,
            mujoco_note="mj_step integrates a step (different work): no ratio",
            mujoco_mj_forward_max_abs_diff_qdd=mj_err,
        ),
        timing=dict(clock="thread CPU time", blocks=blocks, repeats=repeats, interleaved=True, rotated=True),
        goals=GOALS,
        goals_met=goals_met,
        goal_met=all(goals_met.values()),
        headline=headline,
        quick=bool(args.quick),
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
