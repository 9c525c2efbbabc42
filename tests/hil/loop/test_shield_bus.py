"""The loop's shield endpoint (hil/loop/shield_bus.py), fed over its real sockets by senders
holding the run's keys (the policy's proposal channel, the safety's supervisor channel) and by
ones that do not: what it writes into the loop's commands for the bus inputs.

The panda policy scenario with [safety] placement = "loop" and [policy] rate_hz = 250 (a
proposal every 4 steps of 1 ms, age bound 8 steps); fallback: joint PD hold, gripper held.
"""

import tempfile
import time

import numpy as np
import pytest
import zmq

from hil.bus.wire import Sender
from hil.scenario.config import load_scenario
from hil.loop.shield_bus import FALLBACK_SILENT, SOURCE_NAMES, ShieldBusEndpoint
from hil.loop.shield import FALLBACK_LATE, FALLBACK_MODE, POLICY, PROJECTED
from tests.hil.safety.helpers import ROOT, remove_ipc_dirs, IPC_DIRS

GRIP = "gripper.width_target"


@pytest.fixture()
def ep():
    d = tempfile.mkdtemp(prefix="hs", dir="/tmp")
    IPC_DIRS.append(d)
    sc = load_scenario(ROOT / "configs" / "panda_policy.toml",
                       {"safety": {"placement": "loop"}, "policy": {"rate_hz": 250.0}, "bus": {"ipc_dir": d}})
    spec = sc.plant.load().spec
    ep = ShieldBusEndpoint.build(sc.bus, sc, spec)
    y, u = spec.nominal("outputs"), spec.nominal("inputs")
    ep.attach(y, u)
    ctx = zmq.Context()
    prop = ctx.socket(zmq.PUSH)
    prop.connect(sc.bus.endpoint("proposal_loop", sc.name))
    sup = ctx.socket(zmq.PUSH)
    sup.connect(sc.bus.endpoint("supervisor", sc.name))
    ns = type("NS", (), {})()
    ns.ep, ns.sc, ns.spec, ns.y, ns.u, ns.prop, ns.sup = ep, sc, spec, y, u, prop, sup
    ns.policy = Sender("proposal", ep.key)
    ns.safety = Sender("supervisor", ep.key)
    ns.n = len(ep.action_names)
    ns.grip = ep.action_names.index(GRIP)
    ns.u_cmd = u.copy()
    ns.sent = set()  # channels sent on since the last _step
    yield ns
    for s in (prop, sup):
        s.close(0)
    ctx.term()
    ep.close()
    remove_ipc_dirs()


def _publish(ns, step):
    """As the loop does after step `step`: the observation is out (proposals may answer it)."""
    ns.ep._published_step = step


def _decide(ns, step, allow=True, lo=None, hi=None, mode="full", sender=None):
    lo = np.full(ns.n, -np.inf) if lo is None else lo
    hi = np.full(ns.n, np.inf) if hi is None else hi
    ns.sup.send((sender or ns.safety).encode_supervisor(step, step * 1e-3, allow, lo, hi, mode, "test"))
    ns.sent.add("sup")


def _propose(ns, step, a):
    ns.prop.send(ns.policy.encode_proposal(step, step * 1e-3, a, None, "v1", 10.0))
    ns.sent.add("prop")


def _step(ns, k):
    """before_step(k) once the messages sent so far have arrived: the endpoint's socket of each
    channel sent on since the last step is readable (bounded wait: a loaded machine can hold the
    zmq I/O thread off for tens of ms), then 5 ms for the rest of a burst (ipc)."""
    for which in ns.sent:
        sock = ns.ep._sup_sock if which == "sup" else ns.ep._prop_sock
        sock.poll(10_000, zmq.POLLIN)
    ns.sent.clear()
    time.sleep(0.005)
    ns.ep.before_step(k, k * 1e-3, ns.u_cmd, False)
    app = ns.u_cmd[ns.ep._apply_index].copy()
    ns.u[ns.ep._apply_index] = app  # the loop applied it
    return ns.ep.last_code, app


def _a(ns, grip=0.05):
    a = np.zeros(ns.n)
    a[ns.grip] = grip
    return a


def test_before_any_supervisor_decision_the_fallback_acts_then_the_policy(ep):
    _publish(ep, 0)
    _propose(ep, 0, _a(ep))
    before = ep.u[ep.ep.shield.act_u[ep.grip]]
    code, app = _step(ep, 1)
    assert code == FALLBACK_SILENT and app[ep.grip] == before  # the gripper held where it was
    _decide(ep, 0)
    code, app = _step(ep, 2)  # while silent, the supervisor's socket is looked at every step
    assert code in (POLICY, PROJECTED), SOURCE_NAMES[code]
    assert app[ep.grip] == pytest.approx(0.05)  # the proposal, inside every limit


