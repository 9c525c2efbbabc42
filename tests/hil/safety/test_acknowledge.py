"""Acknowledging alarms (SafetyCore.acknowledge, `hil safety acknowledge`, the dashboard's
button): marks the alarms seen by whom, logs it, changes no mode."""

import math

from click.testing import CliRunner

import hil.commands.safety as cli

from .helpers import CONFIG
from .test_core_faults import _chain, _core


def test_acknowledge_marks_alarms_and_logs_without_changing_the_mode():
    core, log = _core({"safety": {"mode": "full"}})
    _, applied = _chain(core, 0, 5, [0.0003, 13.0], prop=[0.0003, 13.0])
    _chain(core, 5, 15, applied, prop=None, do=math.nan)  # the policy goes silent: lost, an alarm
    alarms = core.status()["alarms"]
    assert alarms and not any(a.get("acknowledged_by") for a in alarms)
    mode = core.rollout.mode
    assert core.acknowledge(15.0, "dashboard operator") == len(alarms)
    st = core.status()
    assert all(a["acknowledged_by"] == "dashboard operator" for a in st["alarms"])
    assert st["mode"] == mode
    assert core.acknowledge(16.0, "someone") == 0  # nothing new to acknowledge
    acks = [r for r in log if r.get("event") == "acknowledge"]
    assert [r["by"] for r in acks] == ["dashboard operator", "someone"]
    assert acks[0]["reason"] == f"{len(alarms)} alarm(s) acknowledged by dashboard operator"


def test_acknowledge_command_sends_the_signed_op(monkeypatch):
    sent = []
    monkeypatch.setattr(cli, "_load", lambda config: "sc")
    monkeypatch.setattr(cli, "_request", lambda sc, msg, timeout: sent.append(msg) or {"ok": True, "acknowledged": 2})
    res = CliRunner().invoke(cli.command, ["acknowledge", str(CONFIG), "--by", "night shift"])
    assert res.exit_code == 0 and "2 alarm(s) acknowledged" in res.output
    assert sent == [{"op": "acknowledge", "by": "night shift"}]
    monkeypatch.setattr(cli, "_request", lambda sc, msg, timeout: {"ok": False, "error": "acknowledge refused: bad tag"})
    res = CliRunner().invoke(cli.command, ["acknowledge", str(CONFIG)])
    assert res.exit_code == 1 and "bad tag" in res.output
