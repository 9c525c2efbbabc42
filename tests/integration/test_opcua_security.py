"""OPC UA security: endpoints, Basic256Sha256 Sign/SignAndEncrypt, users, trusted clients.

asyncua client against hil's server process; certificates from hil.certs (`hil certs`).
"""

import asyncio

import pytest
from asyncua import Client, ua
from asyncua.crypto.security_policies import SecurityPolicyBasic256Sha256
from asyncua.ua.uaerrors import UaError

from hil import certs
from hil.certs import CLIENT_APPLICATION_URI, hash_password
from tests.integration import opcua_helpers as H

SPEC = H.spec()
ACT = SPEC.inputs[0]
pytestmark = pytest.mark.timeout(120)
SIGN, ENCRYPT = ua.MessageSecurityMode.Sign, ua.MessageSecurityMode.SignAndEncrypt


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    files = certs.generate_certs(d / "certs")
    trusted = d / "trusted"
    trusted.mkdir()
    (trusted / "client.der").write_bytes(files.client_cert_der.read_bytes())
    # a client with a valid certificate that the server was not told to trust
    cert, key = certs.make_certificate("stranger", "urn:stranger", ["localhost"])
    from adapters.opcua_security import _write_certificate

    _write_certificate(cert, key, d / "stranger.der", d / "stranger_key.pem")
    return {"files": files, "trusted": trusted, "stranger": (d / "stranger.der", d / "stranger_key.pem"), "dir": d}


def _security(files, **extra):
    return {"certificate": str(files.server_cert_der), "private_key": str(files.server_key_pem), **extra}


@pytest.fixture(scope="module")
def server(pki, tmp_path_factory):
    opcua = {
        "users": {"operator": hash_password("s3cret"), "viewer": "plain-pw"},
        "security": _security(pki["files"], allow_none=False, allow_anonymous=True,
                              trusted_clients_dir=str(pki["trusted"])),
    }
    srv = H.OpcuaServer(H.scenario_data(H.free_port(), opcua=opcua), tmp_path_factory.mktemp("sec"))
    srv.publish()
    try:
        yield srv
    finally:
        assert srv.stop() == 0, srv.log()


async def _client(srv, pki, mode=ENCRYPT, user=None, password=None, cert=None):
    files = pki["files"]
    c = Client(srv.url, timeout=10)
    c.application_uri = CLIENT_APPLICATION_URI if cert is None else "urn:stranger"
    cert_path, key_path = cert or (files.client_cert_der, files.client_key_pem)
    if mode is not None:
        await c.set_security(SecurityPolicyBasic256Sha256, certificate=str(cert_path), private_key=str(key_path),
                             server_certificate=str(files.server_cert_der), mode=mode)
    if user is not None:
        c.set_user(user)
        c.set_password(password)
    return c


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def _actuator():
    return ua.NodeId(f"{H.node_ids()['actuator']}{ACT.name}", 2)


async def _write(c, value) -> str:
    params = ua.WriteParameters()
    wv = ua.WriteValue()
    wv.NodeId, wv.AttributeId = _actuator(), ua.AttributeIds.Value
    wv.Value = ua.DataValue(ua.Variant(value, ua.VariantType.Double))
    params.NodesToWrite = [wv]
    return (await c.uaclient.write(params))[0].name


async def _refused(c) -> str:
    try:
        await c.connect()
    except (UaError, OSError, asyncio.TimeoutError) as exc:
        return type(exc).__name__
    await c.disconnect()
    return "connected"


def test_endpoints_offer_only_secure_policies_and_the_configured_tokens(server, pki):
    async def go():
        c = Client(server.url, timeout=10)
        eps = await c.connect_and_get_server_endpoints()
        modes = {(e.SecurityPolicyUri.rsplit("#", 1)[-1], e.SecurityMode) for e in eps}
        assert modes == {("Basic256Sha256", SIGN), ("Basic256Sha256", ENCRYPT)}
        tokens = {t.TokenType for e in eps for t in e.UserIdentityTokens}
        assert tokens == {ua.UserTokenType.Anonymous, ua.UserTokenType.UserName}
        assert all(e.ServerCertificate == pki["files"].server_cert_der.read_bytes() for e in eps)
        assert {e.Server.ApplicationUri for e in eps} == {certs.SERVER_APPLICATION_URI}

    run(go())


