"""Per-launch A-side row preparation: int7 quantisation, and A·P_B (int32) for the peel.

Both are bandwidth-bound at prefill (65536 rows × K 6144 at GLM-5) and latency-bound at decode
(512 rows), so each is one launch that moves every byte once:

- quantise: a program holds whole rows in registers (one read of x, 24–32 values per thread, as
  one or two power-of-two blocks: K 6144 = 4096 + 2048; rows of up to 32768 values; longer rows
  take two passes, the second from L1/L2), reduces max|x|, and writes the codes and the row
  scale. At prefill, rows of a power-of-two K ≤ 4096 go several to a program (≥ 8192 values).
- A·P_B: a grid over (row blocks × k-splits × rank blocks); a program multiplies its rows' q slice
  by the same slice of P_B (the job's sparse ±1 factor stored dense by `noise.dense_sparse_factor`)
  on the tensor cores. At prefill a block is 128 rows × the whole rank (P_B read once per 128 rows,
  one split, plain stores, 8 warps: two wgmma warpgroups); at decode 16-row blocks with a k-split
  that fills the GPU and int32 atomics (exact in any order) into a zeroed result.

P_B is stored K-major (the storage of P_Bᵀ, (r, K) per instance, viewed as (K, r)): the int8
tensor-core operands (wgmma and mma.sync's ldmatrix path) must be K-contiguous; P_B stored (K, r)
row-major was transposed byte by byte through shared memory at every k-step (128 single-byte
shared stores per thread per step in the SASS). A (K, r)-contiguous P_B is still accepted.

Quantisation is per-row symmetric: scale = max|x| / 64 (1 for an all-zero row),
q = round-half-even(x / scale), in [−64, 64] — the protocol's operand range (A + E_A must fit
int8), with a per-row factor the GEMM epilogue multiplies back; the same codes as
torch.round(x / scale) with IEEE division. For bf16 and fp16 rows the kernel does not divide: it
multiplies by the row's reciprocal and repairs the only case where that can round differently,
an exact tie (docs/kernels-int7.md, "Third session", has the proof): with 8 (bf16) or 11 (fp16)
significant bits in x and in the scale, a quotient that is not a half-integer lies thousands of
times farther from every half-integer than the product's rounding error, and a tie
k + ½ = x / scale is recognised exactly by (k + ½)·scale == x (a product of ≤ 19 significant
bits, exact in float32). fp32 rows divide (IEEE `div_rn`). Rounding to an integer adds 1.5·2^23
(float32 round-to-nearest-even then leaves the integer in the low mantissa bits; its low byte is
the int8 code), avoiding the quarter-rate conversion and rounding instructions.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from kernels.triton_jit import jit, pdl_enabled

INT7_LIMIT = 64
ROWS = 16  # rows per instance must be a multiple of this (the smallest MMA M)
_VALUES_PER_THREAD = 32  # quantise: 64 bytes of bf16 per thread, four 16-byte loads in flight
_ONE_PASS_MAX = 32768  # quantise: the longest row held in registers (32 warps × 32 × 32)
_TWO_PASS_BLOCK = 8192  # quantise: k per step for longer rows
_PREFILL_ROWS = 4096  # quantise: from this many rows, programs take ≥ 8192 values
_SMS = 132  # H200 streaming multiprocessors: a grid below one program per SM leaves SMs idle
_RANK_BLOCK = 128
_TARGET_PROGRAMS = 264  # decode A·P_B programs to aim for: two per SM
# (a global read inside a kernel must be constexpr)
_MAGIC = tl.constexpr(12582912.0)  # 1.5·2^23: v + _MAGIC rounds v to an integer, half to even (|v| < 2^22)
_TINY = tl.constexpr(2.0 ** -60)  # below this max|x| the reciprocal of the scale would overflow
_BOOST = tl.constexpr(2.0 ** 64)  # scales such rows (exactly) into the normal range
PRODUCT_CODES = tl.constexpr(2)  # `_codes`' RECIPROCAL mode: codes by the exact product, no tie repair


class ActivationError(ValueError):
    """Bad input to the A-side row preparation."""


@jit
def _max_combine(a, b):
    return tl.maximum(a, b)


@jit
def _widen(raw, BF16_BITS: tl.constexpr):
    """Float32 values of loaded rows: bf16 arrives as its 16-bit patterns (BF16_BITS) and widens
    by a shift, exact for subnormals too (Triton's interpreter flushes them in a bf16 cast)."""
    if BF16_BITS:
        return (raw.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    return raw.to(tl.float32)


@jit
def _codes(x, scale, boost, inv, RECIPROCAL: tl.constexpr):
    """int8 codes round_half_even(x / scale), x float32 (BR, BK) with |x| ≤ 64·scale, and the
    per-row scale, boost (1 or 2^64) and inv = 1 / (scale·boost) as (BR, 1). No clamp: the
    quotient is within [−64, 64] for finite rows, and a NaN gives some int8 code, not a crash.
    RECIPROCAL 0 divides; 1 multiplies by inv and repairs exact ties (the same codes); 2
    (`PRODUCT_CODES`) is round_half_even of the exact product x·boost·inv (one fused rounding, the
    same on the GPU and in the interpreter), which differs from x / scale only where x / scale is
    an exact half-integer: any deterministic rounding is a valid A for the protocol."""
    if RECIPROCAL == PRODUCT_CODES:
        return tl.fma(x * boost, inv, _MAGIC).to(tl.int32, bitcast=True).to(tl.int8)
    if RECIPROCAL:
        xs = x * boost  # exact (a power of two; rows with max|x| < 2^-60 only)
        y = xs * inv  # within 2^-17 of x / scale: rounds like it unless x / scale is a tie
        tie = (((y - 0.5) + _MAGIC) - _MAGIC) + 0.5  # the half-integer nearest to y
        y = tl.where(tie * (scale * boost) == xs, tie, y)  # an exact product: equal iff a tie
    else:
        y = tl.math.div_rn(x, scale)
    return (y + _MAGIC).to(tl.int32, bitcast=True).to(tl.int8)  # low byte = the integer


@jit
def quantise_row_block(x_ptr, q_ptr, scale_ptr, row, rows, K, BR: tl.constexpr, BK: tl.constexpr,
                       ONE_PASS: tl.constexpr, TAIL: tl.constexpr, RECIPROCAL: tl.constexpr,
                       BF16_BITS: tl.constexpr):
    """Rows `row` (BR of them; those ≥ rows masked): scale = max|x| / 64 (1 if zero), q = the int7
    codes of x / scale. ONE_PASS: each row read once into registers, as a BK-wide block and
    (TAIL > 0, then BR = 1) a TAIL-wide one after it, BK + TAIL ≥ K (two power-of-two blocks leave
    fewer lanes idle than one: K 6144 = 4096 + 2048); else two passes over K in steps of BK.
    Shared by the quantiser and `codes_and_leaves` (which hashes the codes it writes)."""
    row_ok = row < rows
    at = row.to(tl.int64)[:, None] * K
    ks = tl.arange(0, BK)[None, :]
    if ONE_PASS:
        live = row_ok[:, None] & (ks < K)
        x = _widen(tl.load(x_ptr + at + ks, mask=live, other=0), BF16_BITS)
        if not TAIL:
            amax = tl.reduce(tl.abs(x), 1, _max_combine)
        else:
            ks_tail = BK + tl.arange(0, TAIL)[None, :]
            live_tail = row_ok[:, None] & (ks_tail < K)
            x_tail = _widen(tl.load(x_ptr + at + ks_tail, mask=live_tail, other=0), BF16_BITS)
            # BR = 1 here: both blocks reduce to plain scalars, so the two blocks' layouts need no
            # conversion (combining two per-row vectors made Triton convert all of x through
            # shared memory)
            amax = tl.full((BR,), 0.0, tl.float32) + tl.maximum(tl.reduce(tl.abs(x), None, _max_combine),
                                                                tl.reduce(tl.abs(x_tail), None, _max_combine))
    else:
        peak = tl.full((BR, BK), 0.0, tl.float32)
        for k0 in range(0, K, BK):
            live = row_ok[:, None] & (k0 + ks < K)
            x = _widen(tl.load(x_ptr + at + k0 + ks, mask=live, other=0), BF16_BITS)
            peak = tl.maximum(peak, tl.abs(x))
        amax = tl.reduce(peak, 1, _max_combine)
    scale = tl.where(amax > 0.0, amax * 0.015625, 1.0)  # / 64, exactly (a power of two)
    tl.store(scale_ptr + row, scale, mask=row_ok)
    boost = tl.where(amax < _TINY, _BOOST, 1.0)
    inv = tl.math.div_rn(tl.full((BR,), 1.0, tl.float32), scale * boost)
    scale, boost, inv = scale[:, None], boost[:, None], inv[:, None]
    if ONE_PASS:
        tl.store(q_ptr + at + ks, _codes(x, scale, boost, inv, RECIPROCAL), mask=live)
        if TAIL:
            tl.store(q_ptr + at + ks_tail, _codes(x_tail, scale, boost, inv, RECIPROCAL), mask=live_tail)
    else:
        for k0 in range(0, K, BK):
            live = row_ok[:, None] & (k0 + ks < K)
            x = _widen(tl.load(x_ptr + at + k0 + ks, mask=live, other=0), BF16_BITS)
            tl.store(q_ptr + at + k0 + ks, _codes(x, scale, boost, inv, RECIPROCAL), mask=live)


@jit
def _quantise_kernel(x_ptr, q_ptr, scale_ptr, zero_ptr, rows, K, R, BR: tl.constexpr, BK: tl.constexpr,
                     ONE_PASS: tl.constexpr, TAIL: tl.constexpr, RECIPROCAL: tl.constexpr,
                     BF16_BITS: tl.constexpr, ZERO_WIDTH: tl.constexpr):
    """Rows [BR·program_id, +BR) quantised (`quantise_row_block`).
    ZERO_WIDTH > 0: also zero the rows' R int32 of zero_ptr (the k-split A·P_B's accumulator,
    which then needs no memset launch of its own)."""
    row = tl.program_id(0) * BR + tl.arange(0, BR)
    if ZERO_WIDTH:
        ts = tl.arange(0, ZERO_WIDTH)[None, :]
        tl.store(zero_ptr + row.to(tl.int64)[:, None] * R + ts, tl.full((BR, ZERO_WIDTH), 0, tl.int32),
                 mask=(row < rows)[:, None] & (ts < R))
    quantise_row_block(x_ptr, q_ptr, scale_ptr, row, rows, K, BR, BK, ONE_PASS, TAIL, RECIPROCAL, BF16_BITS)


@jit
def apb_partial(q_ptr, pb_ptr, rows, ts, k_begin, steps, K, R: tl.constexpr, BK: tl.constexpr,
                PB_KMAJOR: tl.constexpr = 0):
    """q[rows, k_begin : k_begin + steps·BK] · P_B[same k, ts] as int32 (rows × ts) on the tensor
    cores; pb_ptr at the instance's P_B, stored K-major ((R, K): PB_KMAJOR=1, as the job stores
    it) or (K, R) row-major (a caller's contiguous P_B, read without a copy but transposed
    through shared memory at every step). Shared by the A·P_B kernel and the fused A side."""
    ks = tl.arange(0, BK)
    acc = tl.full((rows.shape[0], ts.shape[0]), 0, tl.int32)
    for step in range(0, steps):
        kk = k_begin + step * BK + ks
        q = tl.load(q_ptr + rows[:, None] * K + kk[None, :])
        if PB_KMAJOR:
            p = tl.trans(tl.load(pb_ptr + ts.to(tl.int64)[:, None] * K + kk[None, :]))
        else:
            p = tl.load(pb_ptr + kk.to(tl.int64)[:, None] * R + ts[None, :])
        acc = tl.dot(q, p, acc, out_dtype=tl.int32)
    return acc


@jit
def _apb_kernel(q_ptr, pb_ptr, pb_stride, apb_ptr, rows_per_instance, K, steps_per_split,
                R: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr, RB: tl.constexpr,
                ATOMIC: tl.constexpr, PB_KMAJOR: tl.constexpr, DEPENDENTS: tl.constexpr = 0):
    """apb[rows, rank block] (+)= q[rows, k-split] · P_B[instance][k-split, rank block].
    DEPENDENTS: let the next kernel (a programmatic dependent launch) start now, beside this one."""
    if DEPENDENTS:
        gdc_launch_dependents()
    block = tl.program_id(0)
    rows = (block * BR + tl.arange(0, BR)).to(tl.int64)
    inst = ((block * BR) // rows_per_instance).to(tl.int64)  # BR divides rows_per_instance
    ts = tl.program_id(2) * RB + tl.arange(0, RB)
    acc = apb_partial(q_ptr, pb_ptr + inst * pb_stride, rows, ts,
                      tl.program_id(1) * steps_per_split * BK, steps_per_split, K, R, BK, PB_KMAJOR)
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
    q = torch.empty(x.shape, dtype=torch.int8, device=x.device)
    scale = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    _quantise_into(x.contiguous(), q, scale, None)
    return q, scale


def one_pass_blocks(k: int) -> tuple[int, int] | None:
    """(BK, TAIL) of `quantise_row_block` holding a row of K values in registers in one pass:
    the largest power of two ≤ K and the power of two covering the rest (0 if none); None for
    rows too long for one pass."""
    width = triton.next_power_of_2(k)
    if width > _ONE_PASS_MAX:
        return None
    block_k = width if width == k else width // 2
    return block_k, triton.next_power_of_2(k - block_k) if k > block_k else 0


def _quantise_into(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None) -> None:
    """The quantiser's launch on contiguous x; zero: an int32 (rows, r) buffer to clear, or None."""
    k = x.shape[-1]
    rows = x.numel() // k if k else 0
    if rows == 0:
        scale.fill_(1.0)
        return
    width = triton.next_power_of_2(k)
    blocks = one_pass_blocks(k)
    one_pass = blocks is not None
    block_k, tail = blocks or (_TWO_PASS_BLOCK, 0)
    block_rows = max(1, _TWO_PASS_BLOCK // width) if rows >= _PREFILL_ROWS and not tail else 1
    values = block_rows * (block_k + tail)
    warps = min(32, max(4, triton.next_power_of_2(values // (32 * _VALUES_PER_THREAD))))
    bf16 = x.dtype == torch.bfloat16
    rank = zero.shape[-1] if zero is not None else 0
    _quantise_kernel[(triton.cdiv(rows, block_rows),)](
        x.view(torch.int16) if bf16 else x, q, scale, scale if zero is None else zero,  # scale: unused
        rows, k, rank, BR=block_rows, BK=block_k, ONE_PASS=int(one_pass), TAIL=tail,
        RECIPROCAL=int(bf16 or x.dtype == torch.float16), BF16_BITS=int(bf16),
        ZERO_WIDTH=triton.next_power_of_2(rank) if rank else 0, num_warps=warps)


def _apb_blocks(rows_total: int, rows_per_instance: int) -> tuple[int, int]:
    """(rows per program, warps): 128 rows (two wgmma warpgroups) or 64 when every SM still gets
    a program and the instance's rows divide; else 16 (mma.sync) with a k-split."""
    for block_rows, warps in ((128, 8), (64, 4)):
        if rows_per_instance % block_rows == 0 and rows_total // block_rows >= _SMS:
            return block_rows, warps
    return ROWS, 4


@dataclass(frozen=True)
class _ApbPlan:
    """The A·P_B launch for one shape: grid, block sizes, and P_B as the kernel reads it."""
    p_b: torch.Tensor
    rows_per_instance: int
    block_rows: int
    warps: int
    block_k: int
    splits: int
    rank_block: int
    k_major: bool

    @property
    def rank(self) -> int:
        return self.p_b.shape[2]


def _apb_plan(shape: torch.Size, p_b: torch.Tensor, rows_per_instance: int) -> _ApbPlan:
    """Check the rows (shape (..., K)) and P_B against each other and pick the launch."""
    k = shape[-1]
    rows_total = math.prod(shape[:-1])
    if rows_per_instance <= 0 or rows_per_instance % ROWS or rows_total % rows_per_instance:
        raise ActivationError(f"rows per instance must be a multiple of {ROWS} dividing {rows_total}, "
                              f"got {rows_per_instance}")
    instances = rows_total // rows_per_instance
    if (p_b.dtype != torch.int8 or p_b.dim() != 3 or p_b.shape[0] not in (1, instances)
            or p_b.shape[1] != k or k % 64 or k == 0):
        raise ActivationError(f"need K a positive multiple of 64 and an int8 P_B (1 or {instances}, {k}, r), "
                              f"got K={k}, {p_b.dtype} {tuple(p_b.shape)}")
    rank = p_b.shape[2]
    rank_block = min(rank, _RANK_BLOCK)
    if rank % rank_block or rank < 16:
        raise ActivationError(f"rank {rank} must be at least 16 and a multiple of {_RANK_BLOCK} or smaller")
    k_major = p_b.stride(1) == 1 and p_b.stride(2) == k
    if not k_major and (p_b.stride(2) != 1 or p_b.stride(1) != rank):
        p_b = p_b.contiguous()
    block_rows, warps = _apb_blocks(rows_total, rows_per_instance)
    block_k = 128 if k % 128 == 0 else 64
    programs = rows_total // block_rows * (rank // rank_block)
    splits = _splits(k // block_k, programs) if block_rows == ROWS else 1
    return _ApbPlan(p_b, rows_per_instance, block_rows, warps, block_k, splits, rank_block, k_major)


def _apb_launch(q: torch.Tensor, apb: torch.Tensor, plan: _ApbPlan) -> None:
    """A·P_B into apb (zeroed beforehand when plan.splits > 1: the splits add atomically)."""
    k = q.shape[-1]
    p_b = plan.p_b
    grid = (q.numel() // k // plan.block_rows, plan.splits, plan.rank // plan.rank_block)
    _apb_kernel[grid](
        q, p_b, 0 if p_b.shape[0] == 1 else k * plan.rank, apb, plan.rows_per_instance, k,
        k // plan.block_k // plan.splits, R=plan.rank, BR=plan.block_rows, BK=plan.block_k,
        RB=plan.rank_block, ATOMIC=int(plan.splits > 1), PB_KMAJOR=int(plan.k_major),
        DEPENDENTS=int(pdl_enabled()), num_warps=plan.warps, num_stages=3)


def a_times_p_b(q: torch.Tensor, p_b: torch.Tensor, *, rows_per_instance: int) -> torch.Tensor:
    """A·P_B as int32 (*q.shape[:-1], r) for int7 codes q (..., K); p_b: (instances, K, r) int8
    (or (1, K, r): one factor for all rows), the instance of a row being row // rows_per_instance;
    stored K-major as `noise.dense_sparse_factor` makes it (fastest) or (K, r)-contiguous."""
    if q.dtype != torch.int8:
        raise ActivationError(f"A·P_B needs int8 codes, got {q.dtype}")
    plan = _apb_plan(q.shape, p_b, rows_per_instance)
    alloc = torch.zeros if plan.splits > 1 else torch.empty
    apb = alloc((*q.shape[:-1], plan.rank), dtype=torch.int32, device=q.device)
    _apb_launch(q.contiguous(), apb, plan)
    return apb


def int7_codes(x: torch.Tensor, scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale): floating x is quantised; int8 x is taken as int7 codes with the given scale."""
    if x.is_floating_point():
        return quantise_rows(x)
    if x.dtype != torch.int8 or scale is None:
        raise ActivationError(f"x must be floating point, or int8 codes with their scale; got {x.dtype}")
    return x, scale


def prepare_rows(x: torch.Tensor, p_b: torch.Tensor, *, rows_per_instance: int,
                 scale: torch.Tensor | None = None,
                 after_codes: Callable[[torch.Tensor], None] | None = None,
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, scale, A·P_B) for rows x (..., K): floating x is quantised; int8 x is taken as int7 codes
    (then `scale` is passed through). A·P_B: int32 (*x.shape[:-1], r); p_b as in `a_times_p_b`.
    Two launches for floating x: the quantiser also zeroes a k-split A·P_B's accumulator. The
    last launch is always A·P_B's, which writes only the result (`mined_gemm(after_apb=True)`
    relies on it: that GEMM overlaps A·P_B and waits for it only before its peel).
    after_codes(q) is called once q's launch is enqueued and before A·P_B's (the lagged pass forks
    its side chain there, so it is dispatched while A·P_B runs, ahead of the GEMM)."""
    fork = after_codes if after_codes is not None else (lambda q: None)
    if not x.is_floating_point():
        q, scale = int7_codes(x, scale)
        q = q.contiguous()  # any copy comes before A·P_B, never between it and the GEMM
        fork(q)
        return q, scale, a_times_p_b(q, p_b, rows_per_instance=rows_per_instance)
    plan = _apb_plan(x.shape, p_b, rows_per_instance)
    q = torch.empty(x.shape, dtype=torch.int8, device=x.device)
    scale = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    apb = torch.empty((*x.shape[:-1], plan.rank), dtype=torch.int32, device=x.device)
    _quantise_into(x.contiguous(), q, scale, apb if plan.splits > 1 else None)
    fork(q)
    _apb_launch(q, apb, plan)
    return q, scale, apb
