"""FP8 E4M3FN codes: decode and RNE encode (fp8-and-integration.md §7, §8).

E4M3FN: sign bit 7, exponent bits 6..3 (bias 7), mantissa bits 2..0; no infinities; S.1111.111
(0x7F, 0xFF) is the only NaN; the largest finite magnitude is 448 (0x7E).

Encoding is correct-or-NaN, like torch's ``float8_e4m3fn`` cast that the reference miner uses:
round to nearest even, and a value whose rounding exceeds 448 (|x| > 464), an infinity or a NaN
becomes NaN (sign kept). In the protocol every encoded value is first clamped to ±448, so this only
decides what a NaN does; the kernel's ``cvt.rn.satfinite`` agrees on every clamped input.
"""
from __future__ import annotations

import numpy as np

E4M3_MAX_CODE = 0x7E
E4M3_NAN = 0x7F


def _decode_table() -> np.ndarray:
    codes = np.arange(256)
    exponent = (codes >> 3) & 0xF
    mantissa = codes & 0x7
    magnitude = np.where(
        exponent == 0,
        mantissa * 2.0**-9,
        (8 + mantissa) * np.exp2(exponent - 10.0),
    )
    values = np.where(codes & 0x80, -magnitude, magnitude)
    values[(codes & 0x7F) == E4M3_NAN] = np.nan
    return values.astype(np.float32)


_DECODE = _decode_table()


def is_nan_code(codes: np.ndarray) -> np.ndarray:
    """True where an e4m3 byte is a NaN (0x7F or 0xFF)."""
    return (np.asarray(codes, dtype=np.uint8) & 0x7F) == E4M3_NAN


def e4m3_to_f32(codes: np.ndarray) -> np.ndarray:
    """Exact decode of e4m3 bytes to f32 (NaN codes decode to NaN)."""
    return _DECODE[np.asarray(codes, dtype=np.uint8)]


def f32_to_e4m3(values: np.ndarray) -> np.ndarray:
    """RNE encode of f32 values to e4m3 bytes; out-of-range and non-finite values become NaN."""
    x = np.asarray(values, dtype=np.float32).astype(np.float64)
    sign = np.where(np.signbit(x), 0x80, 0).astype(np.int64)
    magnitude = np.abs(x)
    finite = np.isfinite(magnitude)
    safe = np.where(finite, magnitude, 0.0)
    _, frexp_exp = np.frexp(safe)
    binade = np.maximum(frexp_exp.astype(np.int64) - 1, -6)  # below 2^-6 the grid is 2^-9
    # |x| / 2^(binade-3) rounded to even: 0..8 on the subnormal grid, 8..16 on a normal binade.
    steps = np.rint(np.ldexp(safe, (3 - binade).astype(np.int32))).astype(np.int64)
    code = np.where(steps < 8, steps, ((binade + 7) << 3) + steps - 8)  # 16 carries into the exponent
    code = np.where(finite & (code <= E4M3_MAX_CODE), code, E4M3_NAN)
    return (code | sign).astype(np.uint8)
