"""proof.fp8.prequant: §15 pre-quantization vectors, the exact l2 rule and the reference encoder."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from proof.fp8.bf16 import bf16_to_f32, f32_to_bf16
from proof.fp8.prequant import l2_frame_width, open_values, prequantize, round_l2, row_norms

MASK64 = (1 << 64) - 1

CASE_INTS = np.array([
    [5, -3, 127, 0, 1, -1, 64, -64, 2, 100, -100, 7, -7, 33, -33, 12],
    [-1, 1, -2, 2, 3, -3, 4, -4, 8, -8, 16, -16, 32, -32, 63, -63],
], dtype=np.int8)
CASE_SCALES = np.array([[0x3CA0, 0x4020], [0x3F00, 0x3D00]], dtype=np.uint16)


def test_open_2x16_case():
    opened = open_values(CASE_INTS, CASE_SCALES)
    assert [f"{v:04x}" for v in opened[0]] == (
        "3dc8 bd70 401f 0000 3ca0 bca0 3fa0 bfa0 40a0 437a c37a 418c c18c 42a5 c2a5 41f0".split())
    assert [f"{v:04x}" for v in opened[1]] == (
        "bf00 3f00 bf80 3f80 3fc0 bfc0 4000 c000 3e80 be80 3f00 bf00 3f80 bf80 3ffc bffc".split())


def test_exact_norms_2x16_case():
    l2, linf = row_norms(CASE_INTS, CASE_SCALES)
    assert list(zip(l2.tolist(), linf.tolist())) == [(0x42BC, 0x437A), (0x3FA0, 0x4000)]


def xorshift_row(seed: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Pearl's seeded test row (zk-pow/src/v4/api/prequant.rs tests @ 08ec7513): xorshift64
    (<<13, >>7, <<17) from (seed · 0x9E3779B97F4A7C15) | 1; k ints = low byte as i8, then k/8
    scales = 0x3C00 + next % 0x400."""
    state = ((seed * 0x9E3779B97F4A7C15) & MASK64) | 1

    def draw() -> int:
        nonlocal state
        state ^= (state << 13) & MASK64
        state ^= state >> 7
        state ^= (state << 17) & MASK64
        return state

    ints = [(draw() & 0xFF) for _ in range(k)]
    scales = [0x3C00 + draw() % 0x400 for _ in range(k // 8)]
    return (np.array(ints, dtype=np.uint8).view(np.int8)[None, :], np.array([scales], dtype=np.uint16))


@pytest.mark.parametrize("seed,k,expected", [(877130, 1024, 0x4224), (110113, 2048, 0x422C)])
def test_l2_pins_from_xorshift_rows(seed, k, expected):
    ints, scales = xorshift_row(seed, k)
    assert row_norms(ints, scales)[0][0] == expected


def test_l2_pin_huge_scale():
    ints = np.ones((1, 1024), dtype=np.int8)
    scales = np.full((1, 128), (127 + 60) << 7, dtype=np.uint16)  # 2^60
    assert row_norms(ints, scales)[0][0] == 0x5D80


@pytest.mark.parametrize("k,expected", [(1024, 17), (2080, 15), (65536, 11), (1 << 27, 0)])
def test_l2_frame_width(k, expected):
    assert l2_frame_width(k) == expected


def test_l2_frame_width_rejects_out_of_range():
    for k in (0, (1 << 27) + 1):
        with pytest.raises(ValueError):
            l2_frame_width(k)


@pytest.mark.parametrize("code,expected", [(0x3F80, 0x3F80), (0x3F81, 0x3F80), (0x3F82, 0x3F84),
                                           (0x3F83, 0x3F84), (0x3F84, 0x3F84), (0x3FFF, 0x4000)])
def test_round_l2(code, expected):
    assert round_l2(code) == expected


@pytest.mark.parametrize(
    "row,scale,expected",
    [([1.0] * 8, 0x3F80, (0x3F80, 0x3F80)), ([1.0, -2.0, 3.0, -4.0] * 2, 0x3F80, (0x4030, 0x4080)),
     ([0.0] * 8, 0x3F80, (0, 0)), ([0.5, 0.25, -0.75, 1.5, -2.0, 0.125, 3.0, -1.0], 0x3E00, (0x3FBC, 0x4040))],
)
def test_row_norms_vectors(row, scale, expected):
    # Pearl's row_norms vectors (quantization.rs @ 08ec7513) hold BF16 rows; each is exactly a
    # prequant row with a power-of-two scale, where the f32 and exact rules agree. [1,−2,3,−4] has
    # the same mean square when repeated to one 8-wide block.
    row = np.array([row], dtype=np.float32)
    codes = (row / bf16_to_f32(np.uint16(scale))).astype(np.int8)
    scales = np.array([[scale]], dtype=np.uint16)
    assert np.array_equal(bf16_to_f32(open_values(codes, scales)), row)
    l2, linf = row_norms(codes, scales)
    assert (int(l2[0]), int(linf[0])) == expected


# --- the exact rule, restated literally with Python integers --------------------------------------


def _bf16_value(code: int) -> Fraction:
    return Fraction(float(bf16_to_f32(np.uint16(code))))


def literal_l2(ints: list[int], scales: list[int]) -> int:
    k = len(ints)
    wl2 = 27 - math.ceil(math.log2(k))
    blocks = []
    for b, code in enumerate(scales):
        exp = (code & 0x7FFF) >> 7
        m = (code & 0x7F) + (128 if exp else 0)
        e_star = exp if exp else 1
        blocks.append((m * m * sum(q * q for q in ints[8 * b:8 * b + 8]), 2 * e_star))
    live = [e for p, e in blocks if p]
    if not live:
        return 0
    e_max = max(live)
    s = sum((p * 2**wl2) // 2 ** (e_max - e) for p, e in blocks if p)
    v = Fraction(s) * Fraction(2) ** (e_max - 268 - wl2) / k
    return (_bracket_sqrt(v) + 2) & ~3


def _bracket_sqrt(v: Fraction) -> int:
    """The BF16 code c with mid(c−1, c)² < v < mid(c, c+1)² (ties to even): RNE of √v."""
    guess = int(np.float32(math.sqrt(float(v))).view(np.uint32) >> 16)
    for code in range(max(0, guess - 2), guess + 3):
        lo = (_bf16_value(code - 1) + _bf16_value(code)) / 2 if code else Fraction(0)
        hi = (_bf16_value(code) + _bf16_value(code + 1)) / 2
        if (lo * lo < v or (lo * lo == v and code % 2 == 0)) and (v < hi * hi or (v == hi * hi and code % 2 == 0)):
            return code
    raise AssertionError("no bracket")


def test_l2_matches_literal_rule_on_random_rows():
    rng = np.random.default_rng(8)
    for trial in range(40):
        k = int(rng.choice([8, 16, 64, 1024, 2080]))
        ints = rng.integers(-127, 128, size=(1, k)).astype(np.int8)
        ints[0, rng.random(k) < 0.3] = 0
        exps = rng.integers(0, 230, size=k // 8) if trial % 2 else rng.integers(120, 135, size=k // 8)
        scales = ((exps << 7) | rng.integers(0, 128, size=k // 8)).astype(np.uint16)[None, :]
        l2, _ = row_norms(ints, scales)
        assert int(l2[0]) == literal_l2(ints[0].tolist(), scales[0].tolist())


def test_linf_is_the_exact_block_peak():
    rng = np.random.default_rng(9)
    ints = rng.integers(-127, 128, size=(5, 64)).astype(np.int8)
    scales = rng.integers(0x3000, 0x4800, size=(5, 8)).astype(np.uint16)
    _, linf = row_norms(ints, scales)
    for r in range(5):
        peak = max(abs(int(q)) * _bf16_value(int(scales[r, j // 8])) for j, q in enumerate(ints[r]))
        assert np.float32(float(peak)) == float(peak)  # exact in f32
        assert linf[r] == f32_to_bf16(np.float32(float(peak)))


def test_plane_validation():
    with pytest.raises(ValueError, match="not finite"):
        row_norms(np.ones((1, 8), np.int8), np.array([[0x7F80]], np.uint16))
    with pytest.raises(ValueError, match="shape"):
        open_values(np.ones((1, 16), np.int8), np.array([[0x3F80]], np.uint16))
    with pytest.raises(ValueError, match="int8"):
        row_norms(np.ones((1, 8), np.uint8), np.array([[0x3F80]], np.uint16))
    with pytest.raises(ValueError, match="overflows"):
        open_values(np.full((1, 8), 127, np.int8), np.array([[0x7F7F]], np.uint16))


# --- the reference encoder, restated per element with f32 scalars ----------------------------------


def test_prequantize_matches_literal_encoder():
    rng = np.random.default_rng(10)
    x = (rng.normal(size=(3, 64)) * np.exp2(rng.integers(-20, 20, size=(3, 1)))).astype(np.float32)
    x[1, 8:16] = 0.0
    codes, scales = prequantize(x)
    inv127 = np.float32(1) / np.float32(127)
    for r in range(3):
        for b in range(8):
            block = x[r, 8 * b:8 * b + 8]
            amax = max(np.float32(np.max(np.abs(block))), np.float32(2.0**-100))
            scale_f32 = np.float32(amax * inv127)
            scale_bits = int(np.array([scale_f32], dtype=np.float32).view(np.uint32)[0])
            scale_bits = (scale_bits + 0x7FFF + ((scale_bits >> 16) & 1)) >> 16
            assert scales[r, b] == scale_bits
            rcp = np.float32(1) / np.float32(bf16_to_f32(np.uint16(scale_bits)))
            for j in range(8):
                q = int(np.clip(np.rint(np.float32(block[j] * rcp)), -127, 127))
                assert codes[r, 8 * b + j] == q
    assert codes.min() >= -127


def test_prequantize_rejects_bad_input():
    with pytest.raises(ValueError, match="multiple of 8"):
        prequantize(np.ones((2, 12), np.float32))
    with pytest.raises(ValueError, match="finite"):
        prequantize(np.full((1, 8), np.inf, np.float32))
