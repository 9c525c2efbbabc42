"""hil/campaign/reset.py: which reset frames a warm child obeys (signed with its role's key, a
run number above the last, a nonce never seen), over a real socket pair, with the run's
stderr descriptor a reset brings; and which runs a kept pair
may serve (hil/campaign/warm_procs.py spawn_facts)."""

import os
import socket

import pytest

from hil.campaign import reset as rp
from hil.campaign.warm_procs import spawn_facts
from hil.safety.launch import LaunchPlan

KEY = bytes(range(32))


def reset_msg(run: int, nonce: str, **boot) -> dict:
    return {"op": "reset", "run": run, "nonce": nonce, "boot": {"scenario": {"name": "x"}, **boot}}


def test_gate_obeys_signed_fresh_resets_only():
    gate = rp.ResetGate(KEY, "safety")
    msg, why = gate.check(rp.encode(KEY, "safety", reset_msg(1, "a"))[4:])
    assert why == "" and msg["boot"]["scenario"] == {"name": "x"}
    # the same frame again (a replay), an older run number, a seen nonce: stale
    assert gate.check(rp.encode(KEY, "safety", reset_msg(1, "a"))[4:])[1].startswith("stale")
    assert gate.check(rp.encode(KEY, "safety", reset_msg(1, "b"))[4:])[1].startswith("stale")
    assert gate.check(rp.encode(KEY, "safety", reset_msg(5, "a"))[4:])[1].startswith("stale")
    # signed with another key, or with this key for the other role (the policy's frames): forged
    assert gate.check(rp.encode(bytes(32), "safety", reset_msg(2, "c"))[4:])[1].startswith("forged")
    assert gate.check(rp.encode(KEY, "policy", reset_msg(2, "c"))[4:])[1].startswith("forged")
    # a body changed after signing: forged
    raw = bytearray(rp.encode(KEY, "safety", reset_msg(2, "c"))[4:])
    raw[raw.index(b'"run":2') + 6] = ord("9")
    assert gate.check(bytes(raw))[1].startswith("forged")
    # signed but not a reset
    assert gate.check(rp.encode(KEY, "safety", {"op": "reset", "run": "2", "nonce": "c", "boot": {}})[4:])[1] \
        .startswith("malformed")
    assert gate.counters == {"resets": 1, "refused_forged": 3, "refused_stale": 3, "refused_malformed": 1}
    assert gate.check(rp.encode(KEY, "safety", reset_msg(2, "c"))[4:])[1] == ""  # and the next one is obeyed


def test_child_link_answers_refusals_and_waits_for_a_valid_reset(tmp_path):
    ours, theirs = socket.socketpair()
    link = rp.ChildLink({"fd": theirs.detach(), "key": KEY.hex()}, "policy")  # the socket is the link's now
    saved_stderr = os.dup(2)
    log = open(tmp_path / "run1-stderr.log", "wb")
    junk = open(tmp_path / "junk", "wb")
    try:
        first = rp.encode(KEY, "policy", reset_msg(1, "n1", seed=1))
        # a forged frame with a descriptor (closed, not installed), then the real reset with the run's stderr
        rp.send_frame(ours, rp.encode(os.urandom(32), "policy", reset_msg(1, "n0")), fds=(junk.fileno(),))
        rp.send_frame(ours, first, fds=(log.fileno(),))
        assert link.next_reset()["seed"] == 1
        link.acknowledge(True)
        os.write(2, b"written by the reset child\n")
        assert (tmp_path / "run1-stderr.log").read_bytes() == b"written by the reset child\n"
        assert (tmp_path / "junk").read_bytes() == b""
        raw, fds = rp.recv_frame(ours, 5.0)
        refused = rp.verify(KEY, "policy", raw)
        assert refused["ok"] is False and refused["why"].startswith("forged") and fds == []
        ack = rp.verify(KEY, "policy", rp.recv_frame(ours, 5.0)[0])
        assert ack["op"] == "reset" and ack["ok"] is True and ack["nonce"] == "n1" and ack["pid"] == os.getpid()
        # the earlier reset replayed, then exit: refused as stale, and no reset returned
        rp.send_frame(ours, first)
        rp.send_frame(ours, rp.encode(KEY, "policy", {"op": "exit"}))
        assert link.next_reset() is None
        assert rp.verify(KEY, "policy", rp.recv_frame(ours, 5.0)[0])["why"].startswith("stale")
        # no answer within the bound: None, not a hang
        assert rp.recv_frame(ours, 0.05)[0] is None
        # a closed pair (the worker died): no reset
        ours.close()
        assert link.next_reset() is None
    finally:
        os.dup2(saved_stderr, 2)
        os.close(saved_stderr)
        ours.close()
        link.sock.close()
        log.close()
        junk.close()


def test_a_frame_length_out_of_range_is_an_error():
    ours, theirs = socket.socketpair()
    try:
        ours.sendall((rp.MAX_FRAME_BYTES + 1).to_bytes(4, "little"))
        with pytest.raises(ValueError, match="reset frame"):
            rp.recv_frame(theirs, 1.0)
    finally:
        ours.close()
        theirs.close()


def plan(**over) -> LaunchPlan:
    env = {"PATH": "/bin", "HIL_FAULT_POLICY": over.pop("fault", "")}
    p = dict(policy_cmd=["py", "-m", "hil.policy.process", "s.toml"], policy_boot={"confine": {"kind": "uid", "uid": 1}},
             policy_kw={"env": env, "cwd": "/r/policy"},
             safety_cmd=["py", "-m", "hil.safety.wrapper", "s.toml", "--log", "/out/a/log", "--status", "/out/a/st"],
             safety_boot={}, safety_kw={"env": env}, log="/out/a/log", status="/out/a/st",
             policy_status="/r/policy/policy-status.json", run_dir="/r")
    p.update(over)
    return LaunchPlan(**p)


def test_spawn_facts_ignore_what_a_reset_carries_only():
    base = spawn_facts(plan())
    # the run's decision log and status paths, and its injected fault, travel in the reset
    assert spawn_facts(plan(safety_cmd=["py", "-m", "hil.safety.wrapper", "s.toml", "--log", "/out/b/log",
                                        "--status", "/out/b/st"], log="/out/b/log", status="/out/b/st")) == base
    assert spawn_facts(plan(fault='{"kind": "policy_nan"}')) == base
    # what a process is started with does not: another confinement, run directory, scenario file
    assert spawn_facts(plan(policy_boot={"confine": {"kind": "landlock"}})) != base
    assert spawn_facts(plan(run_dir="/other")) != base
    assert spawn_facts(plan(policy_cmd=["py", "-m", "hil.policy.process", "t.toml"])) != base
