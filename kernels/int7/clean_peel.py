"""The lagged decode pass's served rows after the CuTe GEMM: A·B from A·B' (raw int32) and the
bf16 output. B' = B + E_B with E_B = P_B·U_Bᵀ per expert, so A·B = A·B' − (A·P_B)·U_Bᵀ: a rank-r
product per expert, exact in wrapping int32 as three int8 dots with A·P_B split into signed
base-256 limbs (`mined_gemm.minus_rank_term`; |A·P_B| ≤ 64·K keeps the top limb within ±65 up to
K = 2^16), then the scales in the stacked peel's order ((A·B) · s_a · s_b, rounded to bf16), so
the served bits equal the Triton lagged pass's.

A program holds one expert's M served rows (M ≤ 64 at decode) and BN columns: it reads its U_B
block once for all of them (U_B, E·N·r bytes, is the pass's largest read here).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_jit import jit

from .mined_gemm import check_operand, minus_rank_term

_COLS = 64  # output columns a program
_WARPS = 4
MAX_ROWS = 64  # served rows an expert (decode)


class CleanPeelError(ValueError):
    """Bad input to the served rows' peel."""


@jit
def _clean_peel_kernel(raw_ptr, apb_ptr, ub_ptr, sa_ptr, sb_ptr, out_ptr, out32_ptr, M, N, raw_rows, raw_first,
                       R: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, WRITE_I32: tl.constexpr):
    """Expert program_id(1), columns program_id(0)·BN …: rows raw_first … raw_first + M − 1 of the
    expert's raw_rows in raw (E, raw_rows, N) minus (A·P_B)·U_Bᵀ, scaled into out (E, M, N)."""
    e = tl.program_id(1).to(tl.int64)
    rm = tl.arange(0, BM)
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    ts = tl.arange(0, R)
    live = rm < M
    rest = tl.load(apb_ptr + (e * M + rm).to(tl.int64)[:, None] * R + ts[None, :], mask=live[:, None], other=0)
    ub = tl.load(ub_ptr + (e * N + rn).to(tl.int64)[:, None] * R + ts[None, :])
    result = tl.load(raw_ptr + (e * raw_rows + raw_first + rm).to(tl.int64)[:, None] * N + rn[None, :],
                     mask=live[:, None], other=0)
    result = minus_rank_term(result, rest, ub)
    at = (e * M + rm).to(tl.int64)[:, None] * N + rn[None, :]
    if WRITE_I32:
        tl.store(out32_ptr + at, result, mask=live[:, None])
    scale_a = tl.load(sa_ptr + e * M + rm, mask=live, other=0.0)
    scale_b = tl.load(sb_ptr + e * N + rn)
    value = result.to(tl.float32) * scale_a[:, None] * scale_b[None, :]
    tl.store(out_ptr + at, value.to(tl.bfloat16), mask=live[:, None])


def clean_peel(raw: torch.Tensor, raw_first: int, apb: torch.Tensor, u_b: torch.Tensor, scale_a: torch.Tensor,
               scale_b: torch.Tensor, out: torch.Tensor, out_i32: torch.Tensor | None = None) -> None:
    """out (E, M, N) bf16 = (A·B) · s_a · s_b with A·B = raw[:, raw_first : raw_first + M] −
    (A·P_B)·U_Bᵀ per expert; raw (E, rows, N) int32 A·B' (exact, wrapping), apb (E, M, r) int32,
    u_b (E, N, r) int8, scale_a (E, M) and scale_b (E, N) float32; out_i32: also the exact A·B."""
    experts, m, n = out.shape
    rank = u_b.shape[-1]
    if not 0 < m <= MAX_ROWS or n % _COLS or raw.dim() != 3 or not 0 <= raw_first <= raw.shape[1] - m:
        raise CleanPeelError(f"{m} served rows (at most {MAX_ROWS}) at row {raw_first} of raw "
                             f"{tuple(raw.shape)}, N = {n} (a multiple of {_COLS})")
    for name, t, shape, dtype in (("raw", raw, (experts, raw.shape[1], n), torch.int32),
                                  ("apb", apb, (experts, m, rank), torch.int32),
                                  ("u_b", u_b, (experts, n, rank), torch.int8),
                                  ("scale_a", scale_a, (experts, m), torch.float32),
                                  ("scale_b", scale_b, (experts, n), torch.float32),
                                  ("out", out, (experts, m, n), torch.bfloat16)):
        check_operand(name, t, shape, dtype)
    if out_i32 is not None:
        check_operand("out_i32", out_i32, (experts, m, n), torch.int32)
    _clean_peel_kernel[(n // _COLS, experts)](
        raw, apb, u_b, scale_a, scale_b, out, out if out_i32 is None else out_i32, m, n, raw.shape[1], raw_first,
        R=rank, BM=max(16, triton.next_power_of_2(m)), BN=_COLS, WRITE_I32=int(out_i32 is not None),
        num_warps=_WARPS)
