"""proof.fp8.bf16 and proof.fp8.e4m3 against exact rational references."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from proof.fp8 import bf16
from proof.fp8.e4m3 import e4m3_to_f32, f32_to_e4m3, is_nan_code

# --- exact references ------------------------------------------------------------------------------


def ref_round(q: Fraction, mantissa_bits: int, min_exponent: int) -> tuple[int, int]:
    """RNE of a positive rational onto a binary grid: (binade-or-None, integer steps).

    Returns (e, n) with the rounded value n · 2^(max(e, min_exponent) − mantissa_bits).
    """
    e = q.numerator.bit_length() - q.denominator.bit_length()
    if Fraction(2) ** e > q:
        e -= 1
    quantum = Fraction(2) ** (max(e, min_exponent) - mantissa_bits)
    steps = q / quantum
    n = math.floor(steps)
    rest = steps - n
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and n % 2 == 1):
        n += 1
    return e, n


def ref_bf16(q: Fraction, negative_zero: bool = False) -> int:
    """Exact RNE of a rational to BF16 bits (overflow → inf)."""
    if q == 0:
        return 0x8000 if negative_zero else 0
    sign = 0x8000 if q < 0 else 0
    e, n = ref_round(abs(q), 7, -126)
    code = n if e < -126 else ((e + 127) << 7) + n - 128
    return sign | min(code, 0x7F80)


def bf16_value(bits: int) -> Fraction:
    return Fraction(float(bf16.bf16_to_f32(np.uint16(bits))))


def random_finite_bf16(rng, size) -> np.ndarray:
    bits = rng.integers(0, 1 << 16, size=2 * size).astype(np.uint16)
    return bits[(bits & 0x7FFF) < 0x7F80][:size]


# --- BF16 ------------------------------------------------------------------------------------------


def test_f32_to_bf16_is_exact_rne():
    rng = np.random.default_rng(1)
    bits = rng.integers(0, 1 << 32, size=20000, dtype=np.uint64).astype(np.uint32)
    bits[:4] = [0x3F808000, 0x3F818000, 0x7F7FFFFF, 0x00008000]  # ties either way, overflow, tiny tie
    values = bits.view(np.float32)
    finite = np.isfinite(values)
    got = bf16.f32_to_bf16(values[finite])
    want = [ref_bf16(Fraction(float(v)), negative_zero=bool(np.signbit(v))) for v in values[finite]]
    assert got.tolist() == want
    assert bf16.bf16_is_nan(bf16.f32_to_bf16(np.float32("nan")))


def test_f64_to_bf16_rounds_once():
    rng = np.random.default_rng(2)
    # f64 values just off bf16 midpoints: a double rounding through f32 would land on the midpoint.
    mids = (random_finite_bf16(rng, 4000).astype(np.uint32) << 16 | 0x8000).view(np.float32).astype(np.float64)
    mids = mids[np.isfinite(mids) & (mids != 0)]
    values = np.concatenate([mids * (1 + 2.0**-40), mids * (1 - 2.0**-40), rng.normal(size=2000) * 1e3])
    got = bf16.f64_to_bf16(values)
    assert got.tolist() == [ref_bf16(Fraction(float(v))) for v in values]


def test_mul_and_div_round_the_f32_result():
    rng = np.random.default_rng(3)
    a = random_finite_bf16(rng, 5000)
    b = random_finite_bf16(rng, a.size)
    with np.errstate(all="ignore"):
        prod32 = bf16.bf16_to_f32(a) * bf16.bf16_to_f32(b)
        quot32 = bf16.bf16_to_f32(a) / bf16.bf16_to_f32(b)
    for got, f32 in ((bf16.bf16_mul(a, b), prod32), (bf16.bf16_div(a, b), quot32)):
        ok = np.isfinite(f32)
        want = [ref_bf16(Fraction(float(v)), negative_zero=bool(np.signbit(v))) for v in f32[ok]]
        assert got[ok].tolist() == want


def ref_fma(a: int, b: int, c: int) -> int:
    """Exact a·b + c with one RNE rounding to BF16, IEEE signed-zero rules."""
    va, vb, vc = bf16_value(a), bf16_value(b), bf16_value(c)
    exact = va * vb + vc
    if exact != 0:
        return ref_bf16(exact)
    product_negative = bool((a ^ b) & 0x8000)
    both_negative_zeros = va * vb == 0 and vc == 0 and product_negative and bool(c & 0x8000)
    return ref_bf16(exact, negative_zero=both_negative_zeros)


def _fma_cases(rng, count):
    a, b, c = (random_finite_bf16(rng, count) for _ in range(3))
    # Near-midpoint cases: a·b is a 16-bit product around 1; c is a tiny nudge of either sign.
    ma = rng.integers(128, 256, size=count)
    mb = rng.integers(128, 256, size=count)
    near_a = (0x3F80 | (ma & 0x7F)).astype(np.uint16)
    near_b = (0x3F80 | (mb & 0x7F)).astype(np.uint16)
    exps = rng.integers(1, 120, size=count)
    near_c = ((exps << 7) | rng.integers(0, 128, size=count) | rng.choice([0, 0x8000], size=count)).astype(np.uint16)
    # Cancellation cases: c ≈ −a·b.
    ca, cb = random_finite_bf16(rng, count), random_finite_bf16(rng, count)
    cc = (bf16.bf16_mul(ca, cb) ^ np.uint16(0x8000)) + rng.integers(-2, 3, size=count).astype(np.uint16)
    keep = (cc & 0x7FFF) < 0x7F80
    return (np.concatenate([a, near_a, ca[keep]]), np.concatenate([b, near_b, cb[keep]]),
            np.concatenate([c, near_c, cc[keep]]))


def test_fma_is_single_rounding_on_random_and_adversarial_triples():
    rng = np.random.default_rng(4)
    a, b, c = _fma_cases(rng, 6000)
    got = bf16.bf16_fma(a, b, c)
    want = np.array([ref_fma(int(x), int(y), int(z)) for x, y, z in zip(a, b, c)], dtype=np.uint16)
    finite = (want & 0x7FFF) <= 0x7F80
    mismatch = np.nonzero(got[finite] != want[finite])[0]
    assert mismatch.size == 0, [(hex(a[i]), hex(b[i]), hex(c[i]), hex(got[i]), hex(want[i])) for i in mismatch[:5]]


def test_fma_differs_from_separate_rounding_where_it_must():
    # An exact product on a BF16 midpoint that ties down, plus a tiny positive addend: fused
    # rounding goes up; rounding the product first (then adding the tiny c) stays down.
    for ma in range(128, 256):
        for mb in range(128, 256):
            p = ma * mb
            drop = p.bit_length() - 8
            if p & ((1 << drop) - 1) == 1 << (drop - 1) and not (p >> drop) & 1:
                a, b = np.uint16(0x3F00 | ma), np.uint16(0x3F00 | mb)  # ma/256, mb/256 in [0.5, 1)
                fused = bf16.bf16_fma(a, b, np.uint16(0x2B80))  # + 2^-40
                assert fused == bf16.bf16_mul(a, b) + 1 == ref_fma(int(a), int(b), 0x2B80)
                return
    raise AssertionError("no midpoint product found")


@pytest.mark.parametrize(
    "a,b,c,want",
    [(0x3F80, 0x4000, 0x3F80, 0x4040), (0x4049, 0x3FCC, 0xBF80, 0x4080), (0x3F00, 0x3F00, 0x3F00, 0x3F40),
     (0x4228, 0x3D23, 0x40B0, 0x40E5), (0xBF80, 0x4000, 0x4080, 0x4000), (0x4315, 0x3F80, 0x3B95, 0x4315)],
)
def test_fma_reference_vectors(a, b, c, want):
    # Pearl's compute.rs vectors (zk-pow/src/v4/api/compute.rs @ 08ec7513).
    assert int(bf16.bf16_fma(np.uint16(a), np.uint16(b), np.uint16(c))) == want


def test_fma_propagates_nan_and_inf():
    nan, inf = np.uint16(0x7FC0), np.uint16(0x7F80)
    assert bf16.bf16_is_nan(bf16.bf16_fma(nan, np.uint16(0x3F80), np.uint16(0)))
    assert bf16.bf16_fma(inf, np.uint16(0x3F80), np.uint16(0x3F80)) == 0x7F80
    assert bf16.bf16_is_nan(bf16.bf16_fma(inf, np.uint16(0x3F80), np.uint16(0xFF80)))


def test_min_max_propagate_nan_and_clamp():
    nan = np.uint16(0x7FC0)
    one, two = np.uint16(0x3F80), np.uint16(0x4000)
    assert bf16.bf16_max(one, two) == two and bf16.bf16_min(one, two) == one
    for f in (bf16.bf16_max, bf16.bf16_min):
        assert bf16.bf16_is_nan(f(nan, one)) and bf16.bf16_is_nan(f(one, nan))
    bound = 0x43E0  # 448
    x = np.array([0x4400, 0xC400, 0x3F80, 0x7FC0, 0x7F80, 0xFF80], dtype=np.uint16)
    clamped = bf16.bf16_clamp_symmetric(x, bound)
    assert clamped[:3].tolist() == [0x43E0, 0xC3E0, 0x3F80]
    assert bf16.bf16_is_nan(clamped[3])
    assert clamped[4:].tolist() == [0x43E0, 0xC3E0]


def ref_sqrt_bf16(v: Fraction) -> int:
    """RNE_bf16(√v) by bracketing: the code c with mid(c−1, c)² < v < mid(c, c+1)², ties to even."""
    if v == 0:
        return 0
    guess = int(bf16.f64_to_bf16(np.float64(math.sqrt(float(v)))))
    for code in range(max(0, guess - 3), guess + 4):
        lo = (bf16_value(code - 1) + bf16_value(code)) / 2 if code > 0 else Fraction(0)
        hi = (bf16_value(code) + bf16_value(code + 1)) / 2
        above_lo = lo * lo < v or (lo * lo == v and code % 2 == 0)
        below_hi = v < hi * hi or (v == hi * hi and code % 2 == 0)
        if above_lo and below_hi:
            return code
    raise AssertionError("no bracket")


def test_sqrt_ratio_is_correctly_rounded():
    rng = np.random.default_rng(5)
    cases = [(int(rng.integers(1, 1 << 60)), int(rng.integers(1, 1 << 17)), int(rng.integers(-330, 200)))
             for _ in range(1500)]
    cases += [(9, 4, 0), (1, 1, -266), (1, 1, -267), (3, 1, -268), (1, 1, 0), (2, 1, 0)]
    for num, den, exp in cases:
        v = Fraction(num * 2**max(exp, 0), den * 2**max(-exp, 0))
        assert bf16.rne_bf16_sqrt_ratio(num, den, exp) == ref_sqrt_bf16(v), (num, den, exp)


def test_sqrt_ratio_rejects_bad_input():
    with pytest.raises(ValueError):
        bf16.rne_bf16_sqrt_ratio(-1, 1, 0)
    with pytest.raises(ValueError, match="overflows"):
        bf16.rne_bf16_sqrt_ratio(1, 1, 258)


# --- e4m3 ------------------------------------------------------------------------------------------


def test_e4m3_decode_all_codes():
    for code in range(256):
        value = float(e4m3_to_f32(np.uint8(code)))
        sign, exp, man = code >> 7, (code >> 3) & 0xF, code & 7
        if exp == 15 and man == 7:
            assert math.isnan(value) and is_nan_code(np.uint8(code))
            continue
        magnitude = man * 2.0**-9 if exp == 0 else (1 + man / 8) * 2.0 ** (exp - 7)
        assert value == (-magnitude if sign else magnitude) and math.copysign(1, value) == (-1 if sign else 1)


def test_e4m3_encode_round_trips_every_finite_code():
    codes = np.array([c for c in range(256) if (c & 0x7F) != 0x7F], dtype=np.uint8)
    assert np.array_equal(f32_to_e4m3(e4m3_to_f32(codes)), codes)


def ref_e4m3(x: float) -> int:
    if not math.isfinite(x):
        return 0x7F | (0x80 if math.copysign(1, x) < 0 else 0)
    sign = 0x80 if math.copysign(1, x) < 0 else 0
    if x == 0:
        return sign
    e, n = ref_round(abs(Fraction(x)), 3, -6)
    code = n if e < -6 else ((e + 7) << 3) + n - 8
    return sign | (code if code <= 0x7E else 0x7F)


def test_e4m3_encode_is_exact_rne_with_nan_on_overflow():
    rng = np.random.default_rng(6)
    values = np.concatenate([
        rng.normal(size=4000).astype(np.float32) * np.exp2(rng.integers(-14, 10, size=4000)).astype(np.float32),
        np.array([1.0625, 1.0626, 2.0**-10, 2.0**-9, 448, 464, 464.01, 500, -0.0, 0.0, np.inf, -np.inf, np.nan],
                 dtype=np.float32),
    ])
    got = f32_to_e4m3(values)
    assert got.tolist() == [ref_e4m3(float(v)) for v in values]
    assert got[-13:-6].tolist() == [0x38, 0x39, 0x00, 0x01, 0x7E, 0x7E, 0x7F]
