"""Refuse to start a "spawn" child process from a script's unguarded top level.

multiprocessing's "spawn" start method re-imports the main script in the child. A script that
calls hil (a Runtime with a recorder, `hil.gym.deploy.shadow_run`) at its top level without
`if __name__ == "__main__":` would run again in the child, which then fails half-way (the
recorder "died at step 635") and leaves shared memory behind. `check_main_guard()` finds the
line of the main script that led to the call and, if it is not inside such a block, raises a
RuntimeError naming the file and line, before anything is created.
"""

from __future__ import annotations

import ast
import sys


def _guard_blocks(path: str) -> list[tuple[int, int]]:
    """Line ranges (first, last) of `if __name__ == "__main__":` bodies in the file at `path`."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            parts = [node.test.left, *node.test.comparators]
            names = {p.id for p in parts if isinstance(p, ast.Name)}
            consts = {p.value for p in parts if isinstance(p, ast.Constant)}
            if names == {"__name__"} and "__main__" in consts and node.body:
                out.append((node.body[0].lineno, max(getattr(n, "end_lineno", n.lineno) for n in node.body)))
    return out


def unguarded_call_site() -> tuple[str, int] | None:
    """(file, line) of the main script's top-level line that is calling us outside an
    `if __name__ == "__main__":` block, or None (guarded, not from a script, or interactive)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not path:
        return None
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals is main.__dict__:
            line = frame.f_lineno
            if any(a <= line <= b for a, b in _guard_blocks(path)):
                return None
            return path, line
        frame = frame.f_back
    return None


def check_main_guard(what: str) -> None:
    """Raise RuntimeError if `what` (a process about to be spawned) is started from the main
    script's unguarded top level (see the module docstring)."""
    site = unguarded_call_site()
    if site is not None:
        path, line = site
        raise RuntimeError(
            f"{what} starts a process with multiprocessing's 'spawn' method, which re-runs the main script: "
            f"{path}:{line} calls it at the script's top level. Put that code under "
            f"`if __name__ == \"__main__\":` (nothing was started)")