def test_a_proposal_older_than_its_age_bound_is_not_applied(ep):
    assert ep.ep.max_age_steps == 8  # two proposal periods of 4 ms at 1 kHz
    _publish(ep, 0)
    _decide(ep, 0)
    _propose(ep, 0, _a(ep, 0.05))
    codes = {}
    for k in range(1, 13):
        _publish(ep, k - 1)
        if k % 4 == 0:
            _decide(ep, k - 1)  # the supervisor keeps speaking; the policy does not
        codes[k], app = _step(ep, k)
        if codes[k] == FALLBACK_LATE:
            assert app[ep.grip] == pytest.approx(ep.u[ep.ep.shield.act_u[ep.grip]])  # held: the fallback law
    # the proposal answers observation 0: applied through step 9 (age 8), late from step 10 on
    assert all(codes[k] in (POLICY, PROJECTED) for k in range(1, 10)), codes
    assert all(codes[k] == FALLBACK_LATE for k in range(10, 13)), codes
    c = ep.ep.counters()
    assert c["shield_fallback_late_steps"] == 3 and c["watchdog_trips"] == 0 and c["shield_fallback_supervisor_silent_steps"] == 0


def test_supervisor_silence_beyond_its_bound_puts_the_fallback_on_until_it_speaks(ep):
    silence = ep.ep.silence_steps  # [safety] supervisor_silence_s = 0.1 s: 100 steps
    _publish(ep, 0)
    _decide(ep, 0)
    _propose(ep, 0, _a(ep))
    codes = []
    for k in range(1, silence + 12):
        _publish(ep, k - 1)
        if k % 4 == 0:
            _propose(ep, k - 1, _a(ep))  # the policy goes on; the supervisor is silent
        codes.append(_step(ep, k)[0])
    first_silent = codes.index(FALLBACK_SILENT) + 1  # the step (codes[0] is step 1's)
    assert first_silent == 1 + silence + 1, first_silent  # the decision arrived at step 1
    assert set(codes[first_silent - 1:]) == {FALLBACK_SILENT}
    assert ep.ep.silent and ep.ep.counters()["supervisor_silences"] == 1
    k = silence + 12
    while k % 4:
        k += 1
    _publish(ep, k - 1)
    _decide(ep, k - 1)
    _propose(ep, k - 1, _a(ep))
    assert _step(ep, k)[0] in (POLICY, PROJECTED) and not ep.ep.silent


def test_a_signed_envelope_change_narrows_what_the_policy_may_apply(ep):
    _publish(ep, 0)
    _decide(ep, 0)
    _propose(ep, 0, _a(ep, 0.06))
    for k in range(1, 4):
        _step(ep, k)
    lo, hi = np.full(ep.n, -np.inf), np.full(ep.n, np.inf)
    lo[ep.grip], hi[ep.grip] = 0.065, 0.07  # the limited mode's band for the gripper
    _publish(ep, 3)
    _decide(ep, 3, lo=lo, hi=hi, mode="limited")
    _propose(ep, 3, _a(ep, 0.06))
    code, app = _step(ep, 4)
    assert code == PROJECTED and ep.ep.mode == "limited"
    assert 0.065 - 1e-12 <= app[ep.grip] <= 0.07 + 1e-12
    _decide(ep, 3, allow=False, mode="shadow")  # the supervisor takes the policy off
    code, app = _step(ep, 8)
    assert code == FALLBACK_MODE


def test_forged_and_replayed_supervisor_decisions_change_nothing(ep):
    _publish(ep, 0)
    _decide(ep, 0, allow=False, mode="shadow")
    _propose(ep, 0, _a(ep))
    assert _step(ep, 4)[0] == FALLBACK_MODE
    # the policy holds the proposal channel's key only: a decision signed with it, or with a
    # secret of its own, is dropped before it is parsed
    forger = Sender("supervisor", {"supervisor": b"\x01" * 32})
    for sender in (forger, Sender("proposal", ep.ep.key)):
        raw = sender.encode_supervisor(0, 0.0, True, np.full(ep.n, -np.inf), np.full(ep.n, np.inf), "full", "forged")
        ep.sup.send(raw)
        ep.sent.add("sup")
    genuine = ep.safety.encode_supervisor(0, 0.0, True, np.full(ep.n, -np.inf), np.full(ep.n, np.inf), "full", "ok")
    ep.sup.send(genuine)
    ep.sent.add("sup")
    assert _step(ep, 8)[0] in (POLICY, PROJECTED)  # the genuine one acts
    _decide(ep, 0, allow=False, mode="shadow")
    assert _step(ep, 12)[0] == FALLBACK_MODE
    ep.sup.send(genuine)  # replayed: older than the last accepted
    ep.sent.add("sup")
    assert _step(ep, 16)[0] == FALLBACK_MODE
    c = ep.ep.counters()
    assert c["supervisor_dropped_auth"] == 2 and c["supervisor_dropped_replay"] == 1, c


