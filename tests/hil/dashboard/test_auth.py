"""Operator login: constant-time check, lockout, sessions bound to a CSRF token, password files."""

import os

import pytest

from hil.dashboard import auth as auth_mod
from hil.dashboard.auth import Auth, read_password
from hil.dashboard.serve import bind, parse_listen
from hil.errors import ConfigError


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_no_password_means_read_only():
    a = Auth(None)
    assert not a.enabled and a.login("") is None and a.login("anything") is None


def test_wrong_password_refused_right_one_gives_session_bound_to_csrf():
    a = Auth("s3cret")
    assert a.login("s3cre") is None and a.login("s3cret ") is None
    token, csrf = a.login("s3cret")
    assert a.check(token, csrf)
    assert not a.check(token, "x" * len(csrf)) and not a.check(token, None) and not a.check("forged", csrf)
    a.logout(token)
    assert not a.check(token, csrf)


def test_lockout_after_repeated_failures_and_session_expiry():
    clock = Clock()
    a = Auth("pw", clock=clock)
    for _ in range(auth_mod.MAX_FAILURES):
        assert a.login("guess") is None
    assert a.login("pw") is None  # locked, even with the right password
    clock.t += auth_mod.LOCKOUT_S + 1
    token, csrf = a.login("pw")
    clock.t += auth_mod.SESSION_TTL_S + 1
    assert not a.check(token, csrf)


def test_password_file_must_be_private(tmp_path, monkeypatch):
    monkeypatch.delenv(auth_mod.PASSWORD_ENV, raising=False)
    p = tmp_path / "pw"
    p.write_text("hunter2\n")
    os.chmod(p, 0o644)
    with pytest.raises(ConfigError, match="--password-file.*0644"):
        read_password(str(p))
    os.chmod(p, 0o600)
    assert read_password(str(p)) == "hunter2"
    assert read_password(None) is None
    monkeypatch.setenv(auth_mod.PASSWORD_ENV, "from-env")
    assert read_password(None) == "from-env"


def test_listen_address_parsing_and_loopback_default():
    assert parse_listen("8051") == ("127.0.0.1", 8051)
    assert parse_listen("localhost:8051") == ("localhost", 8051)
    with pytest.raises(ConfigError, match="PORT a number"):
        parse_listen("127.0.0.1:http")
    with pytest.raises(ConfigError, match="outside 0..65535"):
        parse_listen("70000")
    with pytest.raises(ConfigError, match="not a loopback address"):
        bind("0.0.0.0", 0)
    s = bind("127.0.0.1", 0)
    try:
        with pytest.raises(ConfigError, match="cannot listen"):
            bind("127.0.0.1", s.getsockname()[1])
    finally:
        s.close()
