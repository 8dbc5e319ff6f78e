"""proof.fp8.mma against a literal scalar re-statement of fp8-and-integration.md §8 and the §15 vectors."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from proof.fp8.e4m3 import e4m3_to_f32
from proof.fp8.mma import NO_BINADE, fp8_matmul, fp8_matmul_with_stats

# --- literal reference: one cell at a time, plain Python ints, exactly as §8 words it -------------

ZERO_SENTINEL = -139


def _f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def _f32_from_bits(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def _product_term(a: int, b: int) -> tuple[int, int, int]:
    """(sign, exponent, 24-bit-convention significand) of an exact e4m3 product."""
    def split(code):
        sign, exp, man = code >> 7, (code >> 3) & 0xF, code & 7
        sig = (man | 8) if exp != 0 else man
        return sign, (exp if exp != 0 else 1), sig

    sa, ea, ma = split(a)
    sb, eb, mb = split(b)
    sig = (ma * mb) << 17
    if sig == 0:
        return sa ^ sb, ZERO_SENTINEL, 0
    return sa ^ sb, ea + eb - 14, sig


def _float_term(x: float) -> tuple[int, int, int]:
    bits = _f32_bits(x)
    sign, exp, frac = bits >> 31, (bits >> 23) & 0xFF, bits & 0x7FFFFF
    if exp == 0 and frac == 0:
        return sign, ZERO_SENTINEL, 0
    if exp == 0:
        return sign, -126, frac
    return sign, exp - 127, frac | 0x800000


def _term_to_float(sign: int, exp: int, sig: int) -> float:
    if sig == 0:
        return -0.0 if sign else 0.0
    biased = exp + 127 if sig & 0x800000 else 0
    return _f32_from_bits((sign << 31) | (biased << 23) | (sig & 0x7FFFFF))


def _literal_group(terms: list[tuple[int, int, int]], width: int) -> tuple[int, int, int]:
    live = [t for t in terms if t[2] != 0]
    if not live:
        return 0, ZERO_SENTINEL, 0
    anchor = max(t[1] for t in live)
    total = 0
    for sign, exp, sig in live:
        if anchor - exp >= 32:
            continue
        scaled = sig >> (24 - width) if width <= 24 else sig << (width - 24)
        aligned = scaled >> (anchor - exp)
        total += -aligned if sign else aligned
    sign = 1 if total < 0 else 0
    mag = abs(total)
    if mag == 0:
        return 0, ZERO_SENTINEL, 0
    length = mag.bit_length()
    exp = anchor + length - width
    mag = mag >> (length - width) if length > width else mag << (width - length)
    if exp < -126:
        mag = mag >> min(-126 - exp, 63)
        exp = -126
    mag = mag << (24 - width) if width <= 24 else mag >> (width - 24)
    if mag == 0:
        return sign, ZERO_SENTINEL, 0
    return sign, exp, mag


def literal_cell(a_row, b_row, device: str) -> float:
    if any((c & 0x7F) == 0x7F for c in list(a_row) + list(b_row)):
        return float("nan")
    k = len(a_row)
    padded = k + (-k % 32)
    a_row = list(a_row) + [0] * (padded - k)
    b_row = list(b_row) + [0] * (padded - k)
    if device == "blackwell":
        acc = 0.0
        for g in range(0, padded, 32):
            terms = [_float_term(acc)] + [_product_term(a_row[u], b_row[u]) for u in range(g, g + 32)]
            acc = _term_to_float(*_literal_group(terms, 26))
        return acc
    total = np.float32(0.0)
    for w in range(0, padded, 128):
        window = 0.0
        for g in range(w, min(w + 128, padded), 32):
            terms = [_float_term(window)] + [_product_term(a_row[u], b_row[u]) for u in range(g, g + 32)]
            window = _term_to_float(*_literal_group(terms, 14))
        total = np.float32(total + np.float32(window))  # fp32 add, round to nearest even
        if total == 0:
            total = np.float32(0.0)
    return float(total)


def literal_matmul(a: np.ndarray, b: np.ndarray, device: str) -> np.ndarray:
    return np.array(
        [[literal_cell(a[i].tolist(), b[j].tolist(), device) for j in range(b.shape[0])] for i in range(a.shape[0])],
        dtype=np.float32,
    )


def _random_operands(rng, rows, k, codes, nan_rows=()):
    x = rng.choice(codes, size=(rows, k)).astype(np.uint8)
    nan = (x & 0x7F) == 0x7F
    x[nan] = rng.choice(np.arange(0x7F, dtype=np.uint8), size=int(nan.sum()))
    for r in nan_rows:
        x[r, rng.integers(k)] = rng.choice([0x7F, 0xFF])
    return x


ALL_CODES = np.arange(256)
SMALL_CODES = np.array([c | s for c in range(0, 0x20) for s in (0, 0x80)])  # zeros, subnormals, tiny
WIDE_CODES = np.array([0x00, 0x80, 0x01, 0x81, 0x07, 0x08, 0x7E, 0xFE, 0x77, 0xF7, 0x38, 0xB8])


@pytest.mark.parametrize("device", ["hopper", "blackwell"])
@pytest.mark.parametrize(
    "codes,k,seed",
    [(ALL_CODES, 320, 1), (ALL_CODES, 300, 2), (SMALL_CODES, 256, 3), (WIDE_CODES, 416, 4), (ALL_CODES, 32, 5)],
)
def test_model_matches_literal_restatement(device, codes, k, seed):
    rng = np.random.default_rng(seed)
    a = _random_operands(rng, 3, k, codes, nan_rows=(2,))
    b = _random_operands(rng, 4, k, codes, nan_rows=(3,))
    got = fp8_matmul(device, a, b)
    want = literal_matmul(a, b, device)
    assert np.isnan(got[2]).all() and np.isnan(got[:, 3]).all()
    assert np.array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    assert np.array_equal(got[finite].view(np.uint32), want[finite].view(np.uint32))


@pytest.mark.parametrize("device", ["hopper", "blackwell"])
def test_every_code_against_the_literal_restatement(device):
    # Row r of A carries code r (all 256, NaN rows included) at four positions among random codes.
    rng = np.random.default_rng(6)
    a = _random_operands(rng, 256, 64, ALL_CODES)
    a[:, [0, 9, 33, 63]] = np.arange(256, dtype=np.uint8)[:, None]
    b = _random_operands(rng, 6, 64, ALL_CODES)
    got = fp8_matmul(device, a, b)
    want = literal_matmul(a, b, device)
    assert np.isnan(got[[0x7F, 0xFF]]).all() and np.array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    assert np.array_equal(got[finite].view(np.uint32), want[finite].view(np.uint32))


def test_large_then_tiny_products_drop_below_the_window():
    # A large accumulated total followed by tiny products: terms ≥ 32 binades below the anchor vanish.
    k = 256
    a = np.zeros((1, k), dtype=np.uint8)
    b = np.zeros((1, k), dtype=np.uint8)
    a[0, :64], b[0, :64] = 0x7E, 0x7E  # 448 · 448
    a[0, 64:], b[0, 64:] = 0x01, 0x01  # 2^-9 · 2^-9
    for device in ("hopper", "blackwell"):
        got = fp8_matmul(device, a, b)
        assert got.view(np.uint32)[0, 0] == np.float32(literal_cell(a[0].tolist(), b[0].tolist(), device)).view(np.uint32)


# --- §15 Hopper replay vectors (v4 utils.rs @ 08ec7513) -------------------------------------------

def _one(device, a, b):
    return fp8_matmul(device, np.asarray([a], dtype=np.uint8), np.asarray([b], dtype=np.uint8))[0, 0]


@pytest.mark.parametrize("k,expected", [(1056, 32.0), (1088, 64.0), (1120, 96.0), (1152, 128.0)])
def test_hopper_partial_last_window(k, expected):
    a = np.zeros(k, dtype=np.uint8)
    a[1024:] = 0x38
    assert _one("hopper", a, np.full(k, 0x38, dtype=np.uint8)) == expected


def test_hopper_cancelling_pair_is_positive_zero():
    a = np.zeros(1024, dtype=np.uint8)
    a[0], a[1] = 0x78, 0xF8
    result = _one("hopper", a, np.full(1024, 0x38, dtype=np.uint8))
    assert np.float32(result).view(np.uint32) == 0


def test_hopper_policy_replay_all_ones():
    ones = np.full((1, 256), 0x38, dtype=np.uint8)
    acc, stats = fp8_matmul_with_stats("hopper", ones, ones)
    assert acc[0, 0] == 256.0
    assert stats.z_binades[0, 0].tolist() == [7, 7]
    assert stats.m_binades[0, 0] == 8
    assert stats.window_k == 128


def test_hopper_stats_see_cancelled_products():
    # Opposite products cancel to +0, yet Z and M still record the products' binade (utils.rs test).
    rng = np.random.default_rng(7)
    for a_code, b_code in rng.integers(0, 0x7F, size=(60, 2)):
        a = np.zeros((1, 32), dtype=np.uint8)
        b = np.zeros((1, 32), dtype=np.uint8)
        a[0, :2] = a_code
        b[0, 0], b[0, 1] = b_code, b_code ^ 0x80
        acc, stats = fp8_matmul_with_stats("hopper", a, b)
        product = float(e4m3_to_f32(a_code)) * float(e4m3_to_f32(b_code))
        expected = NO_BINADE if product == 0 else int(np.floor(np.log2(product)))
        assert acc.view(np.uint32)[0, 0] == 0
        assert stats.m_binades[0, 0] == expected and stats.z_binades[0, 0].tolist() == [expected]


def _window_local(a_row, b_row) -> float:
    window = 0.0
    for g in range(0, len(a_row), 32):
        terms = [_float_term(window)] + [_product_term(a_row[u], b_row[u]) for u in range(g, g + 32)]
        window = _term_to_float(*_literal_group(terms, 14))
    return window


@pytest.mark.parametrize("device", ["hopper", "blackwell"])
def test_stats_match_literal_restatement(device):
    rng = np.random.default_rng(11)
    k = 384
    a = _random_operands(rng, 2, k, WIDE_CODES)
    b = _random_operands(rng, 3, k, ALL_CODES)
    _, stats = fp8_matmul_with_stats(device, a, b)
    for i in range(2):
        for j in range(3):
            z, m = _literal_stats_cell(a[i].tolist(), b[j].tolist(), device)
            assert stats.z_binades[i, j].tolist() == z
            assert stats.m_binades[i, j] == m


def _literal_stats_cell(a_row, b_row, device):
    from fractions import Fraction

    def binade(x):
        x = abs(Fraction(x))
        if x == 0:
            return NO_BINADE
        e = x.numerator.bit_length() - x.denominator.bit_length()
        return e if Fraction(2) ** e <= x else e - 1

    products = [Fraction(float(x)) * Fraction(float(y)) for x, y in
                zip(e4m3_to_f32(np.array(a_row, dtype=np.uint8)), e4m3_to_f32(np.array(b_row, dtype=np.uint8)))]
    k = len(products)
    if device == "blackwell":
        mags = [binade(p) for p in products]
        mags += [binade(literal_cell(a_row[:g], b_row[:g], device)) for g in range(32, k + 1, 32)]
        return [max(mags)], max(mags)
    z_windows, m_cell = [], NO_BINADE
    for w in range(0, k, 128):
        total = Fraction(literal_cell(a_row[:w], b_row[:w], "hopper")) if w else Fraction(0)
        z = NO_BINADE
        for g in range(w, min(w + 128, k), 32):
            local = Fraction(_window_local(a_row[w:g + 32], b_row[w:g + 32]))
            group = [binade(p) for p in products[g:g + 32]]
            z = max([z, binade(local)] + group)
            m_cell = max([m_cell, binade(total + local)] + group)
        z_windows.append(z)
    return z_windows, m_cell


def test_operand_validation():
    with pytest.raises(ValueError, match="same positive k"):
        fp8_matmul("hopper", np.zeros((1, 32), np.uint8), np.zeros((1, 64), np.uint8))
    with pytest.raises(ValueError, match="uint8"):
        fp8_matmul("hopper", np.zeros((1, 32), np.int8), np.zeros((1, 32), np.uint8))
    with pytest.raises(ValueError, match="unknown FP8 device"):
        fp8_matmul("ampere", np.zeros((1, 32), np.uint8), np.zeros((1, 32), np.uint8))
