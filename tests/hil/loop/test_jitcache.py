"""hil/loop/jitcache.py: Numba's disk cache of a kernel is invalidated by an edit of a kernel
it calls in another file (Numba alone keys on the kernel's own file and keeps the old callee).

Each case runs fresh interpreters over a small package copied to a tmp dir: compile and cache a
caller, check that a second process loads it from the cache (so the cache is live), edit the
callee's file, and check that a third process sees the new callee."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import hil
from hil.loop import jitcache

REPO = Path(hil.__file__).resolve().parent.parent

CALLEE = textwrap.dedent('''
    from numba import njit


    @njit(cache=True)
    def bump(x):
        return x + {inc}
''')
CALLER = textwrap.dedent('''
    from numba import njit

    from .inner.callee import bump


    @njit(cache=True)
    def twice_bumped(x):
        return 2 * bump(x)
''')
# hil imported first (its __init__ installs the locator when Numba loads), or the package's
# dispatchers created first and re-keyed when hil is imported
RUN = {"hil_first": "import hil\nfrom deppkg.caller import twice_bumped\n",
       "pkg_first": "from deppkg.caller import twice_bumped\nimport hil\n"}
REPORT = ("import json\nv = twice_bumped(1)\n"
          "print(json.dumps({'value': v, 'hits': sum(twice_bumped.stats.cache_hits.values()),"
          " 'misses': sum(twice_bumped.stats.cache_misses.values())}))\n")


def _package(tmp: Path, inc: int) -> Path:
    pkg = tmp / "deppkg"
    (pkg / "inner").mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "inner" / "__init__.py").write_text("")
    (pkg / "caller.py").write_text(CALLER)
    (pkg / "inner" / "callee.py").write_text(CALLEE.format(inc=inc))
    return pkg


def _run(tmp: Path, order: str, cache_dir: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp), str(REPO)])
    if cache_dir:
        env["NUMBA_CACHE_DIR"] = cache_dir
    out = subprocess.run([sys.executable, "-c", RUN[order] + REPORT], env=env, cwd=tmp,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("order", ["hil_first", "pkg_first"])
@pytest.mark.parametrize("where", ["in_tree", "NUMBA_CACHE_DIR"])
def test_edit_of_callee_recompiles_cached_caller(tmp_path, order, where):
    cache_dir = str(tmp_path / "numba-cache") if where == "NUMBA_CACHE_DIR" else None
    pkg = _package(tmp_path, inc=1)
    first = _run(tmp_path, order, cache_dir)
    assert first == {"value": 4, "hits": 0, "misses": 1}
    assert _run(tmp_path, order, cache_dir) == {"value": 4, "hits": 1, "misses": 0}  # the cache is live
    (pkg / "inner" / "callee.py").write_text(CALLEE.format(inc=10))  # (1 + 10) * 2
    after = _run(tmp_path, order, cache_dir)
    assert after["value"] == 22, "the cached caller ran the old callee"
    assert after["hits"] == 0
    assert _run(tmp_path, order, cache_dir) == {"value": 22, "hits": 1, "misses": 0}  # cached again


def test_dependency_files_follow_project_imports_only(tmp_path, monkeypatch):
    pkg = _package(tmp_path, inc=1)
    (pkg / "lazy.py").write_text("def f():\n    from deppkg import caller\n    import numpy\n")
    (pkg / "other.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    jitcache._top_locations.cache_clear()
    jitcache._module_file.cache_clear()
    files = [Path(f).relative_to(tmp_path.resolve()).as_posix()
             for f in jitcache.dependency_files(str(pkg / "lazy.py"))]
    # a function's import is followed (the package's __init__ too: `from deppkg import`), the
    # relatively imported callee too; numpy and numba (site-packages) and the unrelated other.py are not
    # (deppkg/inner/__init__.py is not: nothing is imported from it by name)
    assert files == ["deppkg/__init__.py", "deppkg/caller.py", "deppkg/inner/callee.py", "deppkg/lazy.py"]


def test_loop_step_depends_on_the_residual_kernel():
    """The case seen: hil/loop/step.py's cached correct_stage calls apply_correction."""
    import hil.calibration.residual as residual
    import hil.loop.step as step

    deps = jitcache.dependency_files(step.__file__)
    assert os.path.realpath(residual.__file__) in deps
    assert isinstance(step.correct_stage._cache._impl.locator, jitcache._LOCATOR)
