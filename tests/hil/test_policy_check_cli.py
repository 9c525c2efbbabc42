"""`hil policy check SCENARIO --policy DIR`: a policy directory checked against a scenario's
features and actions without copying the scenario."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _check(*args):
    return subprocess.run([sys.executable, "-m", "hil.cli", "policy", "check",
                           str(ROOT / "configs" / "bioreactor_policy.toml"), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_check_a_policy_directory_given_on_the_command_line(tmp_path):
    copy = tmp_path / "trained"
    shutil.copytree(ROOT / "policies" / "bioreactor", copy)
    shutil.rmtree(copy / "v1")  # only v2 left: the check must load it from the copy
    r = _check("--policy", str(copy), "--version", "v2")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("v2 (mlp_ensemble)") and "agitation_power =" in r.stdout
    r = _check("--policy", str(copy), "--version", "v1")
    assert r.returncode != 0 and "v1" in r.stderr


def test_a_directory_without_policies_is_refused(tmp_path):
    r = _check("--policy", str(tmp_path))
    assert r.returncode != 0 and r.stderr.strip()
