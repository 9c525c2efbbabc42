"""hil/landlock.py's cover and hil/confine.py's capability drop, each in a child process (a
Landlock domain or a dropped capability is for good)."""

import os
import subprocess
import sys
import textwrap

import pytest

from hil.landlock import _cover, abi_version


def test_cover_leaves_out_links_that_lead_back_to_the_hidden_directory(tmp_path):
    hidden = tmp_path / "base" / "run"
    hidden.mkdir(parents=True)
    (tmp_path / "base" / "other").mkdir()
    (tmp_path / "current").symlink_to(tmp_path / "base")  # as pytest's pytest-current
    cover = _cover(str(hidden))
    assert str(tmp_path / "base" / "other") in cover
    assert str(tmp_path / "current") not in cover and str(hidden) not in cover


CHILD = textwrap.dedent("""
    import json, os, sys
    from hil.landlock import restrict_self
    from hil.confine import drop_capabilities, effective_capabilities
    hidden, writable = sys.argv[1], sys.argv[2]
    restrict_self(hidden, writable)
    out = {"caps": drop_capabilities() if os.geteuid() == 0 else "not root", "eff": effective_capabilities()}
    for name, path in (("key", os.path.join(hidden, "key")), ("via_link", sys.argv[3]),
                       ("parent_environ", f"/proc/{os.getppid()}/environ")):
        try:
            open(path, "rb").read()
            out[name] = "read"
        except OSError as exc:
            out[name] = exc.strerror
    try:
        os.kill(os.getppid(), 0)
        out["signal_parent"] = "sent"
    except OSError as exc:
        out["signal_parent"] = exc.strerror
    open(os.path.join(writable, "w"), "w").write("ok")
    print(json.dumps(out))
""")


@pytest.mark.skipif(abi_version() < 1, reason="no Landlock in this kernel")
def test_confined_child_reads_no_key_not_through_a_link_nor_a_non_dumpable_parents_environ(tmp_path):
    hidden = tmp_path / "base" / "run"
    (hidden / "policy").mkdir(parents=True)
    (hidden / "key").write_text("00" * 32)
    (tmp_path / "current").symlink_to(tmp_path / "base")
    parent = ("import ctypes, subprocess, sys; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); "  # PR_SET_DUMPABLE 0
              "sys.exit(subprocess.run(sys.argv[1:]).returncode)")
    out = subprocess.run([sys.executable, "-c", parent, sys.executable, "-c", CHILD, str(hidden), str(hidden / "policy"),
                          str(tmp_path / "current" / "run" / "key")], capture_output=True, text=True, timeout=120,
                         cwd=os.getcwd())
    assert out.returncode == 0, out.stderr
    import json

    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["key"] != "read" and got["via_link"] != "read", got
    assert got["parent_environ"] != "read", got  # root keeps CAP_SYS_PTRACE unless dropped
    if os.geteuid() == 0:
        assert got["caps"] == "dropped" and got["eff"] == 0, got
    if abi_version() >= 6:
        assert got["signal_parent"] != "sent", got  # signals scoped to the sandbox
    assert (hidden / "policy" / "w").read_text() == "ok"
