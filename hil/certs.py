"""Certificates and password hashes for the OPC UA server (`hil certs`).

OPC UA secures a channel with the application instance certificates of both ends
(Basic256Sha256: RSA 2048..4096, SHA-256 signatures). `generate_certs(dir)` writes a
self-signed server certificate and a client certificate for tests and tools:

    <dir>/server_cert.der   server certificate, DER (what OPC UA puts on the wire; asyncua
                            loads it, node-opcua and UaExpert trust lists take it as is)
    <dir>/server_cert.pem   the same certificate, PEM
    <dir>/server_key.pem    server private key, PKCS#8 PEM, unencrypted, mode 0600
    <dir>/client_cert.der   client certificate (URI `CLIENT_APPLICATION_URI`), DER
    <dir>/client_cert.pem   the same, PEM (node-opcua `certificateFile`)
    <dir>/client_key.pem    client private key, PKCS#8 PEM, mode 0600

Both certificates follow OPC 10000-6 6.2.2: subjectAltName holds the application URI and
the host names / IP addresses the server is reached by (default: localhost, 127.0.0.1,
::1 and this machine's hostname); keyUsage digitalSignature, nonRepudiation,
keyEncipherment, dataEncipherment and, being self-signed, keyCertSign; extendedKeyUsage
serverAuth and clientAuth; basicConstraints cA = FALSE.

Passwords of OPC UA users may be stored hashed in the scenario (`[opcua.users]`):
`hash_password("secret")` -> "pbkdf2-sha256$<iterations>$<salt b64>$<hash b64>";
`verify_password(stored, candidate)` accepts such a hash or a plain-text password.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import ipaddress
import os
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path

SERVER_APPLICATION_URI = "urn:hil:opcua:server"
CLIENT_APPLICATION_URI = "urn:hil:opcua:client"
DEFAULT_DIR = "certs"
DEFAULT_HOSTNAMES = ("localhost", "127.0.0.1", "::1")
SERVER_CERT_DER = "server_cert.der"
SERVER_CERT_PEM = "server_cert.pem"
SERVER_KEY_PEM = "server_key.pem"
CLIENT_CERT_DER = "client_cert.der"
CLIENT_CERT_PEM = "client_cert.pem"
CLIENT_KEY_PEM = "client_key.pem"

HASH_PREFIX = "pbkdf2-sha256"
HASH_ITERATIONS = 200_000


@dataclass(frozen=True)
class CertFiles:
    """Paths written by `generate_certs`."""

    server_cert_der: Path
    server_cert_pem: Path
    server_key_pem: Path
    client_cert_der: Path
    client_cert_pem: Path
    client_key_pem: Path

    def all(self) -> tuple[Path, ...]:
        return (
            self.server_cert_der,
            self.server_cert_pem,
            self.server_key_pem,
            self.client_cert_der,
            self.client_cert_pem,
            self.client_key_pem,
        )


def cert_files(directory: str | Path) -> CertFiles:
    d = Path(directory)
    return CertFiles(
        d / SERVER_CERT_DER,
        d / SERVER_CERT_PEM,
        d / SERVER_KEY_PEM,
        d / CLIENT_CERT_DER,
        d / CLIENT_CERT_PEM,
        d / CLIENT_KEY_PEM,
    )


def default_hostnames() -> list[str]:
    names = list(DEFAULT_HOSTNAMES)
    host = socket.gethostname()
    if host and host not in names:
        names.append(host)
    return names


def _san_entries(application_uri: str, hostnames) -> list:
    from cryptography import x509

    entries: list = [x509.UniformResourceIdentifier(application_uri)]
    seen: set[str] = set()
    for name in hostnames:
        name = name.strip()
        if not name or name in seen:
            continue
        seen.add(name)
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return entries


def make_certificate(
    common_name: str,
    application_uri: str,
    hostnames,
    days: int = 1825,
    key_size: int = 2048,
    organization: str = "hil",
):
    """A self-signed OPC UA application instance certificate and its RSA key.

    Returns (certificate, private_key) as `cryptography` objects. `days`: validity from now
    (minus one hour of clock slack); `key_size`: RSA modulus bits (Basic256Sha256 allows
    2048..4096).
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if not 2048 <= key_size <= 4096:
        raise ValueError(f"key_size {key_size}: Basic256Sha256 needs 2048..4096 bits")
    if days < 1:
        raise ValueError(f"days {days}: a certificate must be valid for at least a day")
    key = rsa.generate_private_key(public_exponent=65537, key_size=key_size)
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization),
        ]
    )
    now = dt.datetime.now(dt.timezone.utc)
    public = key.public_key()
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(_san_entries(application_uri, hostnames)), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=True,  # nonRepudiation
                key_encipherment=True,
                data_encipherment=True,
                key_agreement=False,
                key_cert_sign=True,  # self-signed: the key verifies its own certificate
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public), critical=False)
    )
    return builder.sign(private_key=key, algorithm=hashes.SHA256()), key


