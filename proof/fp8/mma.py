"""Bit-exact models of the devices' FP8 (e4m3 × e4m3 → fp32) MMA (fp8-and-integration.md §8).

Both devices consume K in ascending groups of 32 products. One group sums the running accumulator
and its 32 exact products in a fixed-width window anchored at the largest term exponent: every term
is truncated (toward zero) onto the window grid, the integers are added exactly, and the sum is
truncated back to the window width W and then to an fp32.

- Hopper (W = 14): every 128-k window chains up to 4 groups from a fresh +0 accumulator, and is then
  promoted into the fp32 total with one RNE add (total starts at +0, a zero total is +0).
- Blackwell (W = 26): one unbroken chain from +0; the group result is exact-then-truncated (RZ).

Vectorised with int64 numpy over the (rows × cols × 32) terms of one group at a time. A NaN byte
anywhere in a row of either operand makes every cell that row contracts into NaN.

Term convention (as in the spec): value = significand · 2^(exponent − 23), with 24-bit fp32
significands for accumulators and (sa·sb) << 17 for products, whose exponent is ea + eb − 14 with
subnormal exponent fields read as 1. Zero terms carry a sentinel exponent and never anchor.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .devices import DeviceModel, device_model
from .e4m3 import is_nan_code

GROUP_K = 32
HOPPER_WINDOW_K = 128
ZERO_EXPONENT = -(1 << 20)  # exponent of a zero term: below every real exponent
NO_BINADE = -(1 << 20)  # binade recorded for an all-zero window or cell
_FP32_MIN_EXPONENT = -126
_CHUNK_TERMS = 1 << 20  # rows × cols × 32 terms processed per step (bounds memory)
# floor(log2 n) for the product of two 4-bit significands (1..225); entry 0 is unused.
_ILOG2 = np.array([0] + [n.bit_length() - 1 for n in range(1, 226)], dtype=np.int64)


@dataclass(frozen=True)
class PolicyStats:
    """Per-cell magnitudes the jackpot policy needs, as exact binades floor(log2 |x|).

    z_binades[i, j, w] is Z of window w (Hopper: the 128-k window's products and each group's
    window-local result; Blackwell: one window over all of k, equal to M). m_binades[i, j] is M
    (Hopper: every product and every exact unrounded total + window value; Blackwell: every product
    and every group partial). NO_BINADE marks an all-zero magnitude.
    """

    z_binades: np.ndarray
    m_binades: np.ndarray
    window_k: int


def fp8_matmul(device: str | int | DeviceModel, a_codes: np.ndarray, b_codes: np.ndarray) -> np.ndarray:
    """a·bᵀ exactly as the device accumulates it: a is m×k, b is n×k (uint8 e4m3); m×n float32."""
    return _replay(device_model(device), a_codes, b_codes, with_stats=False)[0]


def fp8_matmul_with_stats(
    device: str | int | DeviceModel, a_codes: np.ndarray, b_codes: np.ndarray
) -> tuple[np.ndarray, PolicyStats]:
    """fp8_matmul plus the per-window Z and per-cell M binades of the jackpot policy."""
    acc, stats = _replay(device_model(device), a_codes, b_codes, with_stats=True)
    assert stats is not None
    return acc, stats


def _check_operands(a_codes: np.ndarray, b_codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(a_codes)
    b = np.asarray(b_codes)
    for name, x in (("a_codes", a), ("b_codes", b)):
        if x.dtype != np.uint8 or x.ndim != 2:
            raise ValueError(f"{name} must be a 2-D uint8 array of e4m3 codes, got {x.dtype} {x.shape}")
    if a.shape[1] != b.shape[1] or a.shape[1] == 0:
        raise ValueError(f"a_codes and b_codes need the same positive k, got {a.shape[1]} and {b.shape[1]}")
    return a, b


def _split_codes(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Signed 4-bit significands (subnormals unnormalised) and exponent fields (subnormals as 1)."""
    c = codes.astype(np.int32)
    exponent = (c >> 3) & 0xF
    mantissa = c & 0x7
    significand = np.where(exponent != 0, mantissa | 8, mantissa)
    return np.where(c & 0x80, -significand, significand), np.maximum(exponent, 1)


