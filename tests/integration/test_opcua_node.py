"""hil's OPC UA server seen by node-opcua, an OPC UA stack we did not write.

Runs tests/node/client.js (see its header for the request format). Skipped only when
node-opcua is not installed (`npm ci --prefix tests/node`; CI installs it).
"""

import json
import subprocess
import threading
import time

import numpy as np
import pytest

from hil import certs
from hil.certs import hash_password
from hil.tagmap.opcua import UNECE_CODES, unece_unit_id
from tests.integration import opcua_helpers as H

_skip = H.node_available()
pytestmark = [pytest.mark.skipif(_skip is not None, reason=_skip or ""), pytest.mark.timeout(180)]

SPEC = H.spec()
ACT = SPEC.inputs[0]
SENSOR = SPEC.outputs[1]
NS_URI = f"urn:hil:{H.SCENARIO}"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("node")
    files = certs.generate_certs(d / "certs")
    opcua = {"users": {"operator": hash_password("s3cret")},
             "security": {"allow_anonymous": True, "certificate": str(files.server_cert_der),
                          "private_key": str(files.server_key_pem)}}
    srv = H.OpcuaServer(H.scenario_data(H.free_port(), opcua=opcua), d / "server")
    srv.publish()
    try:
        yield srv, files, d
    finally:
        assert srv.stop() == 0, srv.log()


def _nid(kind: str, name: str) -> str:
    return f"ns=2;s={H.node_ids()[kind]}{name}"


def _secure(files, tmp, mode="SignAndEncrypt"):
    """Client certificate from `hil certs`; our server certificate put in node-opcua's trust list."""
    return {"mode": mode, "policy": "Basic256Sha256", "cert": str(files.client_cert_pem),
            "key": str(files.client_key_pem), "pki": str(tmp), "trust": [str(files.server_cert_der)]}


def test_browse_and_read_units_and_ranges(setup):
    srv, _, _ = setup
    res = H.run_node({"url": srv.url, "actions": [{"op": "browse", "namespaceUri": NS_URI, "scenario": H.SCENARIO}]})
    assert res["ok"], res
    assert res["securityMode"] == "None"  # allowed on loopback
    folders = res["results"][0]["folders"]
    assert set(folders) == {"Sensors", "Actuators", "Applied", "Status"}
    sensors = {n["name"]: n for n in folders["Sensors"]}
    assert list(sensors) == list(SPEC.names("outputs"))
    for q in SPEC.outputs:
        n = sensors[q.name]
        assert n["dataType"] == "Double" and n["accessLevel"] == 1 and n["statusCode"] == "Good"
        assert n["value"] == pytest.approx(q.nominal) and n["sourceTimestamp"]
        assert n["euRange"] == {"low": q.low, "high": q.high}
        eu = n["engineeringUnits"]
        code = UNECE_CODES.get(q.unit, (None,))[0]
        assert eu["displayName"] == q.unit and eu["unitId"] == (unece_unit_id(code) if code else -1)
    act = {n["name"]: n for n in folders["Actuators"]}
    assert list(act) == list(SPEC.names("inputs"))  # all "plc" in this scenario
    assert act[ACT.name]["accessLevel"] == 3 and act[ACT.name]["euRange"] == {"low": ACT.low, "high": ACT.high}
    assert act[ACT.name]["userAccessLevel"] == 1  # anonymous while users exist: read-only
    assert [n["name"] for n in folders["Status"]] == ["Step", "SimTime", "LoopState", "AcceptedWrites",
                                                      "RejectedWrites"]


def test_write_over_sign_and_encrypt_with_a_username(setup, tmp_path):
    srv, files, _ = setup
    good = ACT.low + 0.25 * (ACT.high - ACT.low)
    before = srv.image.read_inputs()
    res = H.run_node({
        "url": srv.url, "security": _secure(files, tmp_path), "user": {"name": "operator", "password": "s3cret"},
        "actions": [
            {"op": "write", "nodeId": _nid("actuator", ACT.name), "dataType": "Double", "value": good},
            {"op": "write", "nodeId": _nid("actuator", ACT.name), "dataType": "Double", "value": ACT.high + 1.0},
            {"op": "write", "nodeId": _nid("actuator", ACT.name), "dataType": "String", "value": "0.1"},
            {"op": "write", "nodeId": _nid("sensor", SENSOR.name), "dataType": "Double", "value": SENSOR.nominal},
            {"op": "read", "nodeIds": [_nid("actuator", ACT.name)]},
        ]})
    assert res["ok"], res
    assert res["securityMode"] == "SignAndEncrypt" and res["securityPolicy"].endswith("#Basic256Sha256")
    codes = [r["statusCode"] for r in res["results"][:4]]
    assert codes == ["Good", "BadOutOfRange", "BadTypeMismatch", "BadNotWritable"]
    assert res["results"][4]["values"][0]["value"] == good
    after = srv.image.read_inputs()
    i = srv.input_index(ACT.name)
    assert after[i] == good
    np.testing.assert_array_equal(np.delete(after, i), np.delete(before, i))


