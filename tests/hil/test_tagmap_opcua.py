"""[opcua] section: defaults, security rules, node overrides, and errors with key paths."""

import pytest

from hil.certs import hash_password
from hil.scenario.config import Scenario, parse_scenario
from hil.errors import ConfigError
from hil.tagmap.opcua import OpcuaSection, resolve_nodes, unece_unit_id
from plants.spec import PlantSpec, Quantity

Q = Quantity
SPEC = PlantSpec(
    name="uatank",
    states=(Q("level", "%", 0.0, 0.0, 100.0),),
    inputs=(
        Q("inflow", "L/min", 0.0, 0.0, 20.0, "feed pump"),
        Q("heater", "kW", 0.0, 0.0, 5.0, "heater power"),
        Q("valve", "%", 0.0, 0.0, 100.0, "policy valve"),
        Q("pump", "1", 0.0, 0.0, 1.0, "pump on/off"),
    ),
    outputs=(
        Q("level", "%", 0.0, 0.0, 100.0, "tank level"),
        Q("temperature", "K", 300.0, 250.0, 400.0, "tank temperature"),
        Q("odd", "furlong/fortnight", 0.0, 0.0, 1e6, "no UN/ECE code"),
    ),
    params=(Q("tau", "s", 2.0, 0.1, 100.0),),
)


def _scenario(**opcua):
    data = {
        "scenario": {"name": "tank"},
        "plant": {"model": "uatank"},
        "loop": {"step_s": 0.1, "duration_s": 1.0},
        "inputs": {"valve": {"driver": "bus"}, "heater": {"driver": "fixed", "value": 1.0}},
        "opcua": opcua,
    }
    sc = Scenario.model_validate(data)  # the section is validated on its own below
    return sc.model_copy(update={"opcua": OpcuaSection.model_validate(opcua)})


def _problems(**opcua) -> dict[str, str]:
    sc = _scenario(**opcua)
    return dict(sc.opcua.validate_against(SPEC, sc))


def test_defaults_serve_outputs_as_sensors_and_plc_inputs_as_actuators():
    sc = _scenario()
    sec = sc.opcua
    assert (sec.host, sec.port, sec.min_publishing_interval_ms) == ("127.0.0.1", 4840, 10.0)
    assert sec.endpoint_url() == "opc.tcp://127.0.0.1:4840/hil"
    assert sec.namespace("tank") == "urn:hil:tank"
    assert sec.none_allowed and sec.anonymous_allowed
    assert sec.security.policies == ("Basic256Sha256_Sign", "Basic256Sha256_SignAndEncrypt")
    nodes = resolve_nodes(sec, SPEC, sc)
    by_kind = {k: [n.signal for n in nodes if n.kind == k] for k in ("sensor", "actuator", "applied")}
    # heater is driven by "fixed", valve by "bus": not actuators, but every input is in Applied
    assert by_kind == {"sensor": ["level", "temperature", "odd"], "actuator": ["inflow", "pump"],
                       "applied": ["inflow", "heater", "valve", "pump"]}
    inflow = next(n for n in nodes if n.kind == "actuator" and n.signal == "inflow")
    assert inflow.writable and (inflow.eu_low, inflow.eu_high) == (0.0, 20.0)
    assert inflow.unece_code == "L2" and inflow.unit_id == unece_unit_id("L2") == 19506
    assert all(not n.writable for n in nodes if n.kind != "actuator")
    odd = next(n for n in nodes if n.signal == "odd")
    assert odd.unece_code is None and odd.unit_id == -1 and odd.unit == "furlong/fortnight"


def test_unit_ids_match_the_opc_foundation_table():
    # values from OPC Foundation UNECE_to_OPCUA.csv
    assert unece_unit_id("GL") == 18252 and unece_unit_id("KEL") == 4932940
    assert unece_unit_id("CEL") == 4408652 and unece_unit_id("2A") == 12865


