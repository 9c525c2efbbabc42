"""Bad numbers in every shipped scenario: NaN, +-Inf, huge and tiny values in EVERY numeric key of
every scenario in configs/ are refused with a ConfigError naming that key (hil/scenario/numbers.py via the
models' base class), and the scenario file itself must be a regular UTF-8 file of bounded size."""

from __future__ import annotations

import copy
import math
import os
import tomllib
from pathlib import Path

import pytest

from hil.scenario.config import load_scenario, parse_scenario, read_config_text
from hil.errors import ConfigError
from hil.scenario.numbers import MAX_SCENARIO_BYTES

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((ROOT / "configs").glob("*.toml"))
BAD_VALUES = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "huge": 1e300, "-huge": -1e300,
              "tiny": 1e-300}


def numeric_leaves(node, path=()):
    """(path, value) of every int/float leaf of a parsed TOML document (bools excluded)."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from numeric_leaves(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from numeric_leaves(v, path + (i,))
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield path, node


def dotted(path) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else ("." if out else "") + str(p)
    return out


def substituted(data, path, value):
    data = copy.deepcopy(data)
    node = data
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return data


CASES = []
for _file in SCENARIOS:
    _data = tomllib.loads(_file.read_text())
    for _path, _ in numeric_leaves(_data):
        CASES.append(pytest.param(_file, _path, id=f"{_file.stem}:{dotted(_path)}"))


def test_the_sweep_covers_every_shipped_scenario():
    """Guards the parametrisation itself: every scenario contributes numeric keys."""
    stems = {c.values[0].stem for c in CASES}
    assert stems == {f.stem for f in SCENARIOS} and len(CASES) > 100


# keys declared with hil.scenario.numbers.unlimited(math.inf): +inf is their documented "check disabled"
UNLIMITED_INF = {f"safety.confidence.{k}" for k in ("mahalanobis_enter", "mahalanobis_exit", "disagreement_enter",
                                                     "disagreement_exit")}


@pytest.mark.parametrize("file, path", CASES)
def test_every_numeric_key_refuses_nan_inf_huge_tiny(file, path):
    data = tomllib.loads(file.read_text())
    key = dotted(path)
    for label, bad in BAD_VALUES.items():
        if label == "inf" and key in UNLIMITED_INF:  # accepted, unless an exit level passes its enter level
            try:
                parse_scenario(substituted(data, path, bad), source=str(file), base_dir=file.parent)
            except ConfigError as exc:
                assert "hysteresis" in str(exc), exc
            continue
        with pytest.raises(ConfigError) as err:
            parse_scenario(substituted(data, path, bad), source=str(file), base_dir=file.parent)
        named = [p for p, _ in err.value.problems]
        assert any(p == key or p.startswith(key + ".") or p.startswith(key + "[") for p in named), \
            f"{label} in {key}: the error names {named}, not the key ({err.value})"


@pytest.mark.parametrize("key, value, reason", [
    ("loop.step_s", 1e-300, "magnitude"),
    ("loop.step_s", 1e-12, "not a sane duration"),
    ("loop.step_s", 1e300, "magnitude"),
    ("loop.step_s", math.inf, "finite"),
    ("loop.duration_s", math.inf, "finite"),
    ("loop.duration_s", 1e10, "not a sane duration"),
    ("loop.time_scale", 1e300, "magnitude"),
    ("loop.time_scale", 1e7, "less than or equal"),
    ("loop.time_scale", math.inf, "finite"),
])
def test_loop_numbers_name_their_own_key(key, value, reason):
    file = ROOT / "configs/bioreactor.toml"
    data = substituted(tomllib.loads(file.read_text()), tuple(key.split(".")), value)
    with pytest.raises(ConfigError) as err:
        parse_scenario(data, base_dir=file.parent)
    assert err.value.path == key and reason in err.value.reason, str(err.value)


def test_too_many_steps_is_refused():
    file = ROOT / "configs/bioreactor.toml"
    data = tomllib.loads(file.read_text())
    data["loop"]["step_s"] = 1e-6
    data["loop"]["duration_s"] = 1e8
    with pytest.raises(ConfigError) as err:
        parse_scenario(data, base_dir=file.parent)
    assert err.value.path == "loop.duration_s" and "steps" in err.value.reason


def test_box_with_nan_names_the_element():
    file = ROOT / "configs/bioreactor_policy.toml"
    data = tomllib.loads(file.read_text())
    box = data["safety"]["projection"]["box"]
    name = next(iter(box))
    box[name] = [math.nan, box[name][1]]
    with pytest.raises(ConfigError) as err:
        parse_scenario(data, base_dir=file.parent)
    assert err.value.path == f"safety.projection.box.{name}[0]", str(err.value)
    assert "finite" in err.value.reason


def test_non_utf8_scenario_is_a_config_error(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_bytes((ROOT / "configs/bioreactor.toml").read_bytes() + b"\n# caf\xe9\n")
    with pytest.raises(ConfigError) as err:
        load_scenario(f)
    assert "not UTF-8" in str(err.value) and "0xe9" in str(err.value)


def test_fifo_device_and_directory_are_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero"), tmp_path):
        with pytest.raises(ConfigError) as err:
            read_config_text(path)
        assert "not a regular file" in str(err.value), str(err.value)


def test_oversized_scenario_is_refused(tmp_path):
    f = tmp_path / "big.toml"
    with open(f, "wb") as out:
        out.truncate(MAX_SCENARIO_BYTES + 1)
    with pytest.raises(ConfigError) as err:
        load_scenario(f)
    assert "bytes allowed" in str(err.value)


def test_unlimited_keys_take_their_default_and_nothing_else_non_finite():
    """`unlimited` fields: the non-finite default may be written out (+inf "no limit", NaN "an
    invalid reading"); the other non-finite values are refused with the key."""
    file = ROOT / "configs/bioreactor_policy.toml"
    data = tomllib.loads(file.read_text())
    ok = copy.deepcopy(data)
    ok.setdefault("gaps", {}).setdefault("sensors", {})["dissolved_oxygen"] = {"dropout_mode": "bad",
                                                                               "dropout_value": math.nan}
    ok["safety"].setdefault("confidence", {}).update(mahalanobis_enter=math.inf, mahalanobis_exit=math.inf)
    parse_scenario(ok, source=str(file), base_dir=file.parent)
    for section, key, value in (("gaps", "dropout_value", math.inf), ("gaps", "dropout_value", -math.inf),
                                ("confidence", "mahalanobis_enter", -math.inf),
                                ("confidence", "mahalanobis_enter", math.nan)):
        bad = copy.deepcopy(ok)
        target = bad["gaps"]["sensors"]["dissolved_oxygen"] if section == "gaps" else bad["safety"]["confidence"]
        target[key] = value
        if key == "mahalanobis_enter":
            target["mahalanobis_exit"] = 1.0
        with pytest.raises(ConfigError) as err:
            parse_scenario(bad, source=str(file), base_dir=file.parent)
        assert any(p.endswith(key) for p, _ in err.value.problems), err.value


@pytest.mark.parametrize("file", SCENARIOS, ids=lambda f: f.stem)
def test_a_scenario_written_back_from_its_model_reads_again(file):
    """What the safety and the policy get over the bootstrap pipe: the validated scenario as
    JSON (every default written out, NaN and inf included) parses to the same scenario."""
    import json

    from hil.safety.launch import scenario_to_json

    sc = load_scenario(file)
    again = parse_scenario(json.loads(scenario_to_json(sc)), source=str(file))
    assert scenario_to_json(again) == scenario_to_json(sc)
