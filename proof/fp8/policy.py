"""The jackpot policy: is an opened tile admissible as work? (fp8-and-integration.md §11)

Three checks on an h × w tile, all required:
1. Liveness, per side: entry (i, u) is dead iff |X_iu| ≥ τ·δ·l2f_i (τ = 8); at most 1/64 of a
   side's entries may be dead.
2. Noise floor: σ_i = δ·α_i·l2f_i ≥ 1 on every opened row of both sides.
3. Unpredictable summands: at most floor(k·h·w / 20) of the (i, j, u) may be skippable, where
   skippable ⇔ E_GRID ≠ 0 and λ_A[i,u] + λ_B[j,u] < 128·E_GRID + 45952. λ is an integer lower
   bound on 64·(log2(ā² + σ²) + 508) and E_GRID = max(e(Z) − W, e(M) − 18) + 157 encodes the
   accumulation grid of the cell (Z per Hopper 128-k window, M per cell; zero magnitudes omitted).

The integer rules are restated from Pearl's zk-pow v4 verifier (see docs/protocol-fp8-numerics.md).
"""
from __future__ import annotations

import math
from numbers import Integral, Real

import numpy as np

from .bf16 import bf16_to_f32
from .devices import DeviceModel, device_model
from .e4m3 import is_nan_code
from .mma import NO_BINADE, PolicyStats, fp8_matmul_with_stats
from .quantization import NoisyRows

TAU_IDLE = 8
DEAD_FRACTION_DENOMINATOR = 64
SIGMA_MIN = 1.0
BUDGET_DIVISOR = 20
SCORE_BIAS = 508
FAR_GAP = 16
M_WINDOW_BITS = 18
GRID_EXPONENT_BIAS = 157
SKIP_THRESHOLD_OFFSET = 64 * (16 + 2 * SCORE_BIAS) - 128 * GRID_EXPONENT_BIAS  # 45952
# λ = 64·(2·e_big − 13 + SCORE_BIAS) + G(κ) for a dominant addend n·2^(e_big − 15); with the
# encoding enc = e_big + 268 this is 128·enc + _SCORE_OFFSET + G(κ), _SCORE_OFFSET = −2624.
_SCORE_OFFSET = 64 * (SCORE_BIAS - 13 - 2 * 268)
_CENSUS_CHUNK = 1024
_log2_table: np.ndarray | None = None


def _log2_fixed_table() -> np.ndarray:
    """G(n) = floor(64·log2 n) = floor(log2 n^64) for n < 2^16, exactly (G(0) = 0)."""
    global _log2_table
    if _log2_table is None:
        _log2_table = np.array([0] + [(n**64).bit_length() - 1 for n in range(1, 1 << 16)], dtype=np.int64)
    return _log2_table


def log2_fixed(n: int) -> int:
    """floor(64·log2 n) for 1 ≤ n < 2^16, and 0 at n = 0 (the λ rule's log table)."""
    if not 0 <= n < 1 << 16:
        raise ValueError(f"log2_fixed takes 0 ≤ n < 2^16, got {n}")
    return int(_log2_fixed_table()[n])


def budget(k: int, h: int, w: int) -> int:
    """The most skippable summands a tile may hold: floor(k·h·w / 20)."""
    return k * h * w // BUDGET_DIVISOR


def _magnitude_binade(x: Real) -> int | None:
    if not (isinstance(x, Real) and math.isfinite(x) and x >= 0):
        raise ValueError(f"a policy magnitude must be a finite non-negative number, got {x!r}")
    if x == 0:
        return None
    if isinstance(x, Integral):
        return int(x).bit_length() - 1
    return math.frexp(float(x))[1] - 1


def grid_exponent_from_binades(device: str | int | DeviceModel, z: int | None, m: int | None) -> int:
    """E_GRID from the binades e(Z), e(M) (None = zero magnitude); 0 only when both are zero."""
    model = device_model(device)
    candidates = [b for b in (None if z is None else z - model.window_bits,
                              None if m is None else m - M_WINDOW_BITS) if b is not None]
    if not candidates:
        return 0
    encoded = max(candidates) + GRID_EXPONENT_BIAS
    if encoded <= 0:
        raise ValueError(f"grid exponent {encoded} is not positive (binades {z}, {m})")
    return encoded


