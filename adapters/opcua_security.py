"""Security of the OPC UA server: certificates, policies, users, trusted clients.

Kept apart from the address space (adapters/opcua_space.py) so that each piece can be read on
its own. Everything here configures an `asyncua.Server` before it starts.

- Endpoints: SecurityPolicy None when `[opcua] none_allowed` (default: loopback host only)
  plus every policy of `[opcua.security] policies` (default Basic256Sha256 Sign and
  SignAndEncrypt) with the server certificate. asyncua always accepts a None secure
  channel (clients need one for GetEndpoints), so a session over a None channel is
  refused at ActivateSession when None is not allowed (see `channel_allowed`).
- Users: `[opcua.users]` name = password (plain or a `hil certs --hash-password` hash).
  With users, anonymous sessions are refused unless `allow_anonymous = true`, and then
  they are read-only. No session is ever an asyncua Admin (no address-space edits).
- Trusted clients: with `trusted_clients_dir`, a secure channel's client certificate must
  be one of the certificates in that directory (DER or PEM files), else
  BadCertificateUntrusted; without it any client certificate is accepted.
"""

from __future__ import annotations

import logging
from pathlib import Path

from asyncua import ua
from asyncua.crypto.permission_rules import User, UserRole
from asyncua.server.user_managers import UserManager

from adapters.ratelog import RateLimitedLog
from hil import certs
from hil.tagmap.opcua import OpcuaSection

log = logging.getLogger("hil.opcua")
rlog = RateLimitedLog(log)  # refusals a client can repeat at will (password guessing)


class ConfiguredUsers(UserManager):
    """Username/password check against `[opcua.users]`; anonymous per the section."""

    def __init__(self, section: OpcuaSection):
        self._users = dict(section.users)
        self._anonymous = section.anonymous_allowed

    def get_user(self, iserver, username=None, password=None, certificate=None):
        if username is None:
            if not self._anonymous:
                rlog.warning("anonymous", "refused an anonymous session (users are configured)")
                return None
            return User(role=UserRole.User, name=None)
        stored = self._users.get(username)
        if stored is None or not certs.verify_password(stored, password):
            rlog.warning("user", "refused user %r: unknown user or wrong password", username)
            return None
        return User(role=UserRole.User, name=username)


def policy_types(section: OpcuaSection) -> list:
    out = [ua.SecurityPolicyType.NoSecurity] if section.none_allowed else []
    out += [getattr(ua.SecurityPolicyType, p) for p in section.security.policies]
    return out


def identity_tokens(section: OpcuaSection) -> list[type]:
    tokens: list[type] = []
    if section.anonymous_allowed:
        tokens.append(ua.AnonymousIdentityToken)
    if section.users:
        tokens.append(ua.UserNameIdentityToken)
    return tokens


def _write_certificate(cert, key, cert_path: Path, key_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    cert_path.parent.mkdir(parents=True, exist_ok=True)
    key_path.parent.mkdir(parents=True, exist_ok=True)
    enc = serialization.Encoding.PEM if cert_path.suffix.lower() == ".pem" else serialization.Encoding.DER
    cert_path.write_bytes(cert.public_bytes(enc))
    kenc = serialization.Encoding.PEM if key_path.suffix.lower() != ".der" else serialization.Encoding.DER
    data = key.private_bytes(kenc, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    key_path.touch(mode=0o600, exist_ok=True)
    key_path.write_bytes(data)


def ensure_certificate(section: OpcuaSection) -> tuple[Path, Path] | None:
    """Paths of the server certificate and key, generated if missing and allowed.

    Returns None when no secure policy is configured. Raises RuntimeError (with what to do)
    when the files are missing and generation is off, or when the certificate does not
    carry the configured application URI (clients reject such a server).
    """
    sec = section.security
    if not sec.policies:
        return None
    cert_path, key_path = Path(sec.certificate), Path(sec.private_key)
    if not (cert_path.exists() and key_path.exists()):
        if not sec.generate_missing:
            raise RuntimeError(
                f"OPC UA certificate {cert_path} or key {key_path} is missing: run `hil certs` "
                "or set [opcua.security] generate_missing = true"
            )
        names = certs.default_hostnames()
        if section.host not in names and section.host not in ("0.0.0.0", "::"):
            names.append(section.host)
        cert, key = certs.make_certificate("hil OPC UA server", section.application_uri, names)
        _write_certificate(cert, key, cert_path, key_path)
        log.warning("generated a self-signed OPC UA server certificate %s (key %s)", cert_path, key_path)
    uris = certs.certificate_uris(certs.load_certificate(cert_path))
    if section.application_uri not in uris:
        raise RuntimeError(
            f"OPC UA certificate {cert_path} is for {', '.join(uris) or 'no application URI'}, not "
            f"{section.application_uri!r}: regenerate it (`hil certs --application-uri "
            f"{section.application_uri}`) or set [opcua] application_uri"
        )
    return cert_path, key_path


def load_trusted(directory: str | Path) -> set[bytes]:
    """DER bytes of every certificate file (DER or PEM) in `directory`."""
    from cryptography.hazmat.primitives import serialization

    out: set[bytes] = set()
    d = Path(directory)
    if not d.is_dir():
        raise RuntimeError(f"[opcua.security] trusted_clients_dir {d} is not a directory")
    for p in sorted(d.iterdir()):
        if p.is_file() and p.suffix.lower() in (".der", ".pem", ".crt", ".cer"):
            try:
                out.add(certs.load_certificate(p).public_bytes(serialization.Encoding.DER))
            except ValueError:
                log.warning("ignored %s: not a certificate", p)
    return out


def make_client_validator(directory: str | Path):
    """An asyncua certificate validator accepting only the certificates in `directory`."""
    from asyncua.common.utils import ServiceError
    from cryptography.hazmat.primitives import serialization

    trusted = load_trusted(directory)

    async def validate(cert, app_description) -> None:
        der = cert.public_bytes(serialization.Encoding.DER)
        if der not in trusted:
            uri = getattr(app_description, "ApplicationUri", "?")
            rlog.warning("certificate", "refused client certificate of %s: not in %s", uri, directory)
            raise ServiceError(ua.StatusCodes.BadCertificateUntrusted)

    return validate


async def configure(server, section: OpcuaSection) -> None:
    """Apply endpoints, certificate, identity tokens and client trust to an asyncua Server."""
    server.allow_remote_admin(False)
    server.set_security_policy(policy_types(section))
    server.set_identity_tokens(identity_tokens(section))
    paths = ensure_certificate(section)
    if paths is not None:
        await server.load_certificate(_der_bytes(paths[0]))
        key = paths[1].read_bytes()
        await server.load_private_key(key, format="pem" if key.lstrip().startswith(b"-----BEGIN") else "der")
    if section.security.trusted_clients_dir:
        server.set_certificate_validator(make_client_validator(section.security.trusted_clients_dir))


def _der_bytes(path: Path) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return certs.load_certificate(path).public_bytes(serialization.Encoding.DER)


def channel_allowed(section: OpcuaSection, peer_certificate) -> bool:
    """False for a session over a None secure channel when None is not allowed.

    asyncua gives the peer certificate of a None channel as b"" (and a None channel is the
    only kind without one: Sign and SignAndEncrypt need the client's certificate).
    """
    return section.none_allowed or bool(peer_certificate)
