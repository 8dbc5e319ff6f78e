"""Per-launch A-side row preparation in one kernel: int7 quantisation and the peel's A·P_B.

For every 16 rows of the activations (one program): the row scales, the int7 codes q (skipped when
the input is already int7), and A·P_B (rows × r) as three signed base-256 int8 limbs for the mined
GEMM's epilogue, computed on the tensor cores as q · P_B with P_B's one-hot ±1 block built on the
fly from the job's (first, second) index vectors.

Quantisation is per-row symmetric: scale = max|x| / 64 (1 for an all-zero row),
q = round-half-even(x / scale) clamped to [−64, 64] — the protocol's operand range (A + E_A must
fit int8), with a per-row factor the GEMM epilogue multiplies back. Same rounding as torch.round.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._jit import jit

INT7_LIMIT = 64
LIMBS = 3  # |A·P_B| ≤ 64·k ≤ 2^22 < 127·(1 + 256 + 65536)
ROWS = 16  # rows per program (the smallest MMA M)
_BK = 64
_RB = 128


class ActivationError(ValueError):
    """Bad input to the A-side row preparation."""


@jit
def _max_combine(a, b):
    return tl.maximum(a, b)


@jit
def _round_half_even(v):
    low = tl.floor(v)
    frac = v - low
    odd = (low - 2.0 * tl.floor(low * 0.5)) != 0.0
    return low + ((frac > 0.5) | ((frac == 0.5) & odd)).to(tl.float32)


@jit
def _rows_kernel(x_ptr, q_ptr, scale_ptr, first_ptr, second_ptr, factor_stride, limb_ptr,
                 rows_total, rows_per_instance, K, R: tl.constexpr, QUANT: tl.constexpr,
                 BR: tl.constexpr, BK: tl.constexpr, RB: tl.constexpr):
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    live = rows < rows_total
    row_at = rows.to(tl.int64)[:, None] * K
    inst = ((tl.program_id(0) * BR) // rows_per_instance).to(tl.int64)  # one instance per program
    ks = tl.arange(0, BK)
    if QUANT:
        amax = tl.full((BR,), 0.0, tl.float32)
        for k0 in range(0, K, BK):
            x = tl.load(x_ptr + row_at + (k0 + ks)[None, :], mask=live[:, None], other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.reduce(tl.abs(x), 1, _max_combine))
        scale = tl.where(amax > 0.0, amax / 64.0, 1.0)
        tl.store(scale_ptr + rows, scale, mask=live)
    for rb in range(0, R, RB):
        ts = rb + tl.arange(0, RB)
        acc = tl.full((BR, RB), 0, tl.int32)
        for k0 in range(0, K, BK):
            at = row_at + (k0 + ks)[None, :]
            if QUANT:
                x = tl.load(x_ptr + at, mask=live[:, None], other=0.0).to(tl.float32)
                v = _round_half_even(x / scale[:, None])
                q = tl.minimum(tl.maximum(v, -64.0), 64.0).to(tl.int8)
                tl.store(q_ptr + at, q, mask=live[:, None])
            else:
                q = tl.load(q_ptr + at, mask=live[:, None], other=0)
            first = tl.load(first_ptr + inst * factor_stride + k0 + ks)
            second = tl.load(second_ptr + inst * factor_stride + k0 + ks)
            onehot = ((first[:, None] == ts[None, :]).to(tl.int8)
                      - (second[:, None] == ts[None, :]).to(tl.int8))
            acc = tl.dot(q, onehot, acc, out_dtype=tl.int32)
        rest = acc
        for limb in tl.static_range(3):
            low = ((rest + 128) & 255) - 128
            tl.store(limb_ptr + limb * rows_total * R + rows.to(tl.int64)[:, None] * R + ts[None, :],
                     low.to(tl.int8), mask=live[:, None])
            rest = (rest - low) >> 8


def prepare_rows(x: torch.Tensor, first_b: torch.Tensor, second_b: torch.Tensor, rank: int, *,
                 rows_per_instance: int, scale: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, scale, limbs) for rows x (..., K): floating x is quantised; int8 x is taken as int7 codes
    (then `scale` is passed through). limbs: (3, *x.shape[:-1], rank) int8 with
    A·P_B = l0 + 256·l1 + 65536·l2. first_b/second_b: (instances, K) or (1, K) int32 P_B of the
    instance each block of rows_per_instance rows belongs to.
    """
    k = x.shape[-1]
    rows_total = x.numel() // k
    if rows_per_instance % ROWS or rows_total % rows_per_instance:
        raise ActivationError(f"rows per instance must be a multiple of {ROWS} dividing {rows_total}, "
                              f"got {rows_per_instance}")
    if k % _BK or first_b.dtype != torch.int32 or first_b.shape != second_b.shape or first_b.shape[-1] != k:
        raise ActivationError(f"need K a multiple of {_BK} and int32 (·, {k}) factors, got K={k}, "
                              f"{first_b.dtype} {tuple(first_b.shape)}")
    if rank % min(rank, _RB):
        raise ActivationError(f"rank {rank} must be a multiple of {_RB} or smaller")
    quantise = x.is_floating_point()
    if not quantise and (x.dtype != torch.int8 or scale is None):
        raise ActivationError(f"x must be floating point, or int8 codes with their scale; got {x.dtype}")
    x = x.contiguous()
    q = torch.empty(x.shape, dtype=torch.int8, device=x.device) if quantise else x
    if quantise:
        scale = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    limbs = torch.empty((LIMBS, *x.shape[:-1], rank), dtype=torch.int8, device=x.device)
    stride = 0 if first_b.shape[0] == 1 else k
    _rows_kernel[(triton.cdiv(rows_total, ROWS),)](
        x, q, scale, first_b.contiguous(), second_b.contiguous(), stride, limbs, rows_total,
        rows_per_instance, k, R=rank, QUANT=int(quantise), BR=ROWS, BK=_BK, RB=min(rank, _RB))
    return q, scale, limbs
