"""The dashboard's operator login: one password the operator provides, sessions in memory.

- No password given: the dashboard is read-only; every operator action is refused.
- The password comes from a file (`--password-file`, which must be this user's and not
  readable by others, as the bus key) or from the environment variable HIL_DASHBOARD_PASSWORD;
  never from the command line (other users see it in the process list).
- Login compares SHA-256 digests with hmac.compare_digest (constant time whatever the guess).
  A wrong password costs the caller FAILED_LOGIN_DELAY_S before the answer, and after
  MAX_FAILURES failures in a row every login is refused for LOCKOUT_S.
- A session is a random 256-bit token in an HttpOnly, SameSite=Strict cookie, valid for
  SESSION_TTL_S; each session also has a CSRF token that every operator request must carry in
  the X-HIL-CSRF header (a page of another origin can neither read it nor set the header).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
import time

from hil.errors import ConfigError

PASSWORD_ENV = "HIL_DASHBOARD_PASSWORD"
SESSION_TTL_S = 8 * 3600.0
FAILED_LOGIN_DELAY_S = 0.5
MAX_FAILURES = 5
LOCKOUT_S = 30.0
COOKIE = "hil_session"


def read_password(path: str | None) -> str | None:
    """The operator password from `path` (checked: this user's, mode without group/other bits),
    else from $HIL_DASHBOARD_PASSWORD, else None (read-only). ConfigError names the problem."""
    if path:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as exc:
            raise ConfigError("--password-file", f"{path}: {exc.strerror}") from None
        try:
            st = os.fstat(fd)
            if st.st_uid != os.geteuid() or st.st_mode & 0o077:
                raise ConfigError("--password-file", f"{path}: owner uid {st.st_uid}, mode "
                                  f"{stat.S_IMODE(st.st_mode):04o}; it must be this user's with mode 0600")
            text = os.read(fd, 4096).decode().strip()
        finally:
            os.close(fd)
        if not text:
            raise ConfigError("--password-file", f"{path} is empty")
        return text
    env = os.environ.get(PASSWORD_ENV)
    return env if env else None


class Auth:
    """Login check and sessions (see the module docstring)."""

    def __init__(self, password: str | None, clock=time.monotonic):
        self._digest = hashlib.sha256(password.encode()).digest() if password else None
        self._sessions: dict[str, tuple[float, str]] = {}  # token -> (expires, csrf)
        self._failures = 0
        self._locked_until = 0.0
        self._clock = clock

    @property
    def enabled(self) -> bool:
        return self._digest is not None

    def login(self, password: str) -> tuple[str, str] | None:
        """(session token, csrf token) for the right password, else None (also when disabled or
        locked out)."""
        now = self._clock()
        if self._digest is None or now < self._locked_until:
            return None
        guess = hashlib.sha256(str(password).encode()).digest()
        if not hmac.compare_digest(guess, self._digest):
            self._failures += 1
            if self._failures >= MAX_FAILURES:
                self._locked_until, self._failures = now + LOCKOUT_S, 0
            return None
        self._failures = 0
        token, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(16)
        self._sessions[token] = (now + SESSION_TTL_S, csrf)
        return token, csrf

    def check(self, token: str | None, csrf: str | None) -> bool:
        """A live session whose CSRF token matches."""
        if not token or not csrf:
            return False
        entry = self._sessions.get(token)
        if entry is None:
            return False
        if self._clock() > entry[0]:
            del self._sessions[token]
            return False
        return hmac.compare_digest(entry[1].encode(), str(csrf).encode())

    def logged_in(self, token: str | None) -> bool:
        entry = self._sessions.get(token or "")
        return entry is not None and self._clock() <= entry[0]

    def logout(self, token: str | None) -> None:
        self._sessions.pop(token or "", None)
