"""ImageDatastore: Modbus reads/writes against a real process image, no sockets."""

import math
import struct
import time

import numpy as np
import pytest
from pymodbus.constants import ExcCodes

from adapters.modbus_datastore import ImageDatastore
from adapters.modbus_log import FIELDS, ClientStats, RequestLog, read_request_log
from hil.image import ProcessImage
from hil.tagmap.modbus import compile_map
from tests.integration import modbus_helpers as H

IDX = {n: H.SPEC.index("inputs", n) for n in H.SPEC.names("inputs")}
Y = np.array([42.5, 301.25, 1.0, 0.0, -1234.56])
APPLIED = np.array([3.0, 0.0, 0.0, 0.0, 0.0])


@pytest.fixture
def ds():
    sc = H.scenario(5020)
    img = ProcessImage.create(H.SPEC.n_inputs, H.SPEC.n_outputs)
    img.publish(Y, APPLIED, 7, 0.14)
    try:
        yield ImageDatastore(compile_map(sc.modbus, H.SPEC, sc), img)
    finally:
        img.close()


def f32(v, word="big"):
    hi, lo = struct.unpack(">HH", struct.pack(">f", v))
    return [hi, lo] if word == "big" else [lo, hi]


def test_reads_come_from_the_latest_publish(ds):
    assert ds.read(4, 0, 4) == f32(42.5) + f32(301.25, "little")
    assert ds.last_step == 7
    ds.image.publish(Y + 1.0, APPLIED, 8, 0.16)
    t_before = time.monotonic_ns()
    assert ds.read(4, 0, 2) == f32(43.5)
    assert ds.last_step == 8
    # the snapshot's instant: after the publish, inside the read
    assert ds.last_publish_ns <= ds.last_served_ns and t_before <= ds.last_served_ns <= time.monotonic_ns()
    ds.begin()
    assert ds.last_served_ns == -1
    assert ds.read(4, 10, 1) == [4350]  # int16 x100
    assert ds.read(2, 0, 2) == [True, True]  # high_level 2.0 >= 0.5, pump_running 1.0
    assert ds.read(4, 20, 2) == f32(3.0)  # applied inflow
    assert ds.read(3, 100, 2) == f32(43.5)  # a sensor in a holding register


def test_partial_reads_of_a_value_are_allowed(ds):
    assert ds.read(4, 1, 1) == f32(42.5)[1:]


@pytest.mark.parametrize("fc, address, count", [(4, 8, 1), (4, 9, 2), (3, 30, 1), (1, 1, 1), (2, 0, 3),
                                                 (4, 65535, 1), (3, 100, 3)])
def test_unmapped_reads_are_illegal_data_address(ds, fc, address, count):
    assert ds.read(fc, address, count) == ExcCodes.ILLEGAL_ADDRESS


def test_read_counts_beyond_the_protocol_limit_are_illegal_data_value(ds):
    assert ds.read(3, 0, 126) == ExcCodes.ILLEGAL_VALUE
    assert ds.read(1, 0, 2001) == ExcCodes.ILLEGAL_VALUE


def test_a_float32_write_lands_in_the_image(ds):
    assert ds.write(16, 0, f32(7.25)) is None
    assert ds.image.read_inputs()[IDX["inflow"]] == 7.25
    assert ds.last_write_seq == ds.image.counters()["input_writes"]
    assert ds.read(3, 0, 2) == f32(7.25)  # read-back of the command


def test_multi_register_write_spanning_tags_is_atomic_and_all_or_nothing(ds):
    writes0 = ds.image.counters()["input_writes"]
    assert ds.write(16, 0, f32(5.0) + f32(12.0)) is None  # inflow and coolant, one request
    assert ds.image.counters()["input_writes"] == writes0 + 1  # one image update
    before = ds.image.read_inputs()
    # second value out of bounds (coolant <= 50): nothing at all is written
    assert ds.write(16, 0, f32(6.0) + f32(51.0)) == ExcCodes.ILLEGAL_VALUE
    assert np.array_equal(ds.image.read_inputs(), before)
    assert ds.image.counters()["input_writes"] == writes0 + 1


@pytest.mark.parametrize("value", [math.nan, math.inf, -0.5, 20.5])
def test_non_finite_or_out_of_bounds_writes_are_illegal_data_value(ds, value):
    before = ds.image.read_inputs()
    assert ds.write(16, 0, f32(value)) == ExcCodes.ILLEGAL_VALUE
    assert np.array_equal(ds.image.read_inputs(), before, equal_nan=True)


