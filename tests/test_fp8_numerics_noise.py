"""proof.fp8.noise: the §15 noise-line pins and a literal restatement of the §6 normalisation."""
from __future__ import annotations

import math

import numpy as np
import pytest

from proof.fp8.e4m3 import e4m3_to_f32, f32_to_e4m3
from proof.fp8.noise import noise_line, noise_lines, normalize_draws

SEED_A = bytes([0x22] * 32)
SEED_B = bytes([0x11] * 32)


def test_pin_e_a_line_7():
    assert noise_line(SEED_A, "A", "E", 7).hex() == "be3adfead867e55be469dd50e9e85c50dfdc64e2dfe4eae2e8d6596a6746dd65"


def test_pin_f_a_line_0_keyed_by_seed_b():
    assert noise_line(SEED_B, "A", "F", 0).hex() == "c65268603369d96362e16a5f6ae6615fe6db43eae463e2d3eae55ae3bb5f54e3"


def test_vectorised_lines_equal_single_lines():
    lines = np.array([0, 1, 7, 1000, 2**32 - 1])
    many = noise_lines(SEED_B, "B", "E", lines)
    assert many.shape == (5, 32) and many.dtype == np.uint8
    for row, line in zip(many, lines):
        assert row.tobytes() == noise_line(SEED_B, "B", "E", int(line))


def test_addresses_are_distinct():
    draws = {noise_line(SEED_B, side, factor, 3) for side in "AB" for factor in "EF"}
    assert len(draws) == 4
    assert noise_line(SEED_A, "A", "E", 3) != noise_line(SEED_B, "A", "E", 3)


def _rne_bf16(x: float) -> float:
    bits = int(np.array([x], dtype=np.float32).view(np.uint32)[0])
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return float(np.array([bits], dtype=np.uint32).view(np.float32)[0])


def literal_line(raw: bytes) -> list[float]:
    xs = [(-1 if b & 0x80 else 1) * ((b & 0x7F) + 1) for b in raw]
    c = math.isqrt(sum(x * x for x in xs) * 1024)
    scale = _rne_bf16(float(np.float32(_rne_bf16(8192.0)) / np.float32(_rne_bf16(float(c)))))
    return [_rne_bf16(float(np.float32(x) * np.float32(scale))) for x in xs]


def test_normalisation_matches_literal_restatement():
    rng = np.random.default_rng(12)
    raw = rng.integers(0, 256, size=(300, 32)).astype(np.uint8)
    raw[0] = 0x7F  # every sample +128
    raw[1] = 0x80  # every sample −1
    raw[2] = 0x00  # one large outlier among +1s
    raw[2, 0] = 0xFF
    codes = normalize_draws(raw)
    # The final e4m3 RNE uses f32_to_e4m3, proven against a rational reference in test_fp8_numerics_bf16.
    want = np.array([f32_to_e4m3(np.array(literal_line(raw[r].tobytes()), dtype=np.float32))
                     for r in range(raw.shape[0])])
    assert np.array_equal(codes, want)
    decoded = e4m3_to_f32(codes).astype(np.float64)
    norms = np.sqrt((decoded ** 2).sum(axis=1))
    assert np.all(np.abs(norms - 256) < 0.1 * 256)
    assert np.all(decoded != 0)


def test_input_validation():
    with pytest.raises(ValueError, match="32 bytes"):
        noise_line(b"short", "A", "E", 0)
    with pytest.raises(ValueError, match="side"):
        noise_line(SEED_A, "C", "E", 0)
    with pytest.raises(ValueError, match="2\\^32"):
        noise_line(SEED_A, "A", "E", 2**32)
