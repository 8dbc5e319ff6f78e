"""Per-launch A-side row preparation: int7 quantisation, and A·P_B (int32) for the peel.

Two kernels, both spread wide enough to fill the GPU at decode (a few hundred rows):
- quantise: one program per row: max|x| over the row, scale, then the int7 codes q (skipped when
  the input is already int7 codes);
- A·P_B: a grid over (16- or 64-row blocks × k-splits × rank blocks); each program multiplies its
  rows' q slice by the same slice of P_B (the job's sparse ±1 factor stored dense, (K, r) int8,
  built once per job by `noise.dense_sparse_factor`) on the tensor cores, and adds its int32
  partial sums into the (rows, r) result with atomics (int32 addition is exact in any order;
  a plain store when there is a single split). The mined GEMM splits A·P_B into int8 limbs in
  its epilogue.

Why a dense P_B: P_B is per job, so building its one-hot blocks on the fly at every launch (and
converting them into the MMA operand layout each k-step) is repeated work; stored dense it is a
small L2-friendly int8 operand (K·r bytes per instance) that the kernel streams with pipelined
loads like any GEMM operand.

Quantisation is per-row symmetric: scale = max|x| / 64 (1 for an all-zero row),
q = round-half-even(x / scale) clamped to [−64, 64] — the protocol's operand range (A + E_A must
fit int8), with a per-row factor the GEMM epilogue multiplies back. Same rounding as torch.round,
and the division is IEEE round-to-nearest (`div_rn`; Triton's `/` is a faster approximate
division on the GPU that can move a value across a rounding boundary).
"""
from __future__ import annotations

import torch
import triton.language as tl

from ._jit import jit

INT7_LIMIT = 64
ROWS = 16  # rows per instance must be a multiple of this (the smallest MMA M)
_QUANT_BLOCK = 1024  # k per step of the quantise kernel
_RANK_BLOCK = 128
_TARGET_PROGRAMS = 264  # A·P_B programs to aim for: two per SM of the 132-SM H200


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
def _quantise_kernel(x_ptr, q_ptr, scale_ptr, K, BK: tl.constexpr):
    """Row `program_id`: scale = max|x| / 64 (1 if zero), q = clamp(round_half_even(x / scale))."""
    at = x_ptr + tl.program_id(0).to(tl.int64) * K
    out = q_ptr + tl.program_id(0).to(tl.int64) * K
    ks = tl.arange(0, BK)
    peak = tl.full((BK,), 0.0, tl.float32)
    for k0 in range(0, K, BK):
        x = tl.load(at + k0 + ks, mask=k0 + ks < K, other=0.0).to(tl.float32)
        peak = tl.maximum(peak, tl.abs(x))
    amax = tl.reduce(peak, 0, _max_combine)
    scale = tl.where(amax > 0.0, amax * 0.015625, 1.0)  # / 64, exactly (a power of two)
    tl.store(scale_ptr + tl.program_id(0), scale)
    for k0 in range(0, K, BK):
        x = tl.load(at + k0 + ks, mask=k0 + ks < K, other=0.0).to(tl.float32)
        q = tl.minimum(tl.maximum(_round_half_even(tl.math.div_rn(x, scale)), -64.0), 64.0)
        tl.store(out + k0 + ks, q.to(tl.int8), mask=k0 + ks < K)


@jit
def apb_partial(q_ptr, pb_ptr, rows, ts, k_begin, steps, K, R: tl.constexpr, BK: tl.constexpr):
    """q[rows, k_begin : k_begin + steps·BK] · P_B[same k, ts] as int32 (rows × ts) on the tensor
    cores; pb_ptr at the instance's P_B (K, R). Shared by the A·P_B kernel and the fused A side."""
    ks = tl.arange(0, BK)
    acc = tl.full((rows.shape[0], ts.shape[0]), 0, tl.int32)
    for step in range(0, steps):
        kk = k_begin + step * BK + ks
        q = tl.load(q_ptr + rows[:, None] * K + kk[None, :])
        p = tl.load(pb_ptr + kk.to(tl.int64)[:, None] * R + ts[None, :])
        acc = tl.dot(q, p, acc, out_dtype=tl.int32)
    return acc


