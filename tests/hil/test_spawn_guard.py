"""A script calling hil at its unguarded top level gets a clear error before anything starts
(no child re-running the script, no shared memory left behind); a guarded script runs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

BODY = """
from hil.scenario.config import load_scenario
from hil.runtime import Runtime

sc = load_scenario({cfg!r})
with Runtime(sc, lockstep=True, duration_s=5.0, record=True, record_path={rec!r}) as rt:
    s = rt.run()
print("steps", s.steps)
"""


def _shm_of(pid: int) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if f"_{pid}_" in n]


def _run(tmp_path, guarded: bool):
    body = BODY.format(cfg=str(ROOT / "configs" / "bioreactor.toml"), rec=str(tmp_path / "rec"))
    if guarded:
        body = "if __name__ == '__main__':\n" + textwrap.indent(body, "    ")
    script = tmp_path / "user_script.py"
    script.write_text(body)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    out, err = proc.communicate(timeout=300)
    return proc, out, err


def test_unguarded_script_gets_a_clear_error_and_leaves_nothing(tmp_path):
    proc, out, err = _run(tmp_path, guarded=False)
    assert proc.returncode != 0
    assert "user_script.py:7" in err and "__main__" in err and "nothing was started" in err, err[-2000:]
    assert "steps" not in out
    assert _shm_of(proc.pid) == []


def test_guarded_script_runs(tmp_path):
    proc, out, err = _run(tmp_path, guarded=True)
    assert proc.returncode == 0, err[-2000:]
    assert "steps 5" in out
    assert _shm_of(proc.pid) == []
