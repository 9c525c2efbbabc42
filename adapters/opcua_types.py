"""What an OPC UA write of one variant type becomes in a variable of another data type.

A PLC writes what its own variable is: an IEC 61131 REAL arrives as Float, a DINT as
Int32, an INT as Int16, a BOOL as Boolean. Commercial servers accept a write whenever the
value converts exactly or within the target variable's precision, and hil does the same
(`convert`), refusing only what the variable cannot represent:

    target Double            any numeric variant (integers exactly up to 2**53, beyond
                             that rounded to the nearest double, as a Double holds it)
    target Float             any numeric variant whose value lies within float32's range,
                             rounded to the nearest float32 (a Double 0.1 becomes 0.1f);
                             beyond +-3.4e38 -> BadOutOfRange
    target integer types     integer variants within the type's range; Float/Double
    (SByte .. UInt64)        variants with an integral value (2.0 -> 2); a fraction ->
                             BadTypeMismatch, a value beyond the type -> BadOutOfRange
    target Boolean           Boolean; a numeric 0 or 1 (integral, as an explicit cast);
                             another number -> BadOutOfRange
    a numeric variable       never takes a Boolean (BadTypeMismatch): a BOOL aimed at a
                             REAL setpoint is a wiring mistake, not a value
    anything else            (String, arrays, null) -> BadTypeMismatch

Non-finite floats are BadOutOfRange (no plant value is NaN or infinite). The EU range of
the node is checked by the caller (adapters/opcua_writes.py) on the converted value.
"""

from __future__ import annotations

import math
import struct

from asyncua import ua

from hil.tagmap.opcua import DATA_TYPES

S = ua.StatusCodes
VT = ua.VariantType
INTEGER_VARIANTS = frozenset({VT.SByte, VT.Byte, VT.Int16, VT.UInt16, VT.Int32, VT.UInt32, VT.Int64, VT.UInt64})
FLOAT_VARIANTS = frozenset({VT.Float, VT.Double})
NUMERIC_VARIANTS = INTEGER_VARIANTS | FLOAT_VARIANTS
_F32 = struct.Struct("<f")


def to_float32(x: float) -> float:
    """Nearest float32 of x, as a Python float; OverflowError beyond float32's range."""
    return _F32.unpack(_F32.pack(x))[0]


def convert(data_type: str, variant_type, value) -> tuple[int, float | bool | int | None]:
    """(status code, converted value) of writing `value` of `variant_type` to a `data_type`
    variable; the value is None unless the status is Good. Booleans convert to bool,
    integer types to int, Float/Double to float."""
    vt = variant_type
    if vt == VT.Boolean:
        if data_type != "Boolean" or not isinstance(value, bool):
            return S.BadTypeMismatch, None
        return S.Good, value
    if vt not in NUMERIC_VARIANTS or isinstance(value, bool) or not isinstance(value, (int, float)):
        return S.BadTypeMismatch, None
    if vt in FLOAT_VARIANTS:
        x = float(value)
        if not math.isfinite(x):
            return S.BadOutOfRange, None
    else:
        x = int(value)  # exact Python int
    if data_type == "Boolean":
        if x == 0 or x == 1:
            return S.Good, bool(x)
        return (S.BadTypeMismatch if isinstance(x, float) and not x.is_integer() else S.BadOutOfRange), None
    if data_type == "Double":
        return S.Good, float(x)
    if data_type == "Float":
        try:
            return S.Good, to_float32(float(x))
        except OverflowError:
            return S.BadOutOfRange, None
    low, high, is_int = DATA_TYPES[data_type]
    if not is_int:  # a data type hil does not serve numerically
        return S.BadTypeMismatch, None
    if isinstance(x, float):
        if not x.is_integer():
            return S.BadTypeMismatch, None
        x = int(x)
    if not low <= x <= high:
        return S.BadOutOfRange, None
    return S.Good, x
