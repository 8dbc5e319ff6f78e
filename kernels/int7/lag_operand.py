"""The lagged decode pass's GEMM operand on the CuTe int8 GEMM: per expert, the READY noised rows
of launch t−1 (mined) stacked on the clean int7 rows of launch t (served), so one grouped GEMM
reads B' once for both (decode is memory-bound: twice the rows cost next to nothing).

One launch copies, for every expert e, rows [0, M) of the (E, 2M, K) operand from READY's A'
(the LagPhase pair's current set: CUDA graphs bake pointers, so the kernel reads the phase word
and shifts its source itself) and rows [M, 2M) from q, and copies READY's s_A and mineable row
counts into fixed buffers, so the lottery after the GEMM reads plain pointers.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_jit import jit

from .mined_gemm import LagPhase, check_lag, check_operand, lag_set

ROW_BLOCK = 16  # rows a program (divides M: decode row counts are multiples of 16)
_COLS = 1024  # bytes of a row a program
_WARPS = 4


class LagOperandError(ValueError):
    """Bad input to the lagged operand builder."""


@jit
def _stack_kernel(an_ptr, q_ptr, sa_ptr, valid_ptr, phase_ptr, phase_words, out_ptr, sa_out_ptr, valid_out_ptr,
                  counter_ptr, experts, M, K, BR: tl.constexpr, BK: tl.constexpr, SMALL: tl.constexpr,
                  ZERO_COUNTER: tl.constexpr):
    """Program (row block, column block): BR rows of the stacked operand; program (0, 0) also
    copies READY's s_A (E × 8 words) and row counts (E) in SMALL-word steps, and with
    ZERO_COUNTER zeroes the GEMM's tile counter (no memset launch in front of the GEMM)."""
    ready = lag_set(phase_ptr, 1, 0)
    row0 = tl.program_id(0) * BR  # a row of the (E·2M, K) operand; BR divides M
    e = row0 // (2 * M)
    local = row0 % (2 * M)
    rows = tl.arange(0, BR).to(tl.int64)
    ks = tl.program_id(1) * BK + tl.arange(0, BK)
    live = (ks < K)[None, :]
    if local < M:  # mined rows: READY's A'
        src = an_ptr + ready * 4 * phase_words + (e * M + local).to(tl.int64) * K
    else:  # served rows: this launch's int7 codes
        src = q_ptr + (e * M + local - M).to(tl.int64) * K
    block = tl.load(src + rows[:, None] * K + ks[None, :], mask=live, other=0)
    tl.store(out_ptr + (row0 + rows)[:, None] * K + ks[None, :], block, mask=live)
    if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
        if ZERO_COUNTER:
            tl.store(counter_ptr, 0)
        for w0 in range(0, experts * 8, SMALL):
            w = w0 + tl.arange(0, SMALL)
            tl.store(sa_out_ptr + w, tl.load(sa_ptr + ready * phase_words + w, mask=w < experts * 8),
                     mask=w < experts * 8)
        for w0 in range(0, experts, SMALL):
            w = w0 + tl.arange(0, SMALL)
            tl.store(valid_out_ptr + w, tl.load(valid_ptr + ready * phase_words + w, mask=w < experts),
                     mask=w < experts)


def stack_lagged_rows(a_noised: torch.Tensor, s_a: torch.Tensor, valid: torch.Tensor, lag: LagPhase,
                      q: torch.Tensor, out: torch.Tensor, s_a_out: torch.Tensor, valid_out: torch.Tensor,
                      tile_counter: torch.Tensor | None = None) -> None:
    """out (E, 2M, K) int8 = per expert [READY A' (M rows) ; q (M rows)]; s_a_out (E, 8) and
    valid_out (E,) int32 = READY's s_A and mineable row counts. a_noised (E, M, K) int8, s_a and
    valid are set 0's views of the LagPhase pair `lag` (READY = set `lag.phase`); q (E, M, K) int8.
    tile_counter: (1,) int32, zeroed by the same launch (the dynamic GEMM's counter)."""
    experts, rows, k = q.shape
    if rows % ROW_BLOCK:
        raise LagOperandError(f"rows per expert must be a multiple of {ROW_BLOCK}, got {rows}")
    check_lag(lag)
    for name, t, shape, dtype in (("a_noised", a_noised, (experts, rows, k), torch.int8),
                                  ("q", q, (experts, rows, k), torch.int8),
                                  ("out", out, (experts, 2 * rows, k), torch.int8),
                                  ("s_a", s_a, (experts, 8), torch.int32),
                                  ("valid", valid, (experts,), torch.int32),
                                  ("s_a_out", s_a_out, (experts, 8), torch.int32),
                                  ("valid_out", valid_out, (experts,), torch.int32)):
        check_operand(name, t, shape, dtype)
    if tile_counter is not None:
        check_operand("tile_counter", tile_counter, (1,), torch.int32)
    block_k = min(_COLS, triton.next_power_of_2(k))
    grid = (experts * 2 * rows // ROW_BLOCK, triton.cdiv(k, block_k))
    _stack_kernel[grid](a_noised, q, s_a, valid, lag.phase, lag.words, out, s_a_out, valid_out,
                        valid_out if tile_counter is None else tile_counter, experts, rows, k,
                        BR=ROW_BLOCK, BK=block_k, SMALL=256, ZERO_COUNTER=int(tile_counter is not None),
                        num_warps=_WARPS)
