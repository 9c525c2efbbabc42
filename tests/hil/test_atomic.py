"""hil/atomic.py: the one atomic write (status, summary and result files)."""

import json

import pytest

from hil.atomic import write_json_atomic, write_text_atomic


def test_writes_and_replaces_leaving_no_temporary_file(tmp_path):
    target = tmp_path / "sub" / "status.json"
    write_json_atomic(target, {"a": 1, "b": float("nan")}, indent=1)
    assert json.loads(target.read_text(), parse_constant=str) == {"a": 1, "b": "NaN"}
    write_text_atomic(target, "second")
    assert target.read_text() == "second"
    assert [p.name for p in target.parent.iterdir()] == ["status.json"]


def test_a_failed_write_keeps_the_previous_file_and_cleans_up(tmp_path):
    target = tmp_path / "result.json"
    write_json_atomic(target, {"ok": True})
    with pytest.raises(TypeError):
        write_json_atomic(target, {"bad": object()})  # not encodable: nothing written
    assert json.loads(target.read_text()) == {"ok": True}
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


def test_default_encodes_what_json_cannot(tmp_path):
    target = tmp_path / "r.json"
    write_json_atomic(target, {"p": tmp_path}, default=str)
    assert json.loads(target.read_text()) == {"p": str(tmp_path)}
