"""proof.fp8.quantization: §15 scale constants, row scales, the B200 pin, and a literal element op."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from proof.fp8.bf16 import bf16_to_f32
from proof.fp8.e4m3 import is_nan_code
from proof.fp8.noise import noise_line, noise_lines
from proof.fp8.quantization import (
    NoisyRows,
    noise_dot,
    noisy_code,
    noisy_quantize,
    row_scales,
    scale_constants,
)

E_LINE = bytes.fromhex("be3adfead867e55be469dd50e9e85c50dfdc64e2dfe4eae2e8d6596a6746dd65")
F_LINE = bytes.fromhex("c65268603369d96362e16a5f6ae6615fe6db43eae463e2d3eae55ae3bb5f54e3")


@pytest.mark.parametrize(
    "rank,delta_r,delta_over_std",
    [(1, 0x3F00, 0x3700), (4, 0x3F80, 0x3780), (16, 0x4000, 0x3800), (64, 0x4080, 0x3880),
     (128, 0x40B5, 0x38B5), (256, 0x4100, 0x3900), (1024, 0x4180, 0x3980), (4096, 0x4200, 0x3A00)],
)
def test_blackwell_scale_constants(rank, delta_r, delta_over_std):
    assert scale_constants("blackwell", rank) == (delta_r, delta_over_std)


def test_scale_constants_at_protocol_rank():
    assert scale_constants("hopper") == (0x40B5, 0x38B5)
    assert scale_constants("blackwell") == (0x4035, 0x3835)


@pytest.mark.parametrize(
    "l2,linf,rank,alpha,beta",
    [(0x3F80, 0x3F80, 16, 0x4315, 0x3B95), (0x3F80, 0x4080, 16, 0x4295, 0x3B15),
     (0x2F80, 0x2F80, 16, 0x5315, 0x3B95), (0x3F00, 0x4040, 64, 0x42B3, 0x3B33)],
)
def test_derive_row_scales_vectors(l2, linf, rank, alpha, beta):
    assert row_scales("blackwell", l2, linf, rank) == (alpha, beta)


def test_zero_norms_are_floored():
    assert row_scales("blackwell", 0, 0, 16) == row_scales("blackwell", 0x2F80, 0x2F80, 16)


def test_b200_quantization_pin():
    assert noise_line(bytes([0x22] * 32), "A", "E", 7) == E_LINE
    noise = noise_dot("blackwell", E_LINE, F_LINE)
    assert noise == 1161306624
    alpha, beta = row_scales("blackwell", 0x3F80, 0x4000)
    assert (alpha, beta) == (17082, 15236)
    assert noisy_code(alpha, beta, 0x3F80, noise) == 109


# --- literal element op with exact rationals -------------------------------------------------------


def _value(bits: int) -> Fraction:
    return Fraction(float(bf16_to_f32(np.uint16(bits))))


def _round(q: Fraction, mantissa_bits: int, min_exp: int, max_code: int) -> int:
    """RNE of a rational onto a sign-magnitude binary format: (sign, magnitude code, −1 on overflow)."""
    sign = 0
    if q < 0:
        q, sign = -q, 1
    if q == 0:
        return sign, 0
    e = q.numerator.bit_length() - q.denominator.bit_length()
    if Fraction(2) ** e > q:
        e -= 1
    steps = q / Fraction(2) ** (max(e, min_exp) - mantissa_bits)
    n = int(steps)
    if steps - n > Fraction(1, 2) or (steps - n == Fraction(1, 2) and n % 2):
        n += 1
    code = n if e < min_exp else ((e - min_exp + 1) << mantissa_bits) + n - (1 << mantissa_bits)
    return sign, (code if code <= max_code else -1)


def literal_noisy_code(alpha: int, beta: int, x: int, noise_f32: float) -> int:
    s, n = _round(Fraction(noise_f32), 7, -126, 0x7F7F)
    noise_bf16 = _value(n | (s << 15))
    s, t = _round(_value(beta) * noise_bf16, 7, -126, 0x7F7F)
    s, v = _round(_value(alpha) * _value(x) + _value(t | (s << 15)), 7, -126, 0x7F7F)
    value = min(max(_value(v | (s << 15)), Fraction(-448)), Fraction(448))
    s, code = _round(value, 3, -6, 0x7E)
    return code | (s << 7)


def test_noisy_code_matches_literal_element_op():
    rng = np.random.default_rng(13)
    for _ in range(3000):
        l2, linf = (int(v) for v in rng.integers(0x3000, 0x4800, size=2))
        alpha, beta = row_scales(str(rng.choice(["hopper", "blackwell"])), l2, linf)
        x = int(rng.integers(0, 0x4800)) | int(rng.choice([0, 0x8000]))
        noise = np.float32(rng.normal() * 65536 / 5.66)
        noise_bits = int(np.array([noise]).astype(np.float32).view(np.uint32)[0])
        got = noisy_code(alpha, beta, x, noise_bits)
        assert got == literal_noisy_code(alpha, beta, x, float(noise)), (alpha, beta, x, noise)


def test_noisy_code_clamps_and_keeps_nan():
    assert noisy_code(0x4315, 0x3B95, 0x4700, 0) == 0x7E  # 149 · 32768 clamps to +448
    assert noisy_code(0x4315, 0x3B95, 0xC700, 0) == 0xFE
    assert is_nan_code(np.uint8(noisy_code(0x4315, 0x3B95, 0x7FC0, 0)))


@pytest.mark.parametrize("device", ["hopper", "blackwell"])
def test_noisy_quantize_equals_per_element_scalar_path(device):
    rng = np.random.default_rng(14)
    rows, k = 3, 96
    x = (rng.integers(0x3A00, 0x4100, size=(rows, k)) | rng.choice([0, 0x8000], size=(rows, k))).astype(np.uint16)
    l2 = rng.integers(0x3E00, 0x3F80, size=rows).astype(np.uint16)
    linf = rng.integers(0x3F80, 0x4100, size=rows).astype(np.uint16)
    seed = bytes(range(32))
    e = noise_lines(seed, "A", "E", np.arange(rows) + 5)
    f = noise_lines(seed, "A", "F", np.arange(k))
    built = noisy_quantize(device, x, l2, linf, e, f)
    assert isinstance(built, NoisyRows) and built.codes.shape == (rows, k)
    for i in range(rows):
        alpha, beta = row_scales(device, int(l2[i]), int(linf[i]))
        assert (int(built.alpha[i]), int(built.beta[i])) == (alpha, beta)
        assert built.l2f[i] == l2[i]
        for u in range(k):
            noise = noise_dot(device, e[i].tobytes(), f[u].tobytes())
            assert built.codes[i, u] == noisy_code(alpha, beta, int(x[i, u]), noise)


def test_input_validation():
    with pytest.raises(ValueError, match="32 e4m3 bytes"):
        noise_dot("hopper", b"\x38" * 16, b"\x38" * 32)
    with pytest.raises(ValueError, match="BF16 bit patterns"):
        row_scales("hopper", -1, 0x3F80)
    with pytest.raises(ValueError, match="rows"):
        noisy_quantize("hopper", np.zeros((2, 32), np.uint16), np.zeros(2, np.uint16), np.zeros(2, np.uint16),
                       np.zeros((3, 32), np.uint8), np.zeros((32, 32), np.uint8))