def _pad_to_groups(codes: np.ndarray) -> np.ndarray:
    """Zero-pad k to a multiple of 32: a short last group behaves like zero products."""
    short = -codes.shape[1] % GROUP_K
    return np.pad(codes, ((0, 0), (0, short))) if short else codes


def _binade_of(significand: np.ndarray, exponent: np.ndarray) -> np.ndarray:
    """floor(log2 |value|) of terms in the group convention; NO_BINADE for zero."""
    magnitude = np.abs(significand)
    bit_length = np.frexp(magnitude.astype(np.float64))[1]
    return np.where(magnitude == 0, NO_BINADE, exponent + bit_length - 24)


def _group_sum(
    p_sig: np.ndarray, p_exp: np.ndarray, c_sig: np.ndarray, c_exp: np.ndarray, width: int
) -> tuple[np.ndarray, np.ndarray]:
    """One group: accumulator (c_sig, c_exp) plus products (p_sig, p_exp) over the last axis.

    p_sig holds signed sa·sb (the 24-bit significand is that << 17); c_sig holds a signed 24-bit
    significand. Returns the result as a signed 24-bit significand and its exponent.
    """
    anchor = np.maximum(p_exp.max(axis=-1), c_exp)
    # Rescale the 24-bit significands to W bits (truncating), then align to the anchor.
    p_shift = np.minimum(anchor[..., None] - p_exp, 31)  # aligned terms are < 2^27: 31 clears them
    p_aligned = (np.abs(p_sig) << (17 + width - 24)) >> p_shift
    np.negative(p_aligned, out=p_aligned, where=p_sig < 0)
    total = p_aligned.sum(axis=-1, dtype=np.int64)
    c_magnitude = np.abs(c_sig)
    c_rescaled = c_magnitude >> (24 - width) if width < 24 else c_magnitude << (width - 24)
    c_aligned = c_rescaled >> np.minimum(anchor - c_exp, 63)
    total += np.where(c_sig < 0, -c_aligned, c_aligned)

    # Normalise: keep the top W bits (truncate), exponent = anchor + bit_length − W.
    magnitude = np.abs(total)
    bit_length = np.frexp(magnitude.astype(np.float64))[1].astype(np.int64)
    exponent = anchor + bit_length - width
    excess = bit_length - width
    significand = np.where(excess > 0, magnitude >> np.maximum(excess, 0), magnitude << np.maximum(-excess, 0))
    # fp32 denormals: shift down to the minimum exponent.
    tiny = exponent < _FP32_MIN_EXPONENT
    significand = np.where(tiny, significand >> np.minimum(_FP32_MIN_EXPONENT - exponent, 63), significand)
    exponent = np.where(tiny, _FP32_MIN_EXPONENT, exponent)
    # Back to a 24-bit fp32 significand (exact for W ≤ 24, truncating for W > 24).
    significand = significand << (24 - width) if width < 24 else significand >> (width - 24)
    exponent = np.where(significand == 0, ZERO_EXPONENT, exponent)
    return np.where(total < 0, -significand, significand), exponent


def _to_f32(significand: np.ndarray, exponent: np.ndarray) -> np.ndarray:
    """Exact fp32 value of a group-convention term (zero for a zero significand)."""
    scale = np.where(significand == 0, 0, exponent - 23).astype(np.int32)
    return np.ldexp(significand.astype(np.float64), scale).astype(np.float32)


