"""One rule for paths: relative paths in a scenario file resolve against the file's directory,
paths given on the command line (--set) against the cwd; defaults count as in the file."""

import shutil
from pathlib import Path

import pytest

from hil.scenario.config import PATH_KEYS, load_scenario, parse_scenario, resolve_path
from tests.hil.test_config import ROOT


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    d = tmp_path / "elsewhere"
    d.mkdir()
    monkeypatch.chdir(d)
    return d


def test_shipped_configs_find_their_files_from_any_cwd(elsewhere):
    plc = load_scenario(ROOT / "configs/bioreactor_plc.toml")
    assert plc.recording.path == str(ROOT / "runs/{scenario}-plc-{timestamp}")
    assert plc.opcua.security.certificate == str(ROOT / "certs/server_cert.der")
    assert plc.opcua.security.private_key == str(ROOT / "certs/server_key.pem")
    pol = load_scenario(ROOT / "configs/bioreactor_policy.toml")
    assert pol.policy.directory == str(ROOT / "policies/bioreactor")
    assert Path(pol.policy.directory, "v1").is_dir()
    assert pol.safety.decision_log == str(ROOT / "runs/{scenario}-{timestamp}-safety.jsonl")


def test_every_path_key_and_the_defaults_resolve_against_the_scenario_dir(tmp_path, elsewhere):
    scen = tmp_path / "scen dir"
    scen.mkdir()
    text = (ROOT / "configs/bioreactor_plc.toml").read_text()
    text = text.replace('path = "../runs/{scenario}-plc-{timestamp}"', "")  # the default: runs/...
    text = text.replace('certificate = "../certs/server_cert.der"', 'certificate = "pki/cert.der"')
    text = text.replace("[opcua.security]\n", '[opcua.security]\ntrusted_clients_dir = "pki/trusted"\n')
    text = text.replace("[softplc]\n", '[softplc]\nrecord = "logs/scan.csv"\n')
    text = text.replace("[modbus]\n", '[modbus]\nrequest_log = "logs/req.jsonl"\nclient_stats = "/abs/c.json"\n')
    (scen / "s.toml").write_text(text)
    sc = load_scenario(scen / "s.toml")
    assert sc.recording.path == str(scen / "runs/{scenario}-{timestamp}")
    assert sc.opcua.security.certificate == str(scen / "pki/cert.der")
    assert sc.opcua.security.private_key == str(tmp_path / "certs/server_key.pem")  # "../certs", normalized
    assert sc.opcua.security.trusted_clients_dir == str(scen / "pki/trusted")
    assert sc.softplc.record == str(scen / "logs/scan.csv")
    assert sc.modbus.request_log == str(scen / "logs/req.jsonl")
    assert sc.modbus.client_stats == "/abs/c.json"


def test_command_line_values_resolve_against_the_cwd(elsewhere):
    sc = load_scenario(ROOT / "configs/bioreactor.toml", {"recording": {"path": "mine/{scenario}"}})
    assert sc.recording.path == str(elsewhere / "mine/{scenario}")


def test_braces_in_the_scenario_dir_survive_the_template(tmp_path, elsewhere):
    scen = tmp_path / "odd{dir}"
    scen.mkdir()
    shutil.copy(ROOT / "configs/bioreactor.toml", scen / "s.toml")
    sc = load_scenario(scen / "s.toml")
    assert sc.recording.path.format(scenario="x", timestamp="t") == str(tmp_path / "runs/x-t")


def test_policy_and_safety_paths(tmp_path, elsewhere):
    scen = tmp_path / "p"
    scen.mkdir()
    shutil.copytree(ROOT / "policies/bioreactor", scen / "pol")
    text = (ROOT / "configs/bioreactor_policy.toml").read_text()
    text = text.replace('directory = "../policies/bioreactor"', 'directory = "pol"')
    text = text.replace('decision_log = "../runs/', 'status_path = "st/status.json"\ndecision_log = "logs/')
    (scen / "s.toml").write_text(text)
    sc = load_scenario(scen / "s.toml")
    assert sc.policy.directory == str(scen / "pol")
    assert sc.safety.decision_log.startswith(str(scen / "logs")) and sc.safety.status_path == str(scen / "st/status.json")
    assert resolve_path("pol", str(scen / "s.toml")) == scen / "pol"  # the loader's rule is the same


def test_scenarios_built_in_code_keep_their_paths():
    import tomllib

    data = tomllib.loads((ROOT / "configs/bioreactor.toml").read_text())
    data["recording"]["path"] = "rel/{scenario}"
    assert parse_scenario(data).recording.path == "rel/{scenario}"


def test_path_keys_name_real_fields():
    from hil.scenario.config import SUBSYSTEM_SECTIONS, Scenario, _optional_section

    for key in PATH_KEYS:
        section, *rest = key.split(".")
        model = (_optional_section(*SUBSYSTEM_SECTIONS[section]) if section in SUBSYSTEM_SECTIONS
                 else Scenario.model_fields[section].annotation)
        assert model is not None, key
