"""Who may speak on the bus: the per-run secret, the private run directory, message tags.

Threat: any local process (any user over tcp://127.0.0.1; the same user over ipc://) can reach
a bus socket. So every message on every bus socket carries a keyed BLAKE2b tag over its bytes,
with a secret the loop creates for each run:

    raw = body + tag      body: the binary frame (hil/bus/wire.py), or on the control socket
                          a msgpack map; tag: TAG_BYTES bytes
    tag = BLAKE2b(body, key = channel key, digest_size = TAG_BYTES)
    channel key = BLAKE2b(b"", key = run secret, person = b"hil:" + channel)

A channel ("obs", "proposal", "action", "command", "advice", "control", "supervisor") gets its own key, so a
message captured on one socket (e.g. the advice PUB socket, which any local process can
subscribe to over tcp) is never valid on another (e.g. the loop's action socket). Receivers
check the tag (hmac.compare_digest) before anything else: a message without the secret never
touches replay state.

The secret: 32 random bytes, created by the loop side (`create_run_key`) as the 0600 file
`key` in the run directory, a private directory (owned by this user; 0700, or 0711 when the
policy runs under its own uid and must traverse it to reach `policy/`, hil/confine.py). The
safety process gets it at spawn over an inherited pipe (`--bootstrap-fd`; never in the
environment, which /proc/<pid>/environ shows for the process's whole life, nor on a command
line). The policy process gets only the keys of the channels it uses (obs, proposal, command)
the same way: it cannot derive the action key, so only the safety process can produce an action
the loop applies; and it is kept from the key file and from the loop's and safety's memory
(hil/confine.py). A process started by hand and the operator CLI (`hil safety
promote|demote|rollback`) read the file, which only the run's user can.

The run directory is `[bus].ipc_dir`, by default `<tmp>/hil-<user>-<scenario>`: predictable on
purpose, so that `hil safety status|promote` find a running scenario's sockets and key by its
name alone; it is created 0700 and, when it already exists, used only if it is a real directory
owned by this user with no group/other permission bits: anything else is refused with a
ConfigError naming the path (another user's directory could hold sockets or a key planted for us).
When the *default* directory is unusable that way, the runtime moves the run to a fresh private
directory and records it in this user's run index, where the operator commands find it
(hil/run_dirs.py); an explicit `ipc_dir` is never moved.
"""

from __future__ import annotations

import hashlib
import hmac
import fcntl
import os
import secrets
import stat
import time

from hil.errors import ConfigError

KEY_ENV = "HIL_BUS_KEY"
CHANNEL_KEYS_ENV = "HIL_BUS_CHANNEL_KEYS"
KEY_FILE = "key"
KEY_BYTES = 32
TAG_BYTES = 16  # 128-bit tag: forging one takes 2**128 tries, far beyond a run's lifetime
CHANNELS = ("obs", "proposal", "action", "command", "advice", "control", "supervisor")
CONTROL_MAX_AGE_NS = 30_000_000_000  # a signed operator request is valid for 30 s of wall time


def channel_key(secret, channel: str) -> bytes:
    """The key of one channel, derived from the run secret (bytes); or looked up in a dict of
    channel keys (what a process that holds only some channels got, see `channel_keys`)."""
    if channel not in CHANNELS:
        raise KeyError(f"unknown bus channel {channel!r} (known: {', '.join(CHANNELS)})")
    if isinstance(secret, dict):
        if channel not in secret:
            raise KeyError(f"this process holds no key for the bus channel {channel!r}")
        return secret[channel]
    if len(secret) < 16:
        raise ValueError("a bus secret has at least 16 bytes")
    return hashlib.blake2b(b"", key=secret, person=b"hil:" + channel.encode(), digest_size=32).digest()


def sign(ckey: bytes, body: bytes) -> bytes:
    """body + its tag."""
    return body + hashlib.blake2b(body, key=ckey, digest_size=TAG_BYTES).digest()


def verify(ckey: bytes, raw: bytes) -> memoryview | None:
    """The body of `raw` if its tag is right, else None."""
    if len(raw) <= TAG_BYTES:
        return None
    view = memoryview(raw)
    body = view[:-TAG_BYTES]
    if hmac.compare_digest(hashlib.blake2b(body, key=ckey, digest_size=TAG_BYTES).digest(), view[-TAG_BYTES:]):
        return body
    return None