def test_a_session_over_security_none_is_refused(server, pki, monkeypatch):
    async def go(user, password):
        return await _refused(await _client(server, pki, mode=None, user=user, password=password))

    # asyncua's client sees no None endpoint and gives up by itself
    assert run(go("operator", "s3cret")) == "UaError"
    # A client that ignores the endpoint list may open a None channel (clients need one for
    # GetEndpoints), but the server refuses to activate a session over it.
    monkeypatch.setattr(Client, "find_endpoint", staticmethod(lambda endpoints, mode, uri: endpoints[0]))
    assert run(go(None, None)) == "BadSecurityModeRejected"


@pytest.mark.parametrize("mode, user, password", [(ENCRYPT, "operator", "s3cret"), (SIGN, "viewer", "plain-pw")])
def test_users_write_over_signed_channels(server, pki, mode, user, password):
    value = ACT.low + (0.2 if mode == ENCRYPT else 0.4) * (ACT.high - ACT.low)

    async def go():
        async with await _client(server, pki, mode, user, password) as c:
            assert c.security_policy.Mode == mode
            ual = await c.get_node(_actuator()).read_attribute(ua.AttributeIds.UserAccessLevel)
            assert ual.Value.Value == 3
            return await _write(c, value)

    assert run(go()) == "Good"
    assert server.image.read_inputs()[server.input_index(ACT.name)] == value


def test_wrong_password_and_unknown_user_are_refused(server, pki):
    async def go(user, pw):
        return await _refused(await _client(server, pki, ENCRYPT, user, pw))

    assert run(go("operator", "wrong")) == "BadUserAccessDenied"
    assert run(go("nobody", "s3cret")) == "BadUserAccessDenied"


def test_anonymous_sessions_are_read_only_when_users_exist(server, pki):
    before = server.image.read_inputs()

    async def go():
        async with await _client(server, pki, ENCRYPT) as c:
            node = c.get_node(_actuator())
            value = await node.read_value()
            levels = [(await node.read_attribute(a)).Value.Value
                      for a in (ua.AttributeIds.AccessLevel, ua.AttributeIds.UserAccessLevel)]
            assert levels == [3, 1]  # writable node, but not for this session
            return value, await _write(c, ACT.low)

    value, code = run(go())
    assert value == before[server.input_index(ACT.name)]
    assert code == "BadUserAccessDenied"
    assert (server.image.read_inputs() == before).all()


def test_an_untrusted_client_certificate_is_refused(server, pki):
    async def go():
        return await _refused(await _client(server, pki, ENCRYPT, "operator", "s3cret", cert=pki["stranger"]))

    assert run(go()) == "BadCertificateUntrusted"


def test_anonymous_is_refused_unless_allowed(pki, tmp_path):
    opcua = {"users": {"operator": "pw"}, "security": _security(pki["files"])}
    srv = H.OpcuaServer(H.scenario_data(H.free_port(), opcua=opcua), tmp_path)
    try:
        async def go(user, pw, mode):
            return await _refused(await _client(srv, pki, mode, user, pw))

        assert run(go(None, None, ENCRYPT)) == "BadIdentityTokenRejected"
        # loopback: None is allowed by default, and a user may log in over it
        assert run(go("operator", "pw", None)) == "connected"
    finally:
        assert srv.stop() == 0, srv.log()


def test_missing_certificates_are_generated_for_the_configured_uri(tmp_path):
    uri = "urn:example:plant-sim"
    opcua = {"application_uri": uri, "security": {"allow_none": False}}
    srv = H.OpcuaServer(H.scenario_data(H.free_port(), opcua=opcua), tmp_path)
    try:
        cert = tmp_path / "certs" / "server_cert.der"
        assert cert.exists() and (tmp_path / "certs" / "server_key.pem").stat().st_mode & 0o077 == 0
        assert certs.certificate_uris(certs.load_certificate(cert)) == [uri]
    finally:
        assert srv.stop() == 0, srv.log()