@jit
def _apb_kernel(q_ptr, pb_ptr, pb_stride, apb_ptr, rows_per_instance, K, steps_per_split,
                R: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr, RB: tl.constexpr,
                ATOMIC: tl.constexpr):
    """apb[rows, rank block] (+)= q[rows, k-split] · P_B[instance][k-split, rank block]."""
    block = tl.program_id(0)
    rows = (block * BR + tl.arange(0, BR)).to(tl.int64)
    inst = ((block * BR) // rows_per_instance).to(tl.int64)  # BR divides rows_per_instance
    ts = tl.program_id(2) * RB + tl.arange(0, RB)
    acc = apb_partial(q_ptr, pb_ptr + inst * pb_stride, rows, ts,
                      tl.program_id(1) * steps_per_split * BK, steps_per_split, K, R, BK)
    at = apb_ptr + rows[:, None] * R + ts[None, :]
    if ATOMIC:
        tl.atomic_add(at, acc, sem="relaxed")  # ordered by the kernel boundary
    else:
        tl.store(at, acc)


def _splits(k_steps: int, programs: int) -> int:
    """The largest divisor of k_steps that brings the grid near _TARGET_PROGRAMS programs."""
    wanted = max(1, -(-_TARGET_PROGRAMS // programs))
    return max(d for d in range(1, min(k_steps, wanted) + 1) if k_steps % d == 0)


def quantise_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale) of floating rows x (..., K): int7 codes int8 and per-row float32 scales."""
    if not x.is_floating_point():
        raise ActivationError(f"quantise_rows needs floating activations, got {x.dtype}")
    x = x.contiguous()
    k = x.shape[-1]
    q = torch.empty(x.shape, dtype=torch.int8, device=x.device)
    scale = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    _quantise_kernel[(x.numel() // k,)](x, q, scale, k, BK=_QUANT_BLOCK)
    return q, scale


def a_times_p_b(q: torch.Tensor, p_b: torch.Tensor, *, rows_per_instance: int) -> torch.Tensor:
    """A·P_B as int32 (*q.shape[:-1], r) for int7 codes q (..., K); p_b: (instances, K, r) int8
    (or (1, K, r): one factor for all rows), the instance of a row being row // rows_per_instance."""
    k = q.shape[-1]
    rows_total = q.numel() // k
    if q.dtype != torch.int8:
        raise ActivationError(f"A·P_B needs int8 codes, got {q.dtype}")
    if rows_per_instance % ROWS or rows_total % rows_per_instance:
        raise ActivationError(f"rows per instance must be a multiple of {ROWS} dividing {rows_total}, "
                              f"got {rows_per_instance}")
    instances = rows_total // rows_per_instance
    if (p_b.dtype != torch.int8 or p_b.dim() != 3 or p_b.shape[0] not in (1, instances)
            or p_b.shape[1] != k or k % 64):
        raise ActivationError(f"need K a multiple of 64 and an int8 P_B (1 or {instances}, {k}, r), got "
                              f"K={k}, {p_b.dtype} {tuple(p_b.shape)}")
    rank = p_b.shape[2]
    rank_block = min(rank, _RANK_BLOCK)
    if rank % rank_block or rank < 16:
        raise ActivationError(f"rank {rank} must be at least 16 and a multiple of {_RANK_BLOCK} or smaller")
    block_rows = 64 if rows_per_instance % 64 == 0 and rows_total >= 64 * _TARGET_PROGRAMS else ROWS
    block_k = 128 if k % 128 == 0 else 64
    row_blocks, rank_blocks = rows_total // block_rows, rank // rank_block
    splits = _splits(k // block_k, row_blocks * rank_blocks)
    alloc = torch.zeros if splits > 1 else torch.empty
    apb = alloc((*q.shape[:-1], rank), dtype=torch.int32, device=q.device)
    stride = 0 if p_b.shape[0] == 1 else k * rank
    _apb_kernel[(row_blocks, splits, rank_blocks)](
        q.contiguous(), p_b.contiguous(), stride, apb, rows_per_instance, k, k // block_k // splits,
        R=rank, BR=block_rows, BK=block_k, RB=rank_block, ATOMIC=int(splits > 1))
    return apb


def int7_codes(x: torch.Tensor, scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale): floating x is quantised; int8 x is taken as int7 codes with the given scale."""
    if x.is_floating_point():
        return quantise_rows(x)
    if x.dtype != torch.int8 or scale is None:
        raise ActivationError(f"x must be floating point, or int8 codes with their scale; got {x.dtype}")
    return x, scale


def prepare_rows(x: torch.Tensor, p_b: torch.Tensor, *, rows_per_instance: int,
                 scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, scale, A·P_B) for rows x (..., K): floating x is quantised; int8 x is taken as int7 codes
    (then `scale` is passed through). A·P_B: int32 (*x.shape[:-1], r); p_b as in `a_times_p_b`."""
    q, scale = int7_codes(x, scale)
    return q, scale, a_times_p_b(q, p_b, rows_per_instance=rows_per_instance)
