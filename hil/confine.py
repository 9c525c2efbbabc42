"""Keeping the policy process away from the safety's secrets: what confinement a run obtains.

The policy is untrusted code (a hostile or buggy author). It holds only the keys of its own
channels (obs, proposal, command: hil/bus/auth.py), so it cannot sign an action or a supervisor
decision, provided it can reach nothing that holds the full run secret:

- the secret goes to the safety process, and the policy's channel keys to the policy, over an
  inherited pipe (`--bootstrap-fd`, hil/safety/launch.py), never in an environment block
  (/proc/<pid>/environ keeps a process's initial environment for its whole life) nor on a
  command line;
- the loop and the safety process make themselves non-dumpable (`PR_SET_DUMPABLE` 0) before they
  hold the secret: a process of the same uid can then neither ptrace them nor read their
  /proc/<pid>/mem or environ;
- the key file in the run directory (for the operator's `hil safety promote|demote|rollback`) is
  out of the policy's reach:
  - "uid" (hil runs as root, as CI does): the policy process runs under its own unprivileged uid
    (`[policy] uid`, default 65534 "nobody"; no supplementary groups). The run directory is the
    loop's, mode 0711 (others may traverse it to reach the one sub-directory below, never list
    or open anything else: the key is 0600 root, each socket 0600), the policy's sockets and
    status file live in `<run dir>/policy/`, owned by that uid, mode 0700. A versioned policy
    directory or ONNX file is copied there at start (the policy's uid cannot read the
    operator's private files); an entry module must be importable by that uid;
  - "landlock" (not root, or root with an interpreter the policy's uid cannot run; the kernel
    has Landlock): the policy process may read everything but the run directory (its own
    `<run dir>/policy/` excepted, where it may also write), write nowhere else, and (Landlock
    ABI >= 6) signal no process outside its sandbox; as root it also gives up every capability
    (`drop_capabilities`: root's CAP_SYS_PTRACE would open the non-dumpable processes'
    /proc/<pid>/environ to it again);
  - "none": neither is available: the policy process runs as the run's user and could read the
    key file; the run summary says so.

The policy process applies it itself (`confine_self`), from its entry point hil/policy/process.py,
before numpy is imported: Landlock does not reach threads that already exist (BLAS workers).
`policy_confinement()` decides; the run summary's `policy.confinement` records what a run got.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import stat
import sys
from dataclasses import asdict, dataclass

POLICY_SUBDIR = "policy"  # <run dir>/policy: the policy process's sockets and status file
POLICY_UID_DEFAULT = 65534  # "nobody"
PR_SET_DUMPABLE = 4


@dataclass(frozen=True)
class Confinement:
    """How the policy process is kept from the run secret: kind "uid", "landlock" or "none";
    uid/gid it runs as (-1: the run's); note: one line for the run summary."""

    kind: str
    uid: int = -1
    gid: int = -1
    note: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def set_non_dumpable() -> bool:
    """PR_SET_DUMPABLE 0 for this process: same-uid processes cannot ptrace it or read its
    /proc/<pid>/mem and environ (and no core dump holds its secrets). True if it took."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_CAP_VERSION_3 = 0x20080522
CAP_LAST_MAX = 63  # capability numbers are below 64 (cap_last_cap is 40 on Linux 6.x)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_capabilities() -> str:
    """Give up every capability of this process for good (bounding, ambient, effective,
    permitted, inheritable sets), as the policy process does when it runs as root under
    Landlock: without CAP_SYS_PTRACE a non-dumpable process's /proc/<pid>/environ and mem are
    closed to it (root keeps them open otherwise), without CAP_DAC_OVERRIDE other users' files,
    without CAP_KILL other users' processes. Its uid stays 0 (it still owns root's files:
    Landlock keeps it out of the run directory). Returns "dropped" or the reason it failed."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        for cap in range(CAP_LAST_MAX + 1):
            if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != 22:  # EINVAL: no such cap
                return f"PR_CAPBSET_DROP {cap}: {os.strerror(ctypes.get_errno())}"
        libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
        header, data = _CapHeader(_CAP_VERSION_3, 0), (_CapData * 2)()
        if libc.capset(ctypes.byref(header), data) != 0:
            return f"capset: {os.strerror(ctypes.get_errno())}"
    except (OSError, AttributeError) as exc:
        return f"not possible here: {exc}"
    return "dropped" if effective_capabilities() == 0 else "capset left some capabilities"