def test_sign_only_and_bad_credentials(setup, tmp_path):
    srv, files, _ = setup
    ok = H.run_node({"url": srv.url, "security": _secure(files, tmp_path / "a", "Sign"),
                     "user": {"name": "operator", "password": "s3cret"},
                     "actions": [{"op": "read", "nodeIds": [_nid("status", "LoopState")]}]})
    assert ok["ok"] and ok["securityMode"] == "Sign", ok
    bad = H.run_node({"url": srv.url, "security": _secure(files, tmp_path / "b"),
                      "user": {"name": "operator", "password": "nope"}, "actions": []})
    assert not bad["ok"] and "BadUserAccessDenied" in bad["error"]
    # anonymous may read (allow_anonymous) but not write while users exist
    anon = H.run_node({"url": srv.url, "actions": [
        {"op": "write", "nodeId": _nid("actuator", ACT.name), "dataType": "Double", "value": ACT.low}]})
    assert anon["ok"] and anon["results"][0]["statusCode"] == "BadUserAccessDenied"


def test_server_certificate_must_be_trusted(setup, tmp_path):
    srv, files, _ = setup
    sec = _secure(files, tmp_path)
    sec["trust"] = []  # node-opcua does not know our certificate and does not auto-accept
    res = H.run_node({"url": srv.url, "security": sec, "user": {"name": "operator", "password": "s3cret"},
                      "actions": [], "timeoutMs": 15000})
    assert not res["ok"] and "BadCertificateUntrusted" in res["error"], res


