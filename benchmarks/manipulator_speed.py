"""Speed and accuracy of the manipulator kernels (Franka Panda, 7 joints) with references.

Human-readable lines go to stderr; the last line of stdout is one JSON object:

    aba_us               hil's ABA, median per call, timed inside a Numba loop over 64 states
    max_abs_err_vs_pin   max |ddq - pin.aba| (rad/s^2) over 1000 random (q, dq, tau)
    step_us              one full 1 ms plant step (4 sub-steps of 0.25 ms: drives, current
                         loop, friction, stops, ABA, gripper and a held object in contact),
                         median, timed inside a Numba loop
    step_python_call_us  the same step called from Python once per period (what the loop pays)
    references:
      pin_aba_python_us     pin.aba through Pinocchio's Python bindings, per call
      naive_numba_aba_us    hil's ABA allocating its work arrays per call (np.empty x 13)
      textbook_numba_aba_us a textbook Numba ABA on 6x6 matrices and numpy products,
                            allocating per call; textbook_max_abs_err: its max |ddq - hil|
      mujoco_mj_step_us     mujoco.mj_step on the same URDF (visuals stripped, fingers fixed,
                            URDF damping/friction zeroed, joint limits off), per call from
                            Python, 1 ms timestep, no contacts (null if mujoco is not installed)
      mujoco_mj_forward_max_abs_err  max |qacc - hil ddq| over 200 states (same model)
    min_us: the fastest sample of each timing (the machine's unloaded speed, roughly)
    goals: the issue's goals, for comparison

Timing is per call on this (shared, loaded) machine: medians of repeated samples.
Usage: python benchmarks/manipulator_speed.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from numba import njit  # noqa: E402

from plants.manipulator import dynamics as dyn  # noqa: E402
from plants.manipulator.arm import DEFAULT_SUBSTEPS, ArmModel, step  # noqa: E402
from plants.manipulator.chain import PANDA_LOCK, PANDA_URDF, Chain, load_panda  # noqa: E402
from plants.manipulator.layout import MODE_POSITION  # noqa: E402

GOALS = dict(aba_us=2.8, aba_us_stretch=2.3, step_us=50.0, max_abs_err_vs_pin=1e-9)


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


MINS: dict[str, float] = {}


def median_us(fn, n: int, samples: int, name: str = "") -> float:
    """Median over `samples` short samples of the mean per-call time of n calls (us).

    Short samples (a few ms) on a shared machine: a preempted sample is an outlier the
    median ignores; the fastest sample is kept in MINS[name] for the JSON's `min_us`."""
    out = []
    for _ in range(samples):
        t0 = time.perf_counter()
        fn(n)
        out.append((time.perf_counter() - t0) / n * 1e6)
    if name:
        MINS[name] = round(min(out), 3)
    return statistics.median(out)


def random_states(tree, n, seed):
    rng = np.random.default_rng(seed)
    q = rng.uniform(tree.q_lower, tree.q_upper, (n, tree.nb))
    dq = rng.uniform(-1.5, 1.5, (n, tree.nb)) * tree.velocity_limit
    tau = rng.uniform(-1.0, 1.0, (n, tree.nb)) * tree.effort_limit
    return q, dq, tau


