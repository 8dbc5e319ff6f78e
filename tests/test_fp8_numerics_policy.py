"""proof.fp8.policy: §15 unpredictability vectors, λ against real logarithms, and the three checks."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from proof.fp8.bf16 import bf16_to_f32
from proof.fp8.mma import fp8_matmul_with_stats
from proof.fp8.noise import noise_lines
from proof.fp8.policy import (
    SKIP_THRESHOLD_OFFSET,
    budget,
    check_policy,
    count_skippable,
    grid_exponent,
    grid_exponent_from_binades,
    lambda_scores,
    log2_fixed,
    summand_score,
)
from proof.fp8.prequant import open_values, prequantize, row_norms
from proof.fp8.quantization import noisy_quantize

SEED_A = bytes([0x22] * 32)
SEED_B = bytes([0x11] * 32)


def test_skip_offset():
    assert SKIP_THRESHOLD_OFFSET == 45952


def test_grid_exponent_pins():
    assert grid_exponent("hopper", 128, 256) == 151
    assert grid_exponent("blackwell", 256, 256) == 147
    assert grid_exponent("hopper", 128.0, 256.0) == 151
    assert grid_exponent("hopper", 0, 0) == 0
    assert grid_exponent("hopper", 1.0, 0) != 0 and grid_exponent("hopper", 0, 1.0) != 0


def test_grid_exponent_rejects_bad_magnitudes():
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            grid_exponent("hopper", bad, 1)


def test_lambda_pins():
    assert summand_score("blackwell", 7 << 7, 0, 95 << 7) == 12928
    assert summand_score("hopper", 7 << 7, 0, 95 << 7) == 13056


def test_budget_and_log2_pins():
    assert budget(1024, 1, 1) == 51
    assert log2_fixed(1 << 13) == 832
    assert log2_fixed((1 << 16) - 1) == 1023
    assert log2_fixed(0) == 0


def test_log2_fixed_matches_real_logarithm():
    n = np.arange(1, 1 << 16)
    want = np.floor(64 * np.log2(n.astype(np.float64))).astype(np.int64)
    got = np.array([log2_fixed(int(v)) for v in n[::7]])
    assert np.array_equal(got, want[::7])
    assert all(log2_fixed(1 << t) == 64 * t for t in range(16))


def _value(bits: int) -> Fraction:
    return Fraction(float(bf16_to_f32(np.uint16(bits))))


@pytest.mark.parametrize("device,delta", [("hopper", Fraction(1)), ("blackwell", Fraction(1, 2))])
def test_lambda_is_a_tight_lower_bound_on_the_real_score(device, delta):
    rng = np.random.default_rng(15)
    alpha = ((rng.integers(7, 168, size=60) << 7) | rng.integers(0, 128, size=60)).astype(np.uint16)
    l2f = ((rng.integers(95, 240, size=60) << 7) | rng.integers(0, 128, size=60)).astype(np.uint16)
    x = rng.integers(0, 1 << 16, size=(60, 40)).astype(np.uint16)
    x[(x & 0x7F80) == 0x7F80] = 0
    x[:, :3] = [0x0000, 0x8000, 0x0001]
    scores = lambda_scores(device, alpha, x, l2f)
    for i in range(60):
        for u in range(40):
            s = (_value(alpha[i]) * _value(x[i, u])) ** 2 + (delta * _value(alpha[i]) * _value(l2f[i])) ** 2
            ideal = 64 * (math.log2(s.numerator) - math.log2(s.denominator) + 508)
            assert ideal - 1.1 < scores[i, u] <= ideal + 1e-6, (alpha[i], x[i, u], l2f[i])


def test_lambda_rejects_out_of_domain_scales():
    with pytest.raises(ValueError, match="alpha"):
        summand_score("hopper", 0x0001, 0x3F80, 0x3F80)
    with pytest.raises(ValueError, match="l2f"):
        summand_score("hopper", 0x3F80, 0x3F80, 0x7F80)


# --- the checks on built tiles ---------------------------------------------------------------------


def build_strip(device, values, side, first_row=0):
    codes, scales = prequantize(np.asarray(values, dtype=np.float32))
    clean = open_values(codes, scales)
    l2, linf = row_norms(codes, scales)
    rows, k = clean.shape
    e = noise_lines(SEED_A if side == "A" else SEED_B, side, "E", np.arange(rows) + first_row)
    f = noise_lines(SEED_B, side, "F", np.arange(k))
    return clean, noisy_quantize(device, clean, l2, linf, e, f)


def literal_census(device, a_clean, a, b_clean, b):
    """Triple loop over (i, j, u) with the scalar rules, from a fresh replay."""
    _, stats = fp8_matmul_with_stats(device, a.codes, b.codes)
    count = 0
    for i in range(a_clean.shape[0]):
        for j in range(b_clean.shape[0]):
            for u in range(a_clean.shape[1]):
                window = u // stats.window_k
                z, m = int(stats.z_binades[i, j, window]), int(stats.m_binades[i, j])
                e_grid = grid_exponent_from_binades(device, None if z < -10**5 else z, None if m < -10**5 else m)
                la = summand_score(device, int(a.alpha[i]), int(a_clean[i, u]), int(a.l2f[i]))
                lb = summand_score(device, int(b.alpha[j]), int(b_clean[j, u]), int(b.l2f[j]))
                count += e_grid != 0 and la + lb < 128 * e_grid + SKIP_THRESHOLD_OFFSET
    return count


def spiky_values(rng, rows, k):
    """Mostly tiny entries with one giant every 64 columns: live enough, but dominated cells."""
    values = rng.normal(size=(rows, k)) * 2.0**-12
    values[:, ::64] = 1.0
    return values


@pytest.mark.parametrize("device", ["hopper", "blackwell"])
def test_census_matches_literal_triple_loop(device):
    rng = np.random.default_rng(16)
    a_clean, a = build_strip(device, spiky_values(rng, 2, 512), "A")
    b_values = spiky_values(rng, 3, 512)
    b_values[2] = rng.normal(size=512)
    b_clean, b = build_strip(device, b_values, "B")
    _, stats = fp8_matmul_with_stats(device, a.codes, b.codes)
    count = count_skippable(device, a_clean, a, b_clean, b, stats)
    assert count == literal_census(device, a_clean, a, b_clean, b)
    assert count > 0


@pytest.mark.parametrize("device", ["hopper", "blackwell"])
def test_honest_tile_is_admissible(device):
    rng = np.random.default_rng(17)
    a_clean, a = build_strip(device, rng.normal(size=(4, 1024)), "A")
    b_clean, b = build_strip(device, rng.normal(size=(64, 1024)) * 0.02, "B")
    assert check_policy(device, a_clean, a, b_clean, b) == (True, "admissible")


@pytest.mark.parametrize("device", ["hopper", "blackwell"])
def test_spiky_tile_fails_the_census(device):
    rng = np.random.default_rng(18)
    a_clean, a = build_strip(device, spiky_values(rng, 4, 1024), "A")
    b_clean, b = build_strip(device, spiky_values(rng, 16, 1024), "B")
    ok, reason = check_policy(device, a_clean, a, b_clean, b)
    assert not ok and reason.startswith("unpredictable summands"), reason


def test_liveness_rejects_spike_rows():
    # A dead entry has x² ≥ (τδ)²·mean(x²), so a row holds at most k/(τδ)² of them: k/64 on Hopper
    # (never over the limit) but k/16 on Blackwell (δ = 1/2), where 1/32 spikes are all dead.
    rng = np.random.default_rng(19)
    values = rng.normal(size=(4, 1024)) * 2.0**-12
    values[:, ::32] = 1.0
    a_clean, a = build_strip("blackwell", values, "A")
    b_clean, b = build_strip("blackwell", rng.normal(size=(16, 1024)), "B")
    ok, reason = check_policy("blackwell", a_clean, a, b_clean, b)
    assert not ok and reason.startswith("liveness: side A"), reason


def test_noise_floor_rejects_vanishing_sigma():
    rng = np.random.default_rng(20)
    a_clean, a = build_strip("hopper", rng.normal(size=(4, 1024)), "A")
    b_clean, b = build_strip("hopper", rng.normal(size=(16, 1024)), "B")
    b.alpha[3] = 0x3C00  # σ = α · l2f ≪ 1 (liveness does not depend on α)
    ok, reason = check_policy("hopper", a_clean, a, b_clean, b)
    assert not ok and reason.startswith("noise floor: side B row 3"), reason


def test_nan_codes_are_rejected():
    rng = np.random.default_rng(21)
    a_clean, a = build_strip("blackwell", rng.normal(size=(4, 1024)), "A")
    b_clean, b = build_strip("blackwell", rng.normal(size=(16, 1024)), "B")
    a.codes[1, 5] = 0x7F
    assert check_policy("blackwell", a_clean, a, b_clean, b) == (False, "non-finite noised entry on side A")


def test_check_policy_rejects_mismatched_strips():
    rng = np.random.default_rng(22)
    a_clean, a = build_strip("hopper", rng.normal(size=(4, 256)), "A")
    b_clean, b = build_strip("hopper", rng.normal(size=(16, 256)), "B")
    with pytest.raises(ValueError, match="side B"):
        check_policy("hopper", a_clean, a, b_clean[:8], b)
    with pytest.raises(ValueError, match="h × k"):
        check_policy("hopper", a_clean, a, b_clean[:, :128], b)


def test_grid_exponent_takes_numpy_integers_exactly():
    big = (1 << 60) - 1  # float() would round this up to 2^60
    assert grid_exponent("hopper", np.int64(big), 0) == grid_exponent_from_binades("hopper", 59, None)


def test_census_alone_rejects_vanishing_noise_like_pearls_test():
    # Pearl's jackpot_policy.rs scenario: one 1.0 spike per row, the rest 0, l2f forced to 2^-32 on
    # both sides: every zero entry's summand variance is ~2^-118, far below the grid, so nearly all
    # k·h·w summands are skippable (checks 1-2 bypassed by calling the census directly).
    k = 1024
    clean = np.zeros((2, k), dtype=np.uint16)
    clean[:, 0] = 0x3F80
    mesh_e = np.where(np.arange(2 * 32).reshape(2, 32) % 3 == 0, 0xB0, 0x30).astype(np.uint8)
    mesh_f = np.where(np.arange(k * 32).reshape(k, 32) % 5 == 0, 0xB0, 0x30).astype(np.uint8)
    l2, linf = np.array([0x3D00, 0x3D00], np.uint16), np.array([0x3F80, 0x3F80], np.uint16)
    side = noisy_quantize("blackwell", clean, l2, linf, mesh_e, mesh_f)
    side.l2f[:] = 0x2F80
    _, stats = fp8_matmul_with_stats("blackwell", side.codes, side.codes)
    skippable = count_skippable("blackwell", clean, side, clean, side, stats)
    assert skippable > budget(k, 2, 2)
    assert skippable >= 2 * 2 * (k - 1)
