"""`hil certs`: certificates fit for OPC UA Basic256Sha256, and password hashes."""

import datetime as dt
import ipaddress
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import padding
from cryptography.x509.oid import ExtendedKeyUsageOID

from hil import certs

ROOT = Path(__file__).resolve().parents[2]
HIL = [sys.executable, "-m", "hil.cli"]


def _hil(*args, **kw):
    return subprocess.run(HIL + list(args), cwd=ROOT, capture_output=True, text=True, timeout=120, **kw)


def test_hil_certs_writes_server_and_client_certificates(tmp_path):
    d = tmp_path / "certs"
    out = _hil("certs", "--dir", str(d), "--hostname", "plant-sim.local", "--hostname", "10.1.2.3")
    assert out.returncode == 0, out.stderr
    files = certs.cert_files(d)
    for path in files.all():
        assert str(path) in out.stdout and path.stat().st_size > 0
    for key in (files.server_key_pem, files.client_key_pem):
        assert os.stat(key).st_mode & 0o077 == 0  # private keys: owner only
    server = x509.load_der_x509_certificate(files.server_cert_der.read_bytes())
    assert server == x509.load_pem_x509_certificate(files.server_cert_pem.read_bytes())
    assert server.public_key().key_size == 2048
    assert server.signature_hash_algorithm.name == "sha256"
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == [certs.SERVER_APPLICATION_URI]
    assert {"localhost", "plant-sim.local"} <= set(san.get_values_for_type(x509.DNSName))
    assert {ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("10.1.2.3")} <= set(
        san.get_values_for_type(x509.IPAddress))
    ku = server.extensions.get_extension_for_class(x509.KeyUsage).value
    assert ku.digital_signature and ku.content_commitment and ku.key_encipherment and ku.data_encipherment
    eku = server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert not server.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    now = dt.datetime.now(dt.timezone.utc)
    assert server.not_valid_before_utc <= now < server.not_valid_after_utc
    # self-signed: the certificate verifies with its own key
    server.public_key().verify(server.signature, server.tbs_certificate_bytes, padding.PKCS1v15(),
                               server.signature_hash_algorithm)
    client = certs.load_certificate(files.client_cert_pem)
    assert certs.certificate_uris(client) == [certs.CLIENT_APPLICATION_URI]
    assert client.public_key() != server.public_key()


def test_keep_preserves_existing_pairs(tmp_path):
    assert _hil("certs", "--dir", str(tmp_path), "--no-client").returncode == 0
    first = (tmp_path / certs.SERVER_CERT_DER).read_bytes()
    assert not (tmp_path / certs.CLIENT_CERT_DER).exists()
    assert _hil("certs", "--dir", str(tmp_path), "--keep").returncode == 0
    assert (tmp_path / certs.SERVER_CERT_DER).read_bytes() == first
    assert (tmp_path / certs.CLIENT_CERT_DER).exists()
    assert _hil("certs", "--dir", str(tmp_path)).returncode == 0
    assert (tmp_path / certs.SERVER_CERT_DER).read_bytes() != first


def test_hash_password_round_trip():
    out = _hil("certs", "--hash-password", input="correct horse\ncorrect horse\n")
    assert out.returncode == 0, out.stderr
    stored = out.stdout.strip().splitlines()[-1]
    assert stored.startswith("pbkdf2-sha256$") and "correct horse" not in stored
    assert certs.verify_password(stored, "correct horse")
    assert not certs.verify_password(stored, "correct horse ")
    assert not certs.verify_password(stored, None)
    assert certs.verify_password("plain", "plain") and not certs.verify_password("plain", "Plain")
    assert certs.hash_password("x") != certs.hash_password("x")  # salted
    with pytest.raises(ValueError):
        certs.parse_password_hash("pbkdf2-sha256$1$AA==$AA==")