def _write(path: Path, data: bytes, private: bool = False) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _write_pair(cert, key, der: Path, pem: Path, key_pem: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    _write(der, cert.public_bytes(serialization.Encoding.DER))
    _write(pem, cert.public_bytes(serialization.Encoding.PEM))
    _write(
        key_pem,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        private=True,
    )


def generate_certs(
    directory: str | Path = DEFAULT_DIR,
    hostnames=None,
    server_uri: str = SERVER_APPLICATION_URI,
    client_uri: str = CLIENT_APPLICATION_URI,
    days: int = 1825,
    key_size: int = 2048,
    overwrite: bool = True,
    client: bool = True,
) -> CertFiles:
    """Write the server (and client) certificate and keys into `directory` (created).

    With `overwrite=False` an existing server certificate + key pair is kept (and so is an
    existing client pair): only what is missing is generated.
    """
    files = cert_files(directory)
    Path(directory).mkdir(parents=True, exist_ok=True)
    names = list(hostnames) if hostnames else default_hostnames()
    if overwrite or not (files.server_cert_der.exists() and files.server_key_pem.exists()):
        cert, key = make_certificate("hil OPC UA server", server_uri, names, days, key_size)
        _write_pair(cert, key, files.server_cert_der, files.server_cert_pem, files.server_key_pem)
    if client and (overwrite or not (files.client_cert_der.exists() and files.client_key_pem.exists())):
        cert, key = make_certificate("hil OPC UA client", client_uri, names, days, key_size)
        _write_pair(cert, key, files.client_cert_der, files.client_cert_pem, files.client_key_pem)
    return files


def load_certificate(path: str | Path):
    """A certificate from a DER or PEM file (`cryptography` object)."""
    from cryptography import x509

    data = Path(path).read_bytes()
    if data.lstrip().startswith(b"-----BEGIN"):
        return x509.load_pem_x509_certificate(data)
    return x509.load_der_x509_certificate(data)


def certificate_uris(cert) -> list[str]:
    """The URIs of a certificate's subjectAltName (the OPC UA application URI is one)."""
    from cryptography import x509

    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    return list(san.value.get_values_for_type(x509.UniformResourceIdentifier))


# ---------------------------------------------------------------------- passwords


def hash_password(password: str, iterations: int = HASH_ITERATIONS) -> str:
    """PBKDF2-HMAC-SHA256 hash of `password` in the form stored in `[opcua.users]`."""
    if not password:
        raise ValueError("empty password")
    salt = secrets.token_bytes(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    b64 = base64.b64encode
    return f"{HASH_PREFIX}${iterations}${b64(salt).decode()}${b64(digest).decode()}"


def is_password_hash(stored: str) -> bool:
    return stored.startswith(HASH_PREFIX + "$")


def parse_password_hash(stored: str) -> tuple[int, bytes, bytes]:
    """(iterations, salt, digest) of a stored hash; ValueError if it is malformed."""
    parts = stored.split("$")
    if len(parts) != 4 or parts[0] != HASH_PREFIX:
        raise ValueError(f"expected {HASH_PREFIX}$<iterations>$<salt b64>$<hash b64>")
    try:
        iterations = int(parts[1])
        salt = base64.b64decode(parts[2], validate=True)
        digest = base64.b64decode(parts[3], validate=True)
    except ValueError as exc:
        raise ValueError(f"malformed password hash ({exc})") from None
    if iterations < 1000 or not salt or len(digest) != 32:
        raise ValueError("password hash needs >= 1000 iterations, a salt and a 32-byte digest")
    return iterations, salt, digest


def verify_password(stored: str, candidate: str | None) -> bool:
    """True if `candidate` matches `stored` (a hash from `hash_password`, or plain text)."""
    if candidate is None:
        return False
    if is_password_hash(stored):
        iterations, salt, digest = parse_password_hash(stored)
        got = hashlib.pbkdf2_hmac("sha256", candidate.encode(), salt, iterations)
        return hmac.compare_digest(got, digest)
    return hmac.compare_digest(stored.encode(), candidate.encode())