@pytest.mark.parametrize("requested_ms", [10, 1])
def test_subscription_at_10ms(setup, tmp_path, requested_ms):
    srv, _, _ = setup
    q = SENSOR
    values = list(np.linspace(q.low + 0.1 * (q.high - q.low), q.high, 300))
    out = SPEC.nominal("outputs")
    out[1] = q.low
    srv.publish(out, step=1)
    ready = tmp_path / "subscribed"
    req = {"url": srv.url, "timeoutMs": 30000, "actions": [{
        "op": "subscribe", "nodeIds": [_nid("sensor", q.name)], "publishingInterval": requested_ms,
        "samplingInterval": requested_ms, "queueSize": 1000, "durationMs": 2500, "readyFile": str(ready)}]}
    proc = subprocess.Popen(["node", str(H.NODE_CLIENT), json.dumps(req)], cwd=H.NODE_DIR,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        from hil import readiness  # by handshake: as long as the client lives and makes progress

        why = readiness.wait_ready(ready.exists, [proc.pid], lambda: proc.poll() is None, poll_s=0.05)
        assert why is None, proc.stderr.read() if proc.poll() is not None else f"not subscribed: {why}"
        time.sleep(0.2)
        pub = threading.Thread(target=_ramp, args=(srv, values))
        pub.start()
        pub.join(10)
        stdout, stderr = proc.communicate(timeout=40)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    res = json.loads(stdout.strip().splitlines()[-1])
    assert res["ok"], (res, stderr[-2000:])
    sub = res["results"][0]
    assert sub["revisedPublishingInterval"] == 10
    got = [n["value"] for n in sub["notifications"][_nid("sensor", q.name)]]
    ramp = [v for v in got if v != q.low]  # the value before the ramp comes first
    assert ramp and ramp[-1] == values[-1]
    assert set(ramp) <= set(values) and ramp == sorted(ramp)


def _ramp(srv, values, period_s=0.001):
    out = SPEC.nominal("outputs")
    t0 = time.monotonic()
    for k, v in enumerate(values):
        out[1] = v
        srv.publish(out, step=100 + k, sim_time_s=float(k))
        delay = t0 + (k + 1) * period_s - time.monotonic()
        if delay > 0:
            time.sleep(delay)


# ---------------------------------------------------------------------------- data types, names


def _plc_config_nodes() -> list[dict]:
    """[[opcua.nodes]] of the shipped reference PLC scenario (configs/bioreactor_plc.toml)."""
    import tomllib

    with open(H.ROOT / "configs" / "bioreactor_plc.toml", "rb") as fh:
        return tomllib.load(fh)["opcua"].get("nodes", [])


FLOAT_ACT, BOOL_ACT, INT_ACT = (SPEC.quantity("inputs", n) for n in ("agitation_power", "coolant_flow", "heating_flow"))


@pytest.fixture(scope="module")
def typed(tmp_path_factory):
    """No users, loopback (anonymous may write); typed actuators as a PLC would declare them,
    and the reference PLC scenario's node overrides (DO with a display name)."""
    d = tmp_path_factory.mktemp("typed")
    nodes = _plc_config_nodes() + [{"signal": FLOAT_ACT.name, "data_type": "Float"},
                                   {"signal": BOOL_ACT.name, "data_type": "Boolean"},
                                   {"signal": INT_ACT.name, "data_type": "Int32"}]
    srv = H.OpcuaServer(H.scenario_data(H.free_port(), opcua={"nodes": nodes}), d / "server")
    srv.publish()
    try:
        yield srv
    finally:
        assert srv.stop() == 0, srv.log()


def test_writes_with_explicit_variant_types_reach_the_image(typed):
    """REAL (Float), DINT (Int32) and BOOL (Boolean) writes from node-opcua, into nodes of
    another or the same data type: the image holds what the node's type holds."""
    srv = typed
    real = 0.15625  # exactly a float32
    res = H.run_node({"url": srv.url, "actions": [
        {"op": "write", "nodeId": _nid("actuator", ACT.name), "dataType": "Float", "value": real},  # Double node
        {"op": "write", "nodeId": _nid("actuator", FLOAT_ACT.name), "dataType": "Double", "value": 12.3},
        {"op": "write", "nodeId": _nid("actuator", INT_ACT.name), "dataType": "Int32", "value": 42},
        {"op": "write", "nodeId": _nid("actuator", BOOL_ACT.name), "dataType": "Boolean", "value": True},
        {"op": "write", "nodeId": _nid("actuator", "aeration_rate"), "dataType": "Int32", "value": 9},  # Double node
        {"op": "write", "nodeId": _nid("actuator", INT_ACT.name), "dataType": "Double", "value": 2.5},
        {"op": "write", "nodeId": _nid("actuator", FLOAT_ACT.name), "dataType": "Boolean", "value": True},
        {"op": "read", "nodeIds": [_nid("actuator", FLOAT_ACT.name), _nid("actuator", BOOL_ACT.name)]},
    ]})
    assert res["ok"], res
    codes = [r["statusCode"] for r in res["results"][:7]]
    assert codes == ["Good"] * 5 + ["BadTypeMismatch", "BadTypeMismatch"]
    u = srv.image.read_inputs()
    i = srv.input_index
    f32 = float(np.float32(12.3))
    assert u[i(ACT.name)] == real and u[i("aeration_rate")] == 9.0
    assert u[i(FLOAT_ACT.name)] == f32 != 12.3  # the Float node holds float32(12.3)
    assert u[i(INT_ACT.name)] == 42.0  # the refused 2.5 changed nothing
    assert u[i(BOOL_ACT.name)] == BOOL_ACT.high  # True = the high end of the EU range
    values = res["results"][7]["values"]
    assert values[0]["dataType"] == "Float" and values[0]["value"] == pytest.approx(f32, rel=1e-7)
    assert values[1]["dataType"] == "Boolean" and values[1]["value"] is True


def test_translate_browse_path_by_signal_name(typed):
    """Objects/<scenario>/Sensors/dissolved_oxygen resolves to the node id of the same name,
    with the reference PLC scenario's overrides (its DisplayName is "DO")."""
    assert any(n["signal"] == "dissolved_oxygen" for n in _plc_config_nodes())
    res = H.run_node({"url": typed.url, "actions": [
        {"op": "translate", "namespaceUri": NS_URI, "path": [H.SCENARIO, "Sensors", "dissolved_oxygen"]},
        {"op": "translate", "namespaceUri": NS_URI, "path": [H.SCENARIO, "Actuators", "agitation_power"]},
        {"op": "translate", "namespaceUri": NS_URI, "path": [H.SCENARIO, "Sensors", "DO"]},
    ]})
    assert res["ok"], res
    do, agit, label = res["results"]
    assert do["statusCode"] == "Good" and do["nodeId"] == _nid("sensor", "dissolved_oxygen")
    assert do["displayName"] == "DO"
    assert agit["nodeId"] == _nid("actuator", "agitation_power")
    assert label["statusCode"] == "BadNoMatch"  # the display name is not a browse name