def grid_exponent(device: str | int | DeviceModel, z: Real, m: Real) -> int:
    """E_GRID = max(e(Z) − W, e(M) − 18) + 157 for magnitudes Z, M (W = 13 Hopper, 25 Blackwell)."""
    return grid_exponent_from_binades(device, _magnitude_binade(z), _magnitude_binade(m))


def _grid_exponents(model: DeviceModel, stats: PolicyStats) -> np.ndarray:
    """Vectorised E_GRID per (cell, window) from the replay's binades."""
    z = stats.z_binades
    m = np.broadcast_to(stats.m_binades[:, :, None], z.shape)
    z_q = np.where(z == NO_BINADE, np.iinfo(np.int64).min, z - model.window_bits)
    m_q = np.where(m == NO_BINADE, np.iinfo(np.int64).min, m - M_WINDOW_BITS)
    live = (z != NO_BINADE) | (m != NO_BINADE)
    encoded = np.maximum(z_q, m_q) + GRID_EXPONENT_BIAS
    if (live & (encoded <= 0)).any():
        raise ValueError("a live grid exponent has a non-positive encoding")
    return np.where(live, encoded, 0)


def _split_bf16(bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(E*, M) with |v| = M·2^(E* − 134): M = 128 + mantissa for normals, mantissa for subnormals."""
    b = bits.astype(np.int64)
    exp = (b >> 7) & 0xFF
    mantissa = b & 0x7F
    return np.maximum(exp, 1), np.where(exp != 0, mantissa + 128, mantissa)


def lambda_scores(device: str | int | DeviceModel, alpha: np.ndarray, x: np.ndarray, l2f: np.ndarray) -> np.ndarray:
    """λ for every entry of a strip: the integer score of S = (α·x)² + σ², σ = δ·α·l2f.

    Both addends are written over 16-bit significands n·2^(enc − 283); with the dominant one
    (n_big, enc_big) and gap g = |enc_x − enc_σ|: V = n_big² + floor(n_small² / 4^g) (the small
    term dropped when g ≥ 16), κ = floor(V / 2^17) ∈ [2^13, 2^16) and
    λ = 128·enc_big − 2624 + G(κ), a lower bound on 64·(log2 S + 508) within 1.1 units.
    """
    model = device_model(device)
    alpha_bits = np.asarray(alpha, dtype=np.uint16)[:, None]
    l2f_bits = np.asarray(l2f, dtype=np.uint16)[:, None]
    x_bits = np.asarray(x, dtype=np.uint16)
    for name, bits in (("alpha", alpha_bits), ("l2f", l2f_bits)):
        if ((bits & 0x7F80) == 0).any() or ((bits & 0x7F80) == 0x7F80).any():
            raise ValueError(f"{name} must be positive-normal BF16")
    if ((x_bits & 0x7F80) == 0x7F80).any():
        raise ValueError("clean entries must be finite BF16")
    alpha_e, alpha_m = _split_bf16(alpha_bits)
    x_e, x_m = _split_bf16(x_bits)
    l2_e, l2_m = _split_bf16(l2f_bits)

    product = alpha_m * x_m  # < 2^16
    width = np.frexp(product.astype(np.float64))[1].astype(np.int64)  # bit length
    x_sig = np.where(product != 0, product << np.maximum(16 - width, 0), 0)
    x_enc = np.where(product != 0, alpha_e + x_e - 1 + width, 0)
    sigma_product = alpha_m * l2_m  # in [2^14, 2^16)
    wide = (sigma_product >= 1 << 15).astype(np.int64)
    sigma_sig = sigma_product << (1 - wide)
    sigma_enc = alpha_e + l2_e + wide + model.sigma_encoding_offset

    x_dominates = (x_enc >= sigma_enc) & (x_sig != 0)
    gap = np.abs(x_enc - sigma_enc)
    near_gap = np.where(gap >= FAR_GAP, 0, gap)
    big = np.where(x_dominates, x_sig, sigma_sig)
    small = np.where(x_dominates, sigma_sig, x_sig)
    small_term = np.where(gap >= FAR_GAP, 0, ((small * small) >> near_gap) >> near_gap)
    kappa = (big * big + small_term) >> 17
    return 128 * np.maximum(x_enc, sigma_enc) + _SCORE_OFFSET + _log2_fixed_table()[kappa]


def summand_score(device: str | int | DeviceModel, alpha_bits: int, x_bits: int, l2f_bits: int) -> int:
    """λ of one entry (see lambda_scores)."""
    return int(lambda_scores(device, np.array([alpha_bits]), np.array([[x_bits]]), np.array([l2f_bits]))[0, 0])


def _dead_entries(model: DeviceModel, clean: np.ndarray, l2f: np.ndarray) -> int:
    bound = TAU_IDLE * model.delta * bf16_to_f32(l2f).astype(np.float64)
    return int((np.abs(bf16_to_f32(clean).astype(np.float64)) >= bound[:, None]).sum())


def _sigmas(model: DeviceModel, rows: NoisyRows) -> np.ndarray:
    return model.delta * bf16_to_f32(rows.alpha).astype(np.float64) * bf16_to_f32(rows.l2f).astype(np.float64)


def count_skippable(
    device: str | int | DeviceModel, a_clean: np.ndarray, a: NoisyRows, b_clean: np.ndarray, b: NoisyRows,
    stats: PolicyStats,
) -> int:
    """Check 3's census: the number of skippable (i, j, u) summands of the tile."""
    model = device_model(device)
    lambda_a = lambda_scores(model, a.alpha, a_clean, a.l2f)
    lambda_b = lambda_scores(model, b.alpha, b_clean, b.l2f)
    grids = _grid_exponents(model, stats)
    thresholds = 128 * grids + SKIP_THRESHOLD_OFFSET
    live = grids != 0
    k = lambda_a.shape[1]
    chunk = min(stats.window_k, _CENSUS_CHUNK)
    count = 0
    for u0 in range(0, k, chunk):
        window = u0 // stats.window_k
        scores = lambda_a[:, None, u0:u0 + chunk] + lambda_b[None, :, u0:u0 + chunk]
        below = scores < thresholds[:, :, window, None]
        count += int((below & live[:, :, window, None]).sum())
    return count


def check_policy(
    device: str | int | DeviceModel,
    a_clean: np.ndarray,
    a: NoisyRows,
    b_clean: np.ndarray,
    b: NoisyRows,
    stats: PolicyStats | None = None,
) -> tuple[bool, str]:
    """Run the three checks on a tile: (admissible, reason). a_clean/b_clean are the opened BF16
    rows (h × k, w × k); a/b their noisy-quantized strips; stats the tile replay's binades
    (computed here when not given: pass fp8_matmul_with_stats' result to reuse one replay)."""
    model = device_model(device)
    a_clean = np.asarray(a_clean, dtype=np.uint16)
    b_clean = np.asarray(b_clean, dtype=np.uint16)
    if a_clean.ndim != 2 or b_clean.ndim != 2 or a_clean.shape[1] != b_clean.shape[1]:
        raise ValueError(f"clean strips must be h × k and w × k, got {a_clean.shape} and {b_clean.shape}")
    (h, k), w = a_clean.shape, b_clean.shape[0]
    for name, clean, rows in (("A", a_clean, a), ("B", b_clean, b)):
        per_row = (clean.shape[0],)
        if rows.codes.shape != clean.shape or np.shape(rows.alpha) != per_row or np.shape(rows.l2f) != per_row:
            raise ValueError(f"side {name}: noisy rows do not match the clean strip {clean.shape}")
        if ((clean & 0x7F80) == 0x7F80).any():
            return False, f"non-finite clean entry on side {name}"
        if is_nan_code(rows.codes).any():
            return False, f"non-finite noised entry on side {name}"

    for name, clean, rows in (("A", a_clean, a), ("B", b_clean, b)):
        dead = _dead_entries(model, clean, rows.l2f)
        if dead * DEAD_FRACTION_DENOMINATOR > clean.size:
            return False, f"liveness: side {name} has {dead} dead entries of {clean.size} (limit 1/64)"

    for name, rows in (("A", a), ("B", b)):
        sigma = _sigmas(model, rows)
        if (sigma < SIGMA_MIN).any():
            return False, f"noise floor: side {name} row {int(np.argmax(sigma < SIGMA_MIN))} has sigma {sigma.min():.3g} < 1"

    if stats is None:
        _, stats = fp8_matmul_with_stats(model, a.codes, b.codes)
    skippable = count_skippable(model, a_clean, a, b_clean, b, stats)
    allowed = budget(k, h, w)
    if skippable > allowed:
        return False, f"unpredictable summands: {skippable} skippable of {k * h * w} (budget {allowed})"
    return True, "admissible"