def _exact_sum_binade(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """floor(log2 |x + y|) of the exact (unrounded) sum of two fp32 arrays; NO_BINADE at zero."""
    x64 = x.astype(np.float64)
    y64 = y.astype(np.float64)
    total = x64 + y64
    back = total - y64
    error = (x64 - back) + (y64 - (total - back))  # TwoSum: x + y = total + error exactly
    fraction, exp = np.frexp(total)
    binade = exp.astype(np.int64) - 1
    # The f64 sum can round up onto a power of two; the exact sum then lies in the binade below.
    below = (np.abs(fraction) == 0.5) & (error != 0) & (np.signbit(error) != np.signbit(total))
    return np.where(total == 0, NO_BINADE, binade - below)


def _record_binades(
    model: DeviceModel, p_sig: np.ndarray, p_exp: np.ndarray, c_sig: np.ndarray, c_exp: np.ndarray,
    total: np.ndarray, z_window: np.ndarray, m_cell: np.ndarray,
) -> None:
    """Fold one group into the running Z (this window) and M (this cell) binades, in place."""
    # Product binade: (sa·sb) << 17 at exponent e is sa·sb · 2^(e − 6).
    p_binade = np.where(p_sig == 0, NO_BINADE, p_exp + _ILOG2[np.abs(p_sig)] - 6).max(axis=-1)
    c_binade = _binade_of(c_sig, c_exp)
    if model.promotion_groups is None:
        np.maximum(m_cell, np.maximum(p_binade, c_binade), out=m_cell)
        return
    np.maximum(z_window, np.maximum(p_binade, c_binade), out=z_window)
    partial = _exact_sum_binade(total, _to_f32(c_sig, c_exp))  # unrounded total + window value
    np.maximum(m_cell, np.maximum(p_binade, partial), out=m_cell)


def _replay(
    model: DeviceModel, a_codes: np.ndarray, b_codes: np.ndarray, with_stats: bool
) -> tuple[np.ndarray, PolicyStats | None]:
    a, b = _check_operands(a_codes, b_codes)
    m, n, k = a.shape[0], b.shape[0], a.shape[1]
    a_sig, a_exp = _split_codes(_pad_to_groups(a))
    b_sig, b_exp = _split_codes(_pad_to_groups(b))
    groups = a_sig.shape[1] // GROUP_K
    window_groups = model.promotion_groups or groups
    windows = -(-groups // window_groups)
    out = np.empty((m, n), dtype=np.float32)
    z_binades = np.full((m, n, windows), NO_BINADE, dtype=np.int64) if with_stats else None
    m_binades = np.full((m, n), NO_BINADE, dtype=np.int64) if with_stats else None

    rows_per_chunk = max(1, _CHUNK_TERMS // (n * GROUP_K))
    for r0 in range(0, m, rows_per_chunk):
        rows = slice(r0, min(m, r0 + rows_per_chunk))
        total = np.zeros((rows.stop - r0, n), dtype=np.float32)  # the promoted fp32 total
        for g in range(groups):
            if g % window_groups == 0:  # a fresh window accumulator c = +0
                c_sig = np.zeros_like(total, dtype=np.int64)
                c_exp = np.full_like(c_sig, ZERO_EXPONENT)
            cols = slice(g * GROUP_K, (g + 1) * GROUP_K)
            p_sig = a_sig[rows, None, cols] * b_sig[None, :, cols]
            p_exp = np.where(p_sig == 0, ZERO_EXPONENT, a_exp[rows, None, cols] + b_exp[None, :, cols] - 14)
            c_sig, c_exp = _group_sum(p_sig, p_exp, c_sig, c_exp, model.window_width)
            window_done = (g + 1) % window_groups == 0 or g == groups - 1
            if with_stats:
                _record_binades(model, p_sig, p_exp, c_sig, c_exp, total, z_binades[rows, :, g // window_groups],
                                m_binades[rows])
            if model.promotion_groups is not None and window_done:
                total = total + _to_f32(c_sig, c_exp)  # RNE fp32 promotion
                total = np.where(total == 0, np.float32(0), total)
        if model.promotion_groups is None:
            total = _to_f32(c_sig, c_exp)
        out[rows] = total

    poisoned = is_nan_code(a).any(axis=1)[:, None] | is_nan_code(b).any(axis=1)[None, :]
    out[poisoned] = np.nan
    if not with_stats:
        return out, None
    if model.promotion_groups is None:
        z_binades = m_binades[:, :, None].copy()  # Blackwell: Z = M over the whole of k
    window_k = HOPPER_WINDOW_K if model.promotion_groups is not None else k
    return out, PolicyStats(z_binades=z_binades, m_binades=m_binades, window_k=window_k)