def test_overrides_apply():
    sc = _scenario(nodes=[
        {"signal": "level", "display_name": "LT-101", "data_type": "Float", "eu_range": [10.0, 90.0],
         "unit": "percent", "unece_code": "P1", "description": "level transmitter"},
        {"signal": "pump", "data_type": "Boolean"},
        {"signal": "inflow", "writable": False},
        {"signal": "temperature", "enabled": False},
    ])
    nodes = {(n.kind, n.signal): n for n in resolve_nodes(sc.opcua, SPEC, sc)}
    lt = nodes[("sensor", "level")]
    assert (lt.browse_name, lt.display_name, lt.data_type, lt.eu_low, lt.eu_high) == (
        "level", "LT-101", "Float", 10.0, 90.0)
    assert (lt.unit, lt.unece_code, lt.unit_id, lt.description) == ("percent", "P1", 20529, "level transmitter")
    assert nodes[("actuator", "pump")].data_type == "Boolean" and nodes[("actuator", "pump")].writable
    assert not nodes[("actuator", "inflow")].writable
    assert ("sensor", "temperature") not in nodes


@pytest.mark.parametrize(
    "nodes, path, reason",
    [
        ([{"signal": "levle"}], "opcua.nodes[0].signal", "uatank has no output or input 'levle'"),
        ([{"signal": "level", "writable": True}], "opcua.nodes[0].writable", "sensors are read-only"),
        ([{"signal": "valve"}], "opcua.nodes[0].signal", "driven by 'bus'"),
        ([{"signal": "level", "eu_range": [-5.0, 50.0]}], "opcua.nodes[0].eu_range",
         "outside the physical bounds [0.0, 100.0] %"),
        ([{"signal": "odd", "data_type": "Int16"}], "opcua.nodes[0].data_type", "Int16 cannot hold"),
        ([{"signal": "level"}, {"signal": "level"}], "opcua.nodes[1].signal", "already has an entry"),
        ([{"signal": "level", "browse_name": "LT-101"}], "opcua.nodes[0].browse_name",
         "the browse name is derived from the signal name 'level' ('level': one name in browse path and "
         "node id); for a different label use display_name = 'LT-101'"),
    ],
)
def test_invalid_nodes_name_their_key_path(nodes, path, reason):
    problems = _problems(nodes=nodes)
    assert path in problems, problems
    assert reason in problems[path]


def test_schema_errors_name_their_key_path_through_parse_scenario():
    from plants.base import load_plant_module

    spec = load_plant_module("bioreactor").SPEC
    sensor, actuator = spec.outputs[0].name, spec.inputs[0].name
    base = {"scenario": {"name": "b"}, "plant": {"model": "bioreactor"},
            "loop": {"step_s": 1.0, "duration_s": 10.0}}
    with pytest.raises(ConfigError) as info:
        parse_scenario({**base, "opcua": {"port": 70000, "endpoint_path": "hil",
                                           "nodes": [{"signal": sensor, "data_type": "String"}]}})
    problems = dict(info.value.problems)
    assert set(problems) >= {"opcua.port", "opcua.endpoint_path", "opcua.nodes[0].data_type"}
    with pytest.raises(ConfigError) as info:
        parse_scenario({**base, "opcua": {"nodes": [{"signal": sensor, "writable": True},
                                                     {"signal": actuator, "eu_range": [-1.0, 1.0]}]}})
    problems = dict(info.value.problems)
    assert "sensors are read-only" in problems["opcua.nodes[0].writable"]
    assert "outside the physical bounds" in problems["opcua.nodes[1].eu_range"]
    ok = parse_scenario({**base, "opcua": {"port": 4841}})
    assert ok.opcua.port == 4841 and ok.opcua.none_allowed


def test_security_defaults_follow_the_host_and_the_users():
    public = OpcuaSection.model_validate({"host": "0.0.0.0"})
    assert not public.none_allowed  # a non-loopback bind never serves None by default
    assert OpcuaSection.model_validate({"host": "0.0.0.0", "security": {"allow_none": True}}).none_allowed
    assert OpcuaSection.model_validate({"host": "::1"}).none_allowed
    assert OpcuaSection.model_validate({"host": "localhost"}).none_allowed
    with_users = OpcuaSection.model_validate({"users": {"operator": hash_password("pw")}})
    assert not with_users.anonymous_allowed
    opt_in = OpcuaSection.model_validate({"users": {"operator": "pw"}, "security": {"allow_anonymous": True}})
    assert opt_in.anonymous_allowed


