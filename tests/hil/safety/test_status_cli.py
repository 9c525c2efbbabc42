"""`hil safety status` (hil/commands/safety.py): what the operator reads about the policy,
the confidence checks and Bad signals, from a real SafetyCore status (no process)."""

import json
import math

from click.testing import CliRunner

import hil.commands.safety as cli

from .helpers import CONFIG
from .test_core_faults import _chain, _core


def _status_output(monkeypatch, core, *args):
    st = core.status()
    monkeypatch.setattr(cli, "_load", lambda config: None)
    # the status crosses msgpack / JSON in the real process: keep only what JSON carries
    monkeypatch.setattr(cli, "_request", lambda sc, msg, timeout: {"status": json.loads(json.dumps(st))})
    res = CliRunner().invoke(cli.command, ["status", str(CONFIG), *args])
    assert res.exit_code == 0, res.output
    return res.output


def test_status_shows_each_confidence_check_enabled_or_disabled(monkeypatch):
    core, _ = _core({"safety": {"mode": "full", "confidence": {"disagreement": False}}},
                    version="tests.hil.safety.policies:constant", store=None)
    _chain(core, 0, 3, [0.0003, 13.0], prop=[0.0003, 13.0], version="tests.hil.safety.policies:constant")
    out = _status_output(monkeypatch, core)
    assert "check disagreement: DISABLED in [safety.confidence]" in out
    assert "check mahalanobis: enabled" in out and "no training statistics: cannot be computed, fails closed" in out
    assert "check consistency: enabled, last 0.0 (enter > 0.01, exit <= 0.01)" in out
    assert "fallback ACTIVE (mahalanobis cannot be computed" in out


def test_status_shows_the_policy_lost_and_bad_signals(monkeypatch):
    core, _ = _core({"safety": {"mode": "full"}})
    _, applied = _chain(core, 0, 5, [0.0003, 13.0], prop=[0.0003, 13.0])
    _chain(core, 5, 15, applied, prop=None, do=math.nan)
    out = _status_output(monkeypatch, core)
    assert "policy: none may act" in out  # the Bad DO tripped do_low: v1 rolled back
    core, _ = _core({"safety": {"mode": "full"}})
    _, applied = _chain(core, 0, 5, [0.0003, 13.0], prop=[0.0003, 13.0])
    q = [0] * 9
    q[0] = 2  # glucose: not monitored
    _chain(core, 5, 15, applied, prop=None, q=q)
    out = _status_output(monkeypatch, core)
    assert "policy: LOST since t = 9 s (last valid proposal at t = 4 s; lost after 5 s of silence)" in out
    assert "Bad signals: glucose" in out and "ALARM t=9 s policy lost" in out
    st = json.loads(_status_output(monkeypatch, core, "--json"))
    assert st["policy"]["state"] == "lost" and st["fallback"]["checks"]["mahalanobis"]["enabled"]
