"""`hil shadow SCENARIO --policy DIR`: a policy version run in HIL in shadow mode without a copy of
the scenario; bad input exits 2 naming the option and the reason, `--require-gate` exits 1 unless
the shadow gate passed. The whole road (train, import, shadow) runs in
tests/docs/test_train_then_prove.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from hil.cli import main

ROOT = Path(__file__).resolve().parents[2]
GYM = str(ROOT / "configs" / "bioreactor_gym.toml")


def _shadow(*args):
    return CliRunner().invoke(main, ["shadow", *args], catch_exceptions=False)


@pytest.mark.parametrize("args, why", [
    (["--version", "v9"], "--version: 'v9' is not in"),
    (["--duration", "soon"], "--duration"),
])
def test_bad_options_exit_2_naming_them(args, why):
    r = _shadow(GYM, "--policy", str(ROOT / "policies" / "bioreactor_gym"), *args)
    assert r.exit_code == 2 and why in r.output, r.output


def test_an_empty_policy_directory_and_a_scenario_without_safety_are_refused(tmp_path):
    r = _shadow(GYM, "--policy", str(tmp_path))
    assert r.exit_code == 2 and "--policy:" in r.output and "holds no policy version" in r.output
    r = _shadow(str(ROOT / "configs" / "bioreactor.toml"), "--policy", str(ROOT / "policies" / "bioreactor_gym"))
    assert r.exit_code == 2 and "no [safety] / [bus] section" in r.output


def test_require_gate_exits_1_unless_the_gate_passed(tmp_path, monkeypatch):
    pol = tmp_path / "pol"
    shutil.copytree(ROOT / "policies" / "bioreactor_gym", pol)
    monkeypatch.chdir(tmp_path)  # --out relative to the cwd (not to the scenario's directory)
    r = _shadow(GYM, "--policy", "pol", "--duration", "30s", "--out", "sh", "--require-gate", "--json")
    comp = json.loads(r.stdout.strip().splitlines()[-1])
    assert "shadow run: 30 steps" in r.output and comp["modes"] == ["shadow"] and comp["proposals"] >= 25
    assert r.exit_code == (0 if comp["shadow_gate"]["passed"] is True else 1), r.output
    assert (tmp_path / "sh" / "decisions.jsonl").is_file() and (tmp_path / "sh" / "rec").is_dir()
