"""Landlock (Linux >= 5.13) for the policy process: read everything except one directory, write
only in another. Used by hil/confine.py when the policy process cannot run under its own uid.

Landlock rules allow, they never deny; "everything but the run directory" is built as a cover:
for each directory on the path from / to the run directory, every entry except the one leading
there gets read access (directories: read, list, execute beneath; files: read, execute). The run
directory itself and its contents are not covered, except its `policy/` sub-directory, which
gets read and write. Nothing else may be written (the loop's shared-memory image included).
Entries created after the ruleset (in / or the run directory's parents) are not readable.
"""

from __future__ import annotations

import ctypes
import os
import platform

_SYS = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446)}
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
ABI1_ALL = (1 << 13) - 1  # execute .. make_sym
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64)]


class _RulesetAttrScoped(ctypes.Structure):  # ABI >= 6: IPC scoping
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def abi_version() -> int:
    """The kernel's Landlock ABI version; 0 if it has none (or it is disabled)."""
    nums = _SYS.get(platform.machine())
    if nums is None:
        return 0
    try:
        libc = _libc()
        libc.syscall.restype = ctypes.c_long
        v = libc.syscall(ctypes.c_long(nums[0]), None, ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return max(0, int(v))


def handled_rights(abi: int) -> int:
    rights = ABI1_ALL
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    if abi >= 5:
        rights |= IOCTL_DEV
    return rights


def _cover(hidden: str) -> list[str]:
    """Paths whose union is every existing path except `hidden` and what lies beneath it.

    Symbolic links are left out: Landlock checks the path a link resolves to, so a file reached
    through a link is readable when its real path is covered; a rule on a link would instead
    cover its target, and a link to an ancestor of `hidden` (pytest's `pytest-current`, a
    `/var/run -> /run`) would open the hidden directory again."""
    out: list[str] = []
    hidden = os.path.realpath(hidden)
    parts = [p for p in hidden.split(os.sep) if p]
    here = "/"
    for part in parts:
        try:
            names = os.listdir(here)
        except OSError:
            names = []
        out += [os.path.join(here, n) for n in names if n != part and not os.path.islink(os.path.join(here, n))]
        here = os.path.join(here, part)
    return out


def restrict_self(hidden_dir: str, writable_dir: str) -> int:
    """Confine this process (and its future children): read anything but `hidden_dir`, read and
    write only `writable_dir` (which may lie inside `hidden_dir`); with ABI >= 6 also send no
    signal to a process outside the sandbox. Call it before the process starts threads (Landlock
    confines the calling thread and its future children only). Returns the ABI used; raises
    OSError if the kernel refuses (no Landlock: ENOSYS/EOPNOTSUPP)."""
    abi = abi_version()
    if abi <= 0:
        raise OSError(38, "Landlock is not available")
    sys_create, sys_add, sys_restrict = _SYS[platform.machine()]
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    handled = handled_rights(abi)
    # ABI >= 6: no signal to, no abstract unix socket of, a process outside the sandbox (the
    # policy can neither stop nor kill the loop or the safety process)
    attr = _RulesetAttrScoped(handled, 0, SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if abi >= 6 else _RulesetAttr(handled)
    fd = libc.syscall(ctypes.c_long(sys_create), ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)),
                      ctypes.c_uint32(0))
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"landlock_create_ruleset: {os.strerror(e)}")
    try:
        read_dir = READ_FILE | READ_DIR | EXECUTE
        rules = [(p, read_dir) for p in _cover(hidden_dir)] + [(writable_dir, handled)]
        for path, rights in rules:
            try:
                pfd = os.open(path, os.O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW)
            except OSError:
                continue  # gone since the listing, or not reachable: not covered
            try:
                if not os.path.isdir(path):
                    rights &= FILE_RIGHTS
                rule = _PathBeneath(rights & handled, pfd)
                if libc.syscall(ctypes.c_long(sys_add), ctypes.c_int(fd), ctypes.c_int(RULE_PATH_BENEATH),
                                ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
                    e = ctypes.get_errno()
                    raise OSError(e, f"landlock_add_rule {path}: {os.strerror(e)}")
            finally:
                os.close(pfd)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"PR_SET_NO_NEW_PRIVS: {os.strerror(e)}")
        if libc.syscall(ctypes.c_long(sys_restrict), ctypes.c_int(fd), ctypes.c_uint32(0)) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"landlock_restrict_self: {os.strerror(e)}")
    finally:
        os.close(fd)
    return abi
