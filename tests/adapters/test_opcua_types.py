"""What an OPC UA write of one variant type becomes in a variable of another data type."""

import struct

import pytest
from asyncua import ua

from adapters.opcua_types import convert, to_float32

S = ua.StatusCodes
VT = ua.VariantType


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


@pytest.mark.parametrize(
    "data_type, vt, value, code, out",
    [
        # to Double: any numeric type, exactly
        ("Double", VT.Double, 0.1, S.Good, 0.1),
        ("Double", VT.Float, f32(0.1), S.Good, f32(0.1)),
        ("Double", VT.Int32, -70000, S.Good, -70000.0),
        ("Double", VT.UInt16, 65535, S.Good, 65535.0),
        ("Double", VT.Int64, 2**53, S.Good, float(2**53)),
        ("Double", VT.Boolean, True, S.BadTypeMismatch, None),
        ("Double", VT.String, "1.0", S.BadTypeMismatch, None),
        ("Double", VT.Double, float("nan"), S.BadOutOfRange, None),
        ("Double", VT.Double, float("inf"), S.BadOutOfRange, None),
        # to Float: rounded to float32, refused beyond its range
        ("Float", VT.Double, 0.1, S.Good, f32(0.1)),
        ("Float", VT.Float, f32(2.5), S.Good, 2.5),
        ("Float", VT.Int32, 16777217, S.Good, 16777216.0),
        ("Float", VT.Double, 1e39, S.BadOutOfRange, None),
        # to integers: integral values within the type
        ("Int16", VT.Int32, -32768, S.Good, -32768),
        ("Int16", VT.Int32, 32768, S.BadOutOfRange, None),
        ("Int16", VT.Double, 12.0, S.Good, 12),
        ("Int16", VT.Float, 12.5, S.BadTypeMismatch, None),
        ("Int32", VT.Double, 2.0**31, S.BadOutOfRange, None),
        ("Int32", VT.UInt32, 7, S.Good, 7),
        ("UInt16", VT.Int16, -1, S.BadOutOfRange, None),
        ("UInt16", VT.Double, 65535.0, S.Good, 65535),
        ("UInt32", VT.Int64, 2**32, S.BadOutOfRange, None),
        ("UInt32", VT.Boolean, True, S.BadTypeMismatch, None),
        # to Boolean: Boolean, or a numeric 0/1
        ("Boolean", VT.Boolean, True, S.Good, True),
        ("Boolean", VT.Int32, 0, S.Good, False),
        ("Boolean", VT.Double, 1.0, S.Good, True),
        ("Boolean", VT.Int32, 2, S.BadOutOfRange, None),
        ("Boolean", VT.Double, 0.5, S.BadTypeMismatch, None),
    ],
)
def test_conversions(data_type, vt, value, code, out):
    got_code, got = convert(data_type, vt, value)
    assert got_code == code
    assert got == out and type(got) is type(out)


def test_float32_rounding_is_the_nearest_float32():
    assert to_float32(0.1) == f32(0.1) != 0.1
    with pytest.raises(OverflowError):
        to_float32(1e39)
