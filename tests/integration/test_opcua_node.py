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
            {"op": "write", "nodeId": _nid("actuator", ACT.name), "dataType": "Float", "value": good},
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
        deadline = time.monotonic() + 20
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), proc.stderr.read() if proc.poll() is not None else "not subscribed in time"
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
