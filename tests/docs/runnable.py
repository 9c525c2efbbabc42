"""Runnable command blocks of the documentation: extraction and execution.

A fenced shell block is runnable when the line right before its fence is the marker comment

    <!-- runnable -->
    <!-- runnable timeout=300 expect="after 7200 steps" expect="stopped" -->

(invisible on the site and on GitHub). `expect="TEXT"` (repeatable) is a substring that the
block's stdout + stderr must contain; `timeout=S` bounds the block (default 600 s, generous for a
loaded 2-core machine: the bound catches a hang, not slowness).

A page's runnable blocks run in order, as one reader would type them, with `bash -e -o pipefail`
in one throw-away copy of the repository (so `.venv/bin/hil run configs/... --record runs/x`
works as written and writes nothing into the checkout): `.venv` in the copy links to the
interpreter's environment, PYTHONPATH puts the copy's code first, and TMPDIR/XDG_RUNTIME_DIR are a
private directory (a run's predictable directory never meets another session's).
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!--\s*runnable\b(?P<attrs>.*?)-->\s*$")
FENCE = re.compile(r"^(?P<fence>```+|~~~+)\s*(?P<info>[^\n`]*)$")
SHELLS = {"sh", "bash", "shell", "console"}
DEFAULT_TIMEOUT_S = 600.0
COPY_IGNORE = shutil.ignore_patterns(".git", ".venv", "site", "node_modules", "runs", ".pytest_cache", "*.egg-info",
                                     "MUJOCO_LOG.TXT")


@dataclass
class Block:
    page: str  # path relative to the repository root
    line: int  # 1-based line of the fence
    script: str
    expect: list[str] = field(default_factory=list)
    timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def parse_attrs(text: str, where: str) -> tuple[list[str], float]:
    """`expect="..."` (repeatable) and `timeout=S` from a marker's attribute text."""
    expect, timeout = [], DEFAULT_TIMEOUT_S
    for tok in shlex.split(text):
        key, sep, value = tok.partition("=")
        if key == "expect" and sep:
            expect.append(value)
        elif key == "timeout" and sep:
            try:
                timeout = float(value)
            except ValueError:
                raise ValueError(f"{where}: runnable timeout={value!r} is not a number of seconds") from None
            if not timeout > 0:
                raise ValueError(f"{where}: runnable timeout={value!r} must be > 0")
        else:
            raise ValueError(f"{where}: runnable marker: unknown attribute {tok!r} (expect=\"TEXT\", timeout=S)")
    return expect, timeout


def extract(text: str, page: str) -> list[Block]:
    """The runnable blocks of one Markdown text, in page order. A marker not followed by a
    shell fence is an error (a marker that silently marks nothing would hide a rotten block)."""
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        m = MARKER.match(line.strip())
        if not m:
            continue
        where = f"{page}:{i + 1}"
        expect, timeout = parse_attrs(m.group("attrs"), where)
        f = FENCE.match(lines[i + 1].strip()) if i + 1 < len(lines) else None
        lang = f.group("info").strip().split()[0].lower() if f and f.group("info").strip() else ""
        if not f or lang not in SHELLS:
            raise ValueError(f"{where}: a runnable marker must be followed by a ```sh / ```bash block")
        indent = len(lines[i + 1]) - len(lines[i + 1].lstrip())
        body = []
        for j in range(i + 2, len(lines)):
            if lines[j].strip().startswith(f.group("fence")) and not lines[j].strip().strip(f.group("fence")[0]):
                break
            body.append(lines[j][indent:])
        else:
            raise ValueError(f"{where}: the runnable block is not closed")
        out.append(Block(page, i + 2, "\n".join(body) + "\n", expect, timeout))
    return out


def doc_pages() -> list[Path]:
    return sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]


def all_blocks() -> dict[str, list[Block]]:
    """page -> its runnable blocks, for every page of docs/ and the README that has some."""
    out = {}
    for p in doc_pages():
        page = str(p.relative_to(ROOT))
        blocks = extract(p.read_text(), page)
        if blocks:
            out[page] = blocks
    return out


def repo_copy(dest: Path) -> Path:
    """A copy of the working tree at `dest` (with the Numba caches, mtimes kept so they hit),
    `.venv` linked to this interpreter's environment."""
    shutil.copytree(ROOT, dest, ignore=COPY_IGNORE, symlinks=True)
    (dest / ".venv").symlink_to(Path(sys.prefix))
    return dest


@dataclass
class Result:
    block: Block
    returncode: int
    output: str

    def problem(self) -> str | None:
        """Why the block failed (exit code or a missing expected text), None if it passed."""
        if self.returncode != 0:
            return f"{self.block.where} exited {self.returncode}"
        missing = [e for e in self.block.expect if e not in self.output]
        if missing:
            return f"{self.block.where}: output lacks {missing}"
        return None

    def report(self) -> str:
        tail = self.output[-4000:]
        return f"{self.problem()}\n--- script\n{self.block.script}--- output (last 4000 chars)\n{tail}"


def run_blocks(blocks: list[Block], workdir: Path) -> list[Result]:
    """Run `blocks` in order in `workdir` (a repo copy); stops after the first failing block."""
    private = Path(tempfile.mkdtemp(prefix="hd", dir="/tmp"))  # short: ipc paths are <= 107 bytes
    env = dict(os.environ, PYTHONPATH=str(workdir), TMPDIR=str(private), XDG_RUNTIME_DIR=str(private),
               MPLBACKEND="Agg", NO_COLOR="1", TERM="dumb")
    results = []
    try:
        for b in blocks:
            proc = subprocess.Popen(["bash", "-e", "-o", "pipefail", "-c", b.script], cwd=workdir, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    start_new_session=True)
            try:
                out, _ = proc.communicate(timeout=b.timeout_s)
                res = Result(b, proc.returncode, out)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGTERM)  # the block's own process group, nothing else
                try:
                    out, _ = proc.communicate(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    out, _ = proc.communicate()
                res = Result(b, -9, (out or "") + f"\n[timed out after {b.timeout_s:g} s]")
            results.append(res)
            if res.problem():
                break
    finally:
        shutil.rmtree(private, ignore_errors=True)
    return results
