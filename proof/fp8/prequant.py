"""Block-scaled int8 pre-quantization ("int8 blk8 bf16s", fp8-and-integration.md §4).

Each row is cut into blocks of 8 consecutive k-elements; a block holds 8 int8 codes and one BF16
scale, and opens to RNE_bf16(q · s) (the int8 × BF16 product is exact in f32). The two planes are
what a proof commits. The row norms (l2, linf) that set the noise scales are computed from the
planes with exact integer arithmetic so a miner and every verifier agree bit for bit:

- linf = RNE_bf16(max over blocks of max|q| · |s|) (exact in f32 before the cast);
- l2 = grid4(RNE_bf16(√v)) with v = S · 2^(E_MAX − 268 − Wl2) / k, where a scale is
  |s| = M · 2^(E* − 134), p_b = M² · Σq² per block, E_MAX = max 2E* over live blocks, Wl2 =
  27 − ceil(log2 k) and S = Σ_b floor(p_b · 2^Wl2 / 2^(E_MAX − 2E*_b)); l2 = 0 when S = 0.
"""
from __future__ import annotations

import numpy as np

from .bf16 import BF16_POS_INF, bf16_to_f32, f32_to_bf16, rne_bf16_sqrt_ratio

BLOCK_SIZE = 8
CODE_MAX = 127
L2_ROUNDED_BITS = 2
_L2_FRAME_BITS = 27
_AMAX_FLOOR = np.float32(2.0**-100)


def l2_frame_width(k: int) -> int:
    """Wl2 = 27 − ceil(log2 k): the precision shift of the integer l2 frame (17 at k = 1024)."""
    if k <= 0:
        raise ValueError(f"k must be positive, got {k}")
    ceil_log2 = (k - 1).bit_length()
    if ceil_log2 > _L2_FRAME_BITS:
        raise ValueError(f"k={k} exceeds the l2 frame width (k ≤ 2^27)")
    return _L2_FRAME_BITS - ceil_log2


def round_l2(code: int) -> int:
    """grid4: round a non-negative BF16 code to the nearest multiple of 4 ulp, ties up."""
    step = 1 << L2_ROUNDED_BITS
    return (code + (step >> 1)) & ~(step - 1) & 0xFFFF


def _check_planes(codes: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    q = np.asarray(codes)
    s = np.asarray(scales)
    if q.dtype != np.int8 or q.ndim != 2:
        raise ValueError(f"codes must be a 2-D int8 array, got {q.dtype} {q.shape}")
    if s.dtype != np.uint16 or s.shape != (q.shape[0], q.shape[1] // BLOCK_SIZE) or q.shape[1] % BLOCK_SIZE:
        raise ValueError(
            f"scales must be uint16 BF16 bits of shape (rows, k/{BLOCK_SIZE}) for codes {q.shape}, got {s.dtype} {s.shape}"
        )
    bad = np.argwhere((s & 0x7FFF) >= BF16_POS_INF)
    if bad.size:
        row, block = bad[0]
        raise ValueError(f"scale of row {row} block {block} is not finite (0x{int(s[row, block]):04x})")
    return q, s


def prequantize(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The reference encoder: (rows × k) values → (int8 codes, BF16 scale bits per 8).

    Per block: amax = max|x| floored at 2^-100; s = bf16(amax · f32(1/127)); q = RNE(x · rcp(s))
    clamped to ±127 (−128 never appears). Any valid planes are legal; this one is the reference.
    """
    x = np.asarray(values, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] % BLOCK_SIZE:
        raise ValueError(f"values must be 2-D with k a multiple of {BLOCK_SIZE}, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError("values must be finite")
    blocks = x.reshape(x.shape[0], -1, BLOCK_SIZE)
    amax = np.maximum(np.abs(blocks).max(axis=-1), _AMAX_FLOOR)
    scales = f32_to_bf16(amax * (np.float32(1) / np.float32(CODE_MAX)))
    reciprocal = np.float32(1) / bf16_to_f32(scales)
    codes = np.clip(np.rint(blocks * reciprocal[..., None]), -CODE_MAX, CODE_MAX)
    return codes.reshape(x.shape).astype(np.int8), scales


def open_values(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The opened operand RNE_bf16(q · s) as BF16 bits; raises if a product overflows BF16."""
    q, s = _check_planes(codes, scales)
    with np.errstate(over="ignore"):
        products = q.reshape(q.shape[0], -1, BLOCK_SIZE).astype(np.float32) * bf16_to_f32(s)[..., None]
    opened = f32_to_bf16(products.reshape(q.shape))
    bad = np.argwhere((opened & 0x7FFF) >= BF16_POS_INF)
    if bad.size:
        raise ValueError(f"opened value at row {bad[0][0]} column {bad[0][1]} overflows BF16")
    return opened


def row_norms(codes: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row (l2, linf) BF16 bits from the planes, with the exact integer-frame l2 rule."""
    q, s = _check_planes(codes, scales)
    rows, k = q.shape
    wl2 = l2_frame_width(k)
    blocks = q.reshape(rows, -1, BLOCK_SIZE).astype(np.int64)
    magnitude = (s & 0x7FFF).astype(np.int64)
    exp_field = magnitude >> 7
    mantissa = (magnitude & 0x7F) + np.where(exp_field != 0, 128, 0)
    doubled_exp = 2 * np.maximum(exp_field, 1)

    block_energy = mantissa * mantissa * (blocks * blocks).sum(axis=-1)  # p_b < 2^33
    e_max = np.where(block_energy != 0, doubled_exp, 0).max(axis=-1)
    shift = np.clip(e_max[:, None] - doubled_exp, 0, 63)
    frame_sum = ((block_energy << wl2) >> shift).sum(axis=-1)  # < 2^61

    l2 = np.zeros(rows, dtype=np.uint16)
    for row in np.nonzero(frame_sum)[0]:
        try:
            root = rne_bf16_sqrt_ratio(int(frame_sum[row]), k, int(e_max[row]) - 268 - wl2)
        except ValueError:
            raise ValueError(f"l2 of row {row} overflows BF16") from None
        l2[row] = round_l2(root)
        if l2[row] >= BF16_POS_INF:
            raise ValueError(f"l2 of row {row} rounds into the BF16 infinity code")

    with np.errstate(over="ignore"):
        block_peak = np.abs(blocks).max(axis=-1).astype(np.float32) * bf16_to_f32(magnitude.astype(np.uint16))
    linf = f32_to_bf16(block_peak.max(axis=-1))
    bad = np.nonzero(linf >= BF16_POS_INF)[0]
    if bad.size:
        raise ValueError(f"linf of row {bad[0]} overflows BF16")
    return l2, linf
