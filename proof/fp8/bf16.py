"""BF16 / FP32 bit helpers for the FP8 protocol (fp8-and-integration.md §4, §6, §7).

Values travel as raw bit patterns (uint16 for BF16, uint32 for FP32) so that every rounding is
explicit. The protocol's scalar arithmetic is "decode to f32, one op in f32, round RNE to BF16",
except the FMA, which rounds the exact a·b + c once (``fma.rn.bf16`` semantics).

The FMA is emulated without big integers so it vectorises: the product of two BF16 values is exact
in f64, TwoSum recovers the f64 addition error, the exact sum is rounded to odd at FP32 precision
(24 bits), and that is rounded RNE to BF16 (8 bits). Rounding to odd at ≥ p + 2 bits and then to
nearest at p bits equals one correct rounding, so the result is the single-rounding FMA. The test
proves it against an exact rational reference.
"""
from __future__ import annotations

from math import isqrt

import numpy as np

BF16_NAN = 0x7FC0
BF16_POS_INF = 0x7F80


def f32_to_bf16(values: np.ndarray) -> np.ndarray:
    """RNE f32 → BF16 bits (overflow gives ±inf, NaN stays a quiet NaN of the same sign)."""
    x = np.asarray(values, dtype=np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        sign = ((bits >> 16) & 0x8000).astype(np.uint16)
        rounded = np.where(nan, sign | BF16_NAN, rounded).astype(np.uint16)
    return rounded


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """BF16 bits → f32 values (exact: BF16 is the top half of an FP32)."""
    b = np.asarray(bits, dtype=np.uint16)
    return (b.astype(np.uint32) << 16).view(np.float32)


def f32_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """FP32 bit patterns (uint32) → f32 values."""
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def _round_to_odd_f32(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """Round the exact f64 pair hi + lo (|lo| ≤ half an f64 ulp of hi) to FP32, to odd.

    Round-to-odd keeps a sticky bit in the last FP32 place, so a following RNE to any format with
    at most 22 bits of precision rounds exactly as if it had seen the exact value.
    """
    nearest = hi.astype(np.float32)
    residual = (hi - nearest.astype(np.float64)) + lo
    even = (nearest.view(np.uint32) & 1) == 0
    nudge = (residual != 0) & even & np.isfinite(nearest)
    toward = np.where(residual > 0, np.float32(np.inf), np.float32(-np.inf))
    return np.where(nudge, np.nextafter(nearest, toward), nearest).astype(np.float32)


def f64_to_bf16(values: np.ndarray) -> np.ndarray:
    """RNE f64 → BF16 bits with one rounding (used for the device scale constants)."""
    x = np.asarray(values, dtype=np.float64)
    return f32_to_bf16(_round_to_odd_f32(x, np.zeros_like(x)))


def bf16_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """RNE_bf16(f32(a) · f32(b)): the f32 product, then one BF16 rounding."""
    with np.errstate(over="ignore", invalid="ignore"):
        return f32_to_bf16(bf16_to_f32(a) * bf16_to_f32(b))


def bf16_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """RNE_bf16(f32(a) / f32(b)): the correctly rounded f32 quotient, then one BF16 rounding."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return f32_to_bf16(bf16_to_f32(a) / bf16_to_f32(b))


def bf16_fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """a·b + c rounded once, RNE, to BF16 (``fma.rn.bf16``); NaN and inf propagate as IEEE."""
    a64 = bf16_to_f32(a).astype(np.float64)
    b64 = bf16_to_f32(b).astype(np.float64)
    c64 = bf16_to_f32(c).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        product = a64 * b64  # exact: two 8-bit significands, exponents well inside f64
        total = product + c64
        back = total - c64
        error = (product - back) + (c64 - (total - back))  # TwoSum: product + c = total + error
        error = np.where(np.isfinite(total), error, 0.0)
        return f32_to_bf16(_round_to_odd_f32(total, error))


def bf16_is_nan(bits: np.ndarray) -> np.ndarray:
    """True where a BF16 bit pattern is a NaN."""
    b = np.asarray(bits, dtype=np.uint16)
    return (b & 0x7FFF) > BF16_POS_INF


def bf16_max(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """NaN-propagating maximum (IEEE maximum / torch.maximum); returns one input unrounded."""
    fa, fb = bf16_to_f32(a), bf16_to_f32(b)
    a_b = np.broadcast_arrays(np.asarray(a, dtype=np.uint16), np.asarray(b, dtype=np.uint16))
    pick = np.where(fa >= fb, a_b[0], a_b[1])
    return np.where(bf16_is_nan(a), a_b[0], np.where(bf16_is_nan(b), a_b[1], pick)).astype(np.uint16)


def bf16_min(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """NaN-propagating minimum (IEEE minimum / torch.minimum); returns one input unrounded."""
    fa, fb = bf16_to_f32(a), bf16_to_f32(b)
    a_b = np.broadcast_arrays(np.asarray(a, dtype=np.uint16), np.asarray(b, dtype=np.uint16))
    pick = np.where(fa <= fb, a_b[0], a_b[1])
    return np.where(bf16_is_nan(a), a_b[0], np.where(bf16_is_nan(b), a_b[1], pick)).astype(np.uint16)


def bf16_clamp_symmetric(x: np.ndarray, bound: int) -> np.ndarray:
    """Clamp to [−bound, +bound] (bound a non-negative BF16 code) with NaN passing through."""
    return bf16_max(bf16_min(x, bound), bound ^ 0x8000)


def rne_bf16_sqrt_ratio(numerator: int, denominator: int, exponent: int) -> int:
    """RNE_bf16(√(numerator · 2^exponent / denominator)) exactly, as BF16 bits (ints, no floats).

    Raises ValueError on a negative argument or a BF16 overflow. Subnormal results round on the
    2^-133 grid; results at or below half the smallest subnormal are +0 (ties to even).
    """
    if numerator < 0 or denominator <= 0:
        raise ValueError(f"sqrt needs numerator >= 0 and denominator > 0, got {numerator}/{denominator}")
    if numerator == 0:
        return 0
    # Exact rational v = num / den with both sides integers.
    num = numerator << max(exponent, 0)
    den = denominator << max(-exponent, 0)
    log2_v = num.bit_length() - den.bit_length()  # floor(log2 v) is this or one less
    if (num << max(-log2_v, 0)) < (den << max(log2_v, 0)):
        log2_v -= 1
    binade = log2_v // 2  # floor(log2 √v)
    # Quantum of the result: 2^(binade-7) for normals, 2^-133 for subnormals.
    quantum_exp = max(binade, -126) - 7
    # q = √v / 2^quantum_exp, so q² = num · 2^(-2·quantum_exp) / den.
    scaled_num = num << max(-2 * quantum_exp, 0)
    scaled_den = den << max(2 * quantum_exp, 0)
    root = isqrt(scaled_num // scaled_den)  # floor(√(n/d)) = isqrt(floor(n/d))
    # Round: compare √(n/d) with root + 1/2, i.e. 4n vs d·(2·root + 1)².
    lhs, rhs = 4 * scaled_num, scaled_den * (2 * root + 1) ** 2
    if lhs > rhs or (lhs == rhs and root & 1):
        root += 1
    if binade < -126:
        code = root  # subnormal grid; root == 128 is the smallest normal, encoded the same way
    else:
        code = ((binade + 127) << 7) + (root - 128)  # root == 256 carries into the exponent
    if code >= BF16_POS_INF:
        raise ValueError("the square root overflows BF16")
    return code