@pytest.mark.parametrize(
    "opcua, path, reason",
    [
        ({"host": "0.0.0.0", "security": {"policies": []}}, "opcua.security.policies", "no endpoint left"),
        ({"users": {"op": "pw"}, "security": {"policies": []}}, "opcua.security.policies", "users need"),
        ({"security": {"allow_anonymous": False}}, "opcua.security.allow_anonymous", "nobody could connect"),
        ({"security": {"policies": ["Basic256Sha256_Sign", "Basic256Sha256_Sign"]}}, "opcua.security.policies",
         "listed twice"),
    ],
)
def test_security_contradictions_are_reported(opcua, path, reason):
    problems = _problems(**opcua)
    assert path in problems and reason in problems[path], problems


def test_browse_name_equal_to_the_signal_is_accepted_and_display_name_defaults_to_it():
    assert _problems(nodes=[{"signal": "level", "browse_name": "level"}]) == {}
    nodes = resolve_nodes(_scenario().opcua, SPEC, _scenario())
    assert all(n.browse_name == n.signal == n.display_name for n in nodes)


TRUSTED = {"trusted_clients_dir": "certs/trusted"}


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.10", "::", "plc-gateway.example"])
def test_off_loopback_needs_users_and_trusted_clients(host):
    problems = _problems(host=host)
    assert set(problems) == {"opcua.users", "opcua.security.trusted_clients_dir"}, problems
    assert f"host {host!r} is not a loopback address" in problems["opcua.users"]
    assert "opcua.security.insecure = true" in problems["opcua.users"]
    assert set(_problems(host=host, users={"operator": "pw"})) == {"opcua.security.trusted_clients_dir"}
    assert set(_problems(host=host, security=TRUSTED)) == {"opcua.users"}
    assert _problems(host=host, users={"operator": "pw"}, security=TRUSTED) == {}
    assert _problems(host=host, security={"insecure": True}) == {}


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_loopback_needs_neither(host):
    assert _problems(host=host) == {}


def test_off_loopback_is_refused_by_parse_scenario_naming_the_keys():
    base = {"scenario": {"name": "b"}, "plant": {"model": "bioreactor"},
            "loop": {"step_s": 1.0, "duration_s": 10.0}}
    with pytest.raises(ConfigError) as info:
        parse_scenario({**base, "opcua": {"host": "0.0.0.0"}})
    problems = dict(info.value.problems)
    assert "opcua.users" in problems and "opcua.security.trusted_clients_dir" in problems
    ok = parse_scenario({**base, "opcua": {"host": "0.0.0.0", "security": {"insecure": True}}})
    assert ok.opcua.security.insecure


@pytest.mark.parametrize(
    "opcua, fragment",
    [
        ({"users": {"bad name": "pw"}}, "a user name is"),
        ({"users": {"op": ""}}, "empty password"),
        ({"users": {"op": "pbkdf2-sha256$10$xx$yy"}}, "password hash"),
        ({"security": {"policies": ["Basic128Rsa15"]}}, "Basic256Sha256_Sign"),
        ({"min_publishing_interval_ms": 0.1}, "greater than or equal to 1"),
        ({"nodes": [{"signal": "level", "unece_code": "gram"}]}, "UN/ECE"),
        ({"nodes": [{"signal": "level", "eu_range": [5.0, 5.0]}]}, "low < high"),
        ({"nodes": [{"signal": "level", "display_name": "a/b"}]}, "not a display name"),
        ({"max_connections": 0}, "greater than or equal to 1"),
        ({"idle_timeout_s": -1.0}, "greater than or equal to 0"),
    ],
)
def test_schema_rejects(opcua, fragment):
    with pytest.raises(Exception) as info:
        OpcuaSection.model_validate(opcua)
    assert fragment in str(info.value)