def _late_spell(ns, send_stamped_early: bool):
    """Proposal 0 applied through step 9; the policy's proposal answering observation 3 reaches
    the loop only after steps 10 and 11 fell back (late). It was stamped (encoded: wall_ns)
    before those steps looked at the socket (`send_stamped_early`: held in transit) or after
    them (the policy sent it late). Step 12 applies it (3 >= 11 - 8)."""
    _publish(ns, 0)
    _decide(ns, 0)
    _propose(ns, 0, _a(ns, 0.05))
    held = None
    codes = {}
    for k in range(1, 12):
        _publish(ns, k - 1)
        if k == 4:
            _decide(ns, 3)
            if send_stamped_early:
                held = ns.policy.encode_proposal(3, 3e-3, _a(ns, 0.06), None, "v1", 10.0)
        codes[k], _ = _step(ns, k)
    assert codes[10] == codes[11] == FALLBACK_LATE, codes
    ns.prop.send(held if send_stamped_early else ns.policy.encode_proposal(3, 3e-3, _a(ns, 0.06), None, "v1", 10.0))
    ns.sent.add("prop")
    _publish(ns, 11)
    code, app = _step(ns, 12)
    assert code in (POLICY, PROJECTED) and app[ns.grip] == pytest.approx(0.06)
    return ns.ep.counters()


def test_late_steps_a_proposal_sent_in_time_would_have_served_count_as_transport(ep):
    c = _late_spell(ep, send_stamped_early=True)
    assert c["shield_fallback_late_steps"] == 2
    assert c["shield_late_transport_steps"] == 2 and c["shield_late_policy_steps"] == 0
    assert c["proposal_transit_us_max"] >= 5000  # held over the two late steps (>= 5 ms of sleeps each)


def test_late_steps_of_a_policy_that_sent_late_count_as_the_policy(ep):
    c = _late_spell(ep, send_stamped_early=False)
    assert c["shield_fallback_late_steps"] == 2
    assert c["shield_late_policy_steps"] == 2 and c["shield_late_transport_steps"] == 0


def test_a_late_spell_no_proposal_ends_is_the_policy_s(ep):
    _publish(ep, 0)
    _decide(ep, 0)
    _propose(ep, 0, _a(ep))
    for k in range(1, 13):
        _publish(ep, k - 1)
        if k % 4 == 0:
            _decide(ep, k - 1)
        _step(ep, k)
    c = ep.ep.counters()
    assert c["shield_fallback_late_steps"] == 3 and c["shield_late_policy_steps"] == 3
    assert c["shield_late_transport_steps"] == 0


def test_silent_steps_a_decision_sent_in_time_would_have_ended_count_as_transport(ep):
    silence = ep.ep.silence_steps
    _publish(ep, 0)
    _decide(ep, 0)
    _propose(ep, 0, _a(ep))
    held = None
    codes = []
    for k in range(1, silence + 5):
        _publish(ep, k - 1)
        if k % 4 == 0:
            _propose(ep, k - 1, _a(ep))
        if k == silence:  # stamped before the silence begins (step silence + 2), delivered after
            held = ep.safety.encode_supervisor(k - 1, (k - 1) * 1e-3, True, np.full(ep.n, -np.inf),
                                               np.full(ep.n, np.inf), "full", "test")
        codes.append(_step(ep, k)[0])
    silent = codes.count(FALLBACK_SILENT)
    assert silent >= 2, codes[-6:]
    ep.sup.send(held)
    ep.sent.add("sup")
    k = silence + 5
    _publish(ep, k - 1)
    assert _step(ep, k)[0] in (POLICY, PROJECTED)
    c = ep.ep.counters()
    assert c["shield_silent_transport_steps"] == silent and c["shield_silent_supervisor_steps"] == 0
    assert c["shield_fallback_supervisor_silent_steps"] == silent


def test_fifo_io_threads_raises_exactly_this_process_s_zmq_io_threads():
    import os

    from hil.loop.shield_bus import fifo_io_threads

    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)  # the context's I/O thread starts with the first socket ...
    try:
        io = []
        deadline = time.monotonic() + 10.0
        while not io and time.monotonic() < deadline:  # ... and names itself once it runs
            io = [int(t) for t in os.listdir("/proc/self/task")
                  if open(f"/proc/self/task/{t}/comm").read().startswith("ZMQbg/IO")]
            time.sleep(0.01)
        assert io
        raised, warning = fifo_io_threads(1)
        if warning is not None:  # no CAP_SYS_NICE / rtprio here: refused and said so, nothing raised
            assert "SCHED_FIFO 1" in warning and raised == 0
        else:
            assert raised == len(io)
            assert all(os.sched_getscheduler(t) == os.SCHED_FIFO for t in io)
            assert os.sched_getscheduler(0) != os.SCHED_FIFO  # the calling (test) thread untouched
            for t in io:
                os.sched_setscheduler(t, os.SCHED_OTHER, os.sched_param(0))
    finally:
        sock.close(0)
        ctx.term()