def test_half_of_a_float32_is_illegal_data_address(ds):
    assert ds.write(6, 0, [0x40E8]) == ExcCodes.ILLEGAL_ADDRESS  # first word only
    assert ds.write(6, 1, [0]) == ExcCodes.ILLEGAL_ADDRESS  # second word only
    assert ds.write(16, 1, [0, 0]) == ExcCodes.ILLEGAL_ADDRESS  # straddling two values
    assert ds.image.counters()["input_writes"] == 0


@pytest.mark.parametrize("fc, address, values", [(16, 100, f32(1.0)), (16, 20, f32(1.0)), (6, 30, [1]),
                                                 (5, 1, [True]), (16, 4, [100, 0, 0])])
def test_writes_to_read_only_or_unmapped_addresses_are_illegal_data_address(ds, fc, address, values):
    assert ds.write(fc, address, values) == ExcCodes.ILLEGAL_ADDRESS
    assert ds.image.counters()["input_writes"] == 0


def test_scaled_and_signed_registers_and_coils(ds):
    assert ds.write(6, 4, [1234]) is None  # inflow uint16 x100
    assert ds.image.read_inputs()[IDX["inflow"]] == pytest.approx(12.34)
    assert ds.write(6, 5, [0x10000 - 5000]) is None  # trim int16 x10000 -> -0.5
    assert ds.image.read_inputs()[IDX["trim"]] == -0.5
    assert ds.write(6, 4, [2001]) == ExcCodes.ILLEGAL_VALUE  # 20.01 L/min > 20
    assert ds.write(5, 0, [True]) is None
    assert ds.image.read_inputs()[IDX["pump"]] == 1.0
    assert ds.read(1, 0, 1) == [True]
    assert ds.write(15, 0, [False]) is None
    assert ds.image.read_inputs()[IDX["pump"]] == 0.0


def test_byte_swapped_float_write(ds):
    regs = [((w & 0xFF) << 8) | (w >> 8) for w in f32(33.0)]
    assert ds.write(16, 6, regs) is None
    assert ds.image.read_inputs()[IDX["coolant"]] == 33.0


def test_float32_round_off_at_a_bound_is_clamped_not_refused():
    from plants.spec import PlantSpec, Quantity
    from types import SimpleNamespace

    spec = PlantSpec("p", (Quantity("s", "1", 0, 0, 1),), (Quantity("u", "m3/s", 0.0, 0.0, 0.1),),
                     (Quantity("y", "1", 0, 0, 1),), ())
    from hil.tagmap.modbus import ModbusSection

    sec = ModbusSection.model_validate({"map": [{"signal": "u", "table": "holding_register", "address": 0}]})
    img = ProcessImage.create(1, 1)
    try:
        d = ImageDatastore(compile_map(sec, spec, SimpleNamespace(inputs={})), img)
        assert struct.unpack(">f", struct.pack(">f", 0.1))[0] > 0.1  # float32(0.1) exceeds 0.1
        assert d.write(16, 0, f32(0.1)) is None
        assert img.read_inputs()[0] == 0.1
        assert d.write(16, 0, f32(0.1001)) == ExcCodes.ILLEGAL_VALUE
    finally:
        img.close()


def test_read_write_multiple_writes_then_reads(ds):
    assert ds.write(23, 4, [500]) is None
    assert ds.read(23, 0, 2) == f32(5.0)


# ---------------------------------------------------------------------------- counters and log


def test_client_stats_count_per_client_and_bound_their_number():
    st = ClientStats(max_clients=2)
    for i, peer in enumerate(("a:1", "b:2", "c:3")):
        st.connected(peer, i)
        st.request(peer, i, False, 0)
        st.request(peer, i, True, 2)
        st.disconnected(peer, i)
    d = st.as_dict()
    assert list(d["clients"]) == ["b:2", "c:3"]  # oldest disconnected client evicted
    assert d["clients"]["c:3"]["exceptions"] == {"0x02": 1}
    assert d["totals"]["requests"] == 6 and d["totals"]["exceptions"] == {"0x02": 3}
    assert d["totals"]["evicted_clients"] == 1


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_request_log_is_bounded_and_dumps_both_formats(tmp_path, suffix):
    log = RequestLog(size=3)
    for i in range(5):
        log.append((i, 10, "127.0.0.1:5", 1, 3, i, 2, False, 0, 7, 99, -1, 100 + i))
    assert log.dropped == 2
    df = read_request_log(log.dump(tmp_path / f"req{suffix}"))
    assert list(df["t_ns"]) == [2, 3, 4]
    assert list(df.columns)[:5] == ["t_ns", "dur_ns", "peer", "unit", "fc"]
    assert df["peer"].iloc[0] == "127.0.0.1:5" and not df["wrote"].any()
    assert list(df.columns) == list(FIELDS) and list(df["served_ns"]) == [102, 103, 104]