# ---- the run directory and the secret ----


def ensure_private_dir(path: str, key_path: str = "bus.ipc_dir") -> str:
    """Create `path` (mode 0700) or check that it is a directory of this user with mode 0700 or
    narrower; raise ConfigError naming the path and the fix otherwise."""
    path = os.path.abspath(path)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
    from hil.bus.config import run_dir_problem

    if reason := run_dir_problem(path):
        raise ConfigError(key_path, reason)
    return path


def run_dir(bus, scenario_name: str) -> str:
    """The run directory of a scenario's bus (holds the ipc sockets and the key file)."""
    return bus.resolved_ipc_dir(scenario_name)


LOCK_FILE = "run.lock"
_RUN_LOCKS: dict[str, int] = {}  # run directory -> fd holding its flock (this process's run)


def lock_run_dir(d: str) -> None:
    """Claim run directory `d` for this process (flock on `d/run.lock`, held until
    `release_run_dir`): two runs of one scenario must not share sockets and key, since an ipc
    bind silently takes the other run's socket over. ConfigError naming the holder if taken."""
    if d in _RUN_LOCKS:
        return
    fd = os.open(os.path.join(d, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            holder = os.read(fd, 32).decode().strip() or "?"
        finally:
            os.close(fd)
        raise ConfigError("bus.ipc_dir", f"{d} is in use by another run (pid {holder}): stop it, or give "
                                         "this run a directory of its own (--set bus.ipc_dir=DIR)") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    _RUN_LOCKS[d] = fd


def release_run_dir(d: str) -> None:
    """Give up this process's claim on run directory `d` (see lock_run_dir)."""
    fd = _RUN_LOCKS.pop(d, None)
    if fd is not None:
        os.close(fd)  # closing the last descriptor releases the flock


def create_run_key(bus, scenario_name: str) -> bytes:
    """A fresh secret for this run, written 0600 into the (checked, claimed) run directory."""
    d = ensure_private_dir(run_dir(bus, scenario_name))
    lock_run_dir(d)
    secret = secrets.token_bytes(KEY_BYTES)
    tmp = os.path.join(d, f".{KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, secret.hex().encode())
    finally:
        os.close(fd)
    os.replace(tmp, os.path.join(d, KEY_FILE))
    return secret


def read_run_key(bus, scenario_name: str) -> bytes:
    """The secret of the scenario's running loop, from its key file (checked: owner, mode)."""
    d = ensure_private_dir(run_dir(bus, scenario_name))
    path = os.path.join(d, KEY_FILE)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise ConfigError("bus.ipc_dir", f"no bus key at {path}: is the scenario running (as this user)?") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise ConfigError("bus.ipc_dir", f"{path}: owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}; "
                                             "a bus key must be this user's with mode 0600")
        text = os.read(fd, 4 * KEY_BYTES).decode().strip()
    finally:
        os.close(fd)
    try:
        secret = bytes.fromhex(text)
    except ValueError:
        raise ConfigError("bus.ipc_dir", f"{path} does not hold a hex key") from None
    if len(secret) < 16:
        raise ConfigError("bus.ipc_dir", f"{path} holds a key shorter than 16 bytes")
    return secret


def remove_run_key(path: str, secret: bytes) -> None:
    """Remove the key file at `path` if it still holds `secret` (not a later run's key)."""
    try:
        with open(path) as f:
            if f.read().strip() == secret.hex():
                os.unlink(path)
    except OSError:
        pass


POLICY_CHANNELS = ("obs", "proposal", "command")  # what the policy process verifies or signs


def channel_keys(secret: bytes, channels) -> dict[str, bytes]:
    """The keys of some channels only: a process holding them cannot derive any other (BLAKE2b
    is one-way), so the policy process, which gets POLICY_CHANNELS, cannot sign an action."""
    return {c: channel_key(secret, c) for c in channels}


def child_env(base: dict | None = None) -> dict:
    """The environment of a bus child process: `base` (default os.environ) without any bus key
    (keys go over the bootstrap pipe: an environment block stays readable in /proc/<pid>/environ
    for the process's whole life)."""
    env = dict(os.environ if base is None else base)
    env.pop(KEY_ENV, None)
    env.pop(CHANNEL_KEYS_ENV, None)
    return env


def bootstrap_keys(secret: bytes, channels=None) -> dict:
    """What a child's bootstrap pipe carries for the bus: the whole secret (the safety) or only
    the keys of `channels` (the policy: POLICY_CHANNELS), hex."""
    if channels is None:
        return {"key": secret.hex()}
    return {"channel_keys": {c: k.hex() for c, k in channel_keys(secret, channels).items()}}


def keys_from_bootstrap(boot: dict):
    """The secret (bytes) or channel keys (dict) a bootstrap message carries; None if neither."""
    if "channel_keys" in boot:
        try:
            out = {c: bytes.fromhex(k) for c, k in dict(boot["channel_keys"]).items()}
        except (TypeError, ValueError):
            raise ConfigError("bootstrap.channel_keys", "is not a map of channel -> hex key") from None
        if not set(out) <= set(CHANNELS) or any(len(k) < 16 for k in out.values()):
            raise ConfigError("bootstrap.channel_keys", f"unknown channels or short keys: {sorted(out)}")
        return out
    if "key" in boot:
        try:
            secret = bytes.fromhex(boot["key"])
        except (TypeError, ValueError):
            raise ConfigError("bootstrap.key", "is not a hex key") from None
        if len(secret) < 16:
            raise ConfigError("bootstrap.key", "holds a key shorter than 16 bytes")
        return secret
    return None


def child_key(bus, scenario_name: str, boot: dict | None = None):
    """In a bus child: the secret (bytes) or the channel keys (dict) from its bootstrap pipe,
    else the running loop's key file (a process the same user started by hand)."""
    os.environ.pop(KEY_ENV, None)
    os.environ.pop(CHANNEL_KEYS_ENV, None)
    if boot:
        keys = keys_from_bootstrap(boot)
        if keys is not None:
            return keys
    return read_run_key(bus, scenario_name)


# ---- operator requests on the control socket ----


def sign_control(secret: bytes, request: dict) -> bytes:
    """An operator request (a map with "op") signed for the control socket; stamped with the wall
    time and a nonce, so that a captured request cannot be replayed later or twice."""
    import msgpack

    body = msgpack.packb({**request, "wall_ns": time.time_ns(), "nonce": secrets.token_hex(8)}, use_bin_type=True)
    return sign(channel_key(secret, "control"), body)


class ControlAuth:
    """Checks operator requests on the control socket: (request map or None, authenticated, why)."""

    def __init__(self, secret: bytes, max_age_ns: int = CONTROL_MAX_AGE_NS):
        self._ckey = channel_key(secret, "control")
        self._max_age_ns = max_age_ns
        self._seen: dict[str, int] = {}  # nonce -> wall_ns, for max_age_ns

    def check(self, raw: bytes) -> tuple[dict | None, bool, str]:
        import msgpack

        body = verify(self._ckey, raw)
        authed = body is not None
        why = "unsigned (needs the run's bus key)"
        try:
            msg = msgpack.unpackb(body if authed else raw, raw=False)
        except Exception:
            msg = None
            if not authed and len(raw) > TAG_BYTES:  # a body with a tag that is not the run's
                try:
                    msg = msgpack.unpackb(memoryview(raw)[:-TAG_BYTES], raw=False)
                    why = "signed with another key"
                except Exception:
                    msg = None
        if not isinstance(msg, dict):
            return None, False, "not a msgpack map"
        if not authed:
            return msg, False, why
        now = time.time_ns()
        wall, nonce = msg.get("wall_ns"), msg.get("nonce")
        if type(wall) is not int or abs(now - wall) > self._max_age_ns:
            return msg, False, "signed request too old (or clock skew over 30 s)"
        if type(nonce) is not str or nonce in self._seen:
            return msg, False, "signed request replayed"
        self._seen = {n: w for n, w in self._seen.items() if now - w <= self._max_age_ns}
        self._seen[nonce] = wall
        return msg, True, ""