def mujoco_reference(chain, Q, dQ, TAU, samples):
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
        t0 = time.perf_counter()
        for _ in range(n):
            mujoco.mj_step(model, data)
        return time.perf_counter() - t0

    run(10)
    times = [run(1000) / 1000 * 1e6 for _ in range(samples)]
    MINS["mujoco_mj_step_us"] = round(min(times), 3)
    return statistics.median(times), err


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer samples (smoke run)")
    args = ap.parse_args()
    samples = 11 if args.quick else 101
    n_calls = 1000

    tree = load_panda()
    chain = Chain(tree)
    w = chain.ws

    # accuracy vs Pinocchio
    import pinocchio as pin

    full = pin.buildModelFromUrdf(str(PANDA_URDF))
    pmodel = pin.buildReducedModel(full, [full.getJointId(n) for n in PANDA_LOCK], pin.neutral(full))
    pdata = pmodel.createData()
    Q, dQ, TAU = random_states(tree, 1000, seed=0)
    ddq = np.zeros(7)
    err = 0.0
    for k in range(1000):
        ref = pin.aba(pmodel, pdata, Q[k], dQ[k], TAU[k])
        chain.aba(Q[k], dQ[k], TAU[k], ddq)
        err = max(err, float(np.abs(ref - ddq).max()))
    log(f"max |ddq - pin.aba| over 1000 states: {err:.2e} rad/s^2")

    Qs, dQs, TAUs = Q[:64].copy(), dQ[:64].copy(), TAU[:64].copy()
    aba_args = (chain.parent, chain.jtype, chain.E_tree, chain.r_tree, chain.inertia, chain.armature,
                chain.gravity, Qs, dQs, TAUs, chain.f_ext, np.zeros(7), w.E, w.r, w.v, w.c, w.pA, w.IA,
                w.U, w.D, w.u, w.acc, chain.T, chain.tmp)
    _aba_loop(10, *aba_args)
    aba_us = median_us(lambda n: _aba_loop(n, *aba_args), n_calls, samples, "aba_us")
    log(f"hil ABA (Numba loop): {aba_us:.3f} us")

    # naive ABA
    _naive_loop(2, chain.parent, chain.E_tree, chain.r_tree, chain.inertia, chain.gravity, Qs, dQs, TAUs)
    naive_err = 0.0
    for k in range(64):
        nd = naive_aba(chain.parent, chain.E_tree, chain.r_tree, chain.inertia, chain.gravity, Qs[k], dQs[k], TAUs[k])
        chain.aba(Qs[k], dQs[k], TAUs[k], ddq)
        naive_err = max(naive_err, float(np.abs(nd - ddq).max()))
    naive_us = median_us(lambda n: _naive_loop(n, chain.parent, chain.E_tree, chain.r_tree, chain.inertia,
                                               chain.gravity, Qs, dQs, TAUs), n_calls // 10, samples, "textbook_numba_aba_us")
    log(f"textbook Numba ABA (6x6 products, allocating): {naive_us:.3f} us (max diff {naive_err:.1e})")
    alloc_args = (chain.parent, chain.jtype, chain.E_tree, chain.r_tree, chain.inertia, chain.armature,
                  chain.gravity, Qs, dQs, TAUs, chain.f_ext)
    _alloc_loop(2, *alloc_args)
    alloc_us = median_us(lambda n: _alloc_loop(n, *alloc_args), n_calls, samples, "naive_numba_aba_us")
    log(f"naive Numba ABA (hil's, work arrays allocated per call): {alloc_us:.3f} us")

    # pin.aba from Python
    def pin_run(n):
        for k in range(n):
            j = k & 63
            pin.aba(pmodel, pdata, Qs[j], dQs[j], TAUs[j])

    pin_run(10)
    pin_us = median_us(pin_run, n_calls, samples, "pin_aba_python_us")
    log(f"pin.aba from Python: {pin_us:.3f} us")

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
    step_us = median_us(lambda n: _step_loop(n, arm.x, arm.u, arm.p, 1e-3, DEFAULT_SUBSTEPS, arm.mf,
                                               arm.mi, arm.wf), n_calls // 10, samples, "step_us")

    def py_steps(n):
        for _ in range(n):
            step(0.0, arm.x, arm.u, arm.p, 1e-3, DEFAULT_SUBSTEPS, arm.mf, arm.mi, arm.wf)

    step_py_us = median_us(py_steps, n_calls // 10, samples, "step_python_call_us")
    arm.compute_outputs()
    log(f"plant step (1 ms, {DEFAULT_SUBSTEPS} sub-steps, contact): {step_us:.2f} us in Numba, "
        f"{step_py_us:.2f} us from Python; contact force {arm.ys('contact_force')[0]:.2f} N, "
        f"held {arm.ys('object_held')[0]:.0f}")

    mj_us, mj_err = mujoco_reference(chain, Q, dQ, TAU, samples)
    if mj_us is not None:
        log(f"mujoco mj_step from Python: {mj_us:.3f} us; mj_forward qacc vs hil: {mj_err:.2e}")
    else:
        log("mujoco not installed: reference skipped")

    result = dict(
        aba_us=round(aba_us, 3),
        max_abs_err_vs_pin=err,
        step_us=round(step_us, 2),
        step_python_call_us=round(step_py_us, 2),
        substeps=DEFAULT_SUBSTEPS,
        references=dict(
            pin_aba_python_us=round(pin_us, 3),
            naive_numba_aba_us=round(alloc_us, 3),
            textbook_numba_aba_us=round(naive_us, 3),
            textbook_max_abs_err=naive_err,
            mujoco_mj_step_us=None if mj_us is None else round(mj_us, 3),
            mujoco_mj_forward_max_abs_err=mj_err,
        ),
        min_us=MINS,
        goals=GOALS,
        quick=bool(args.quick),
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