def effective_capabilities() -> int:
    """This process's effective capability mask (/proc/self/status CapEff); -1 if unknown."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return -1


def is_dumpable() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(3, 0, 0, 0, 0) == 1  # PR_GET_DUMPABLE
    except (OSError, AttributeError):
        return True


def policy_confinement(policy_section=None) -> Confinement:
    """The confinement a policy process started now would get (see the module docstring)."""
    from hil.landlock import abi_version

    abi = abi_version()
    if os.geteuid() == 0:
        uid = getattr(policy_section, "uid", None) or POLICY_UID_DEFAULT
        if _others_can_run(sys.executable):
            return Confinement("uid", uid, uid, f"policy process runs as uid {uid}, outside the run directory")
        if abi > 0:
            return Confinement("landlock", -1, -1, f"root, but uid {uid} cannot run {sys.executable}: Landlock ABI "
                                                   f"{abi} keeps the policy process out of the run directory")
    if abi > 0:
        return Confinement("landlock", -1, -1, f"Landlock ABI {abi}: the policy process cannot read the run directory")
    return Confinement("none", -1, -1, "not root and no Landlock: the policy process runs as the run's user and "
                                       "could read the run's key file")


def _others_can_run(exe: str) -> bool:
    """Whether an unprivileged uid (not the owner, no group) can execute `exe`: every directory on
    its real path searchable by others, the file executable by others."""
    path = os.path.realpath(exe)
    try:
        if not os.stat(path).st_mode & 0o001:
            return False
        d = os.path.dirname(path)
        while True:
            if not os.stat(d).st_mode & 0o001:
                return False
            if d == "/":
                return True
            d = os.path.dirname(d)
    except OSError:
        return False


def policy_dir(run_dir: str) -> str:
    return os.path.join(run_dir, POLICY_SUBDIR)


def prepare_policy_dir(run_dir: str, conf: Confinement) -> str:
    """Create `<run_dir>/policy` for the policy process (0700, owned by its uid) and open the
    run directory for traversal only (0711) when the policy runs under another uid. The run
    directory must exist and have been checked (hil.bus.auth.ensure_private_dir)."""
    d = policy_dir(run_dir)
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        st = os.lstat(d)
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(d)
            os.mkdir(d, 0o700)
    os.chmod(d, 0o700, follow_symlinks=False)
    if conf.kind == "uid":
        os.chown(d, conf.uid, conf.gid, follow_symlinks=False)
        os.chmod(run_dir, 0o711)
    return d


def policy_dir_owner(d: str) -> int | None:
    """The uid that owns policy directory `d` if it is a real `<run dir>/policy` directory,
    0700, under a run directory of this user (so only this user can have made it); else None."""
    if os.path.basename(d) != POLICY_SUBDIR:
        return None
    from hil.bus.config import run_dir_problem

    parent = os.path.dirname(d)
    if run_dir_problem(parent) is not None or not os.path.isdir(parent):
        return None
    try:
        st = os.lstat(d)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_mode & 0o077:
        return None
    return st.st_uid


def copy_for_policy(src: str, dest_dir: str, conf: Confinement) -> str:
    """A copy of a policy file or directory `src` in the policy's directory, readable by its uid
    (the operator's files may be private). Returns the copy's path."""
    dest = os.path.join(dest_dir, "store", os.path.basename(os.path.normpath(src)))
    if os.path.exists(dest):
        shutil.rmtree(dest) if os.path.isdir(dest) else os.unlink(dest)
    os.makedirs(os.path.dirname(dest), mode=0o700, exist_ok=True)
    if os.path.isdir(src):
        shutil.copytree(src, dest, symlinks=False)
    else:
        shutil.copy(src, dest)
    if conf.kind == "uid":
        for root, dirs, files in os.walk(os.path.dirname(dest)):
            os.chown(root, conf.uid, conf.gid)
            for n in dirs + files:
                os.chown(os.path.join(root, n), conf.uid, conf.gid, follow_symlinks=False)
    return dest


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return -1


def confine_self(spec: dict | None) -> dict:
    """In the policy process, before any policy code runs: apply the confinement the launcher
    planned (`spec`, from the bootstrap pipe): Landlock (read all but the run directory, write
    only the policy's own directory) where the kernel has it; as root, every capability dropped.
    What was obtained (`threads`: the process's threads at that moment, which should be 1:
    Landlock does not reach threads that already exist), for the status file and the summary."""
    out = {"euid": os.geteuid()}
    if not spec:
        out["landlock"] = "not requested (started by hand)"
        return out
    from hil.landlock import abi_version, restrict_self

    out["threads"] = _thread_count()  # Landlock confines this thread and later ones only
    if abi_version() <= 0:
        out["landlock"] = "not available in this kernel"
    else:
        try:
            out["landlock"] = f"ABI {restrict_self(spec['hidden_dir'], spec['writable_dir'])}"
        except (OSError, KeyError) as exc:
            out["landlock"] = f"refused: {exc}"
    if os.geteuid() == 0:  # no capability may reopen what non-dumpable closes (CAP_SYS_PTRACE)
        out["capabilities"] = drop_capabilities()
    return out
