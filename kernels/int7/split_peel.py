"""The peel as its own pass over the raw accumulator (prefill): A·B from A'·B' without a second MMA
over the weights.

A' = A + U_A·P_Aᵀ and B'ᵀ = Bᵀ + U_B·P_Bᵀ, so

    A·B = A'·B' − U_A·Q − (A·P_B)·U_Bᵀ,   Q = P_Aᵀ·B'   (r × N per instance),

exactly in wrapping int32 arithmetic (the true A·B fits in int32). The mined GEMM then runs with
its transcript only and writes A'·B' as int32 (`mined_gemm(peel=False, out=None)`); Qᵀ = B'·P_A is
one plain int8 GEMM over the weights (`noise_product`: a memory-bound pass, ~8 % of a compute-bound
prefill GEMM). Both correction terms are then one int8 GEMM of depth D·2r, digit by digit: with
Q and A·P_B split into D signed base-256 digits (`digit_operands`),

    U_A·Q + (A·P_B)·U_Bᵀ = Σ_d 256^d · [U_A | (A·P_B)_d] · [Q_d | U_B]ᵀ,

and the peel kernel walks the digits top first (Horner: ×256 at each digit boundary), subtracts the
sum from the raw block and writes the dequantised bf16 output (and, when asked, the exact A·B over
the raw block, in place).

Why at prefill only: the stacked peel (mined_gemm's second MMA of the clean rows) doubles the
tensor-core work of a compute-bound GEMM, while at decode it rides along a memory-bound one for
free and the extra pass over B' here would double the traffic (docs/kernels-int7.md).
"""
from __future__ import annotations

import torch
import triton.language as tl

from kernels.triton_jit import jit
from .mined_gemm import MinedGemmError, Tiling, check_operand, plain_gemm, split_limb

# |A·P_B| ≤ 64·K < 2^23 takes three signed base-256 digits; a fourth (when Q needs one) is 0
_Q_BOUND = 127  # |B'| ≤ 64 + 63, and a column of P_A holds at most K entries ±1
_THREE_LIMBS = 127 * (1 + 256 + 65536)  # |x| up to this splits into three signed digits
_DIGIT_ROWS = 32  # rows per program of the digit-operand kernel


def q_limbs(k: int) -> int:
    """Digits of Q = P_Aᵀ·B': three while |Q| ≤ 127·K stays below 2^23 (every K the protocol's
    tile limits allow on the bench shapes), else all four of an int32."""
    return 3 if _Q_BOUND * k <= _THREE_LIMBS else 4


def default_peel_tiling(m: int, n: int, rank: int) -> Tiling:
    """64 × 128 blocks of 4 warps, 3 stages, k steps of up to 128 (a digit segment is 2r, a
    multiple of 64): the fastest measured on the H200 (GLM-5 prefill, peel kernel alone: 867 µs
    against 951 at 4 stages, 1099 for 128 × 128 of 8 warps, 1142 for 64 × 256; Qwen3 prefill
    alike, docs/kernels-int7.md); smaller blocks where the shape needs them."""
    def largest(extent: int, options: tuple[int, ...]) -> int:
        return next((b for b in options if extent % b == 0), options[-1])

    return Tiling(largest(m, (64, 32, 16)), largest(n, (128, 64, 32, 16)), min(2 * rank, 128),
                  num_warps=4, num_stages=3)


@jit
def _digit_operand_kernel(small_ptr, wide_ptr, out_ptr, rows, R: tl.constexpr, DIGITS: tl.constexpr,
                          WIDE_FIRST: tl.constexpr, BR: tl.constexpr):
    """Rows of a peel operand: per digit d (top first), [small | digit d of wide] or, WIDE_FIRST,
    [digit d of wide | small]; small is int8 (U_A or U_B), wide int32 (A·P_B or Q)."""
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    live = (r < rows)[:, None]
    r64 = r.to(tl.int64)[:, None]
    j = tl.arange(0, R)[None, :]
    small = tl.load(small_ptr + r64 * R + j, mask=live, other=0)
    rest = tl.load(wide_ptr + r64 * R + j, mask=live, other=0)
    row = out_ptr + r64 * (DIGITS * 2 * R)
    for d in tl.static_range(DIGITS):
        digit, rest = split_limb(rest)
        at = row + (DIGITS - 1 - d) * 2 * R
        tl.store(at + j + (0 if WIDE_FIRST else R), digit, mask=live)
        tl.store(at + j + (R if WIDE_FIRST else 0), small, mask=live)


@jit
def _split_peel_kernel(raw_ptr, left_ptr, right_ptr, sa_ptr, sb_ptr, out_ptr, out32_ptr, M, N,
                       DEPTH: tl.constexpr, SEGMENT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                       BK: tl.constexpr, WRITE_I32: tl.constexpr):
    """One BM × BN block of instance program_id(2): raw − left·rightᵀ with ×256 at every digit
    boundary (SEGMENT = 2r of the DEPTH), then the scales. The raw block is loaded before the k
    loop, so its 32 KB read overlaps the products (H200, GLM-5 prefill: 867 vs 950 µs loaded after
    them; +10 registers, no spill)."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    e = tl.program_id(2).to(tl.int64)
    rows = (e * M + pid_m * BM + tl.arange(0, BM)).to(tl.int64)
    cols = (e * N + pid_n * BN + tl.arange(0, BN)).to(tl.int64)
    kk = tl.arange(0, BK)
    offsets = rows[:, None] * N + (pid_n * BN + tl.arange(0, BN))[None, :]
    raw = tl.load(raw_ptr + offsets)
    correction = tl.full((BM, BN), 0, tl.int32)
    for k0 in range(0, DEPTH, BK):
        if (k0 % SEGMENT == 0) & (k0 > 0):
            correction = correction * 256
        left = tl.load(left_ptr + rows[:, None] * DEPTH + k0 + kk[None, :])
        right = tl.load(right_ptr + cols[:, None] * DEPTH + k0 + kk[None, :])
        correction = tl.dot(left, tl.trans(right), correction, out_dtype=tl.int32)
    result = raw - correction
    if WRITE_I32:
        tl.store(out32_ptr + offsets, result)
    scale_a = tl.load(sa_ptr + rows)
    scale_b = tl.load(sb_ptr + cols)
    value = result.to(tl.float32) * scale_a[:, None] * scale_b[None, :]
    tl.store(out_ptr + offsets, value.to(tl.bfloat16))


def noise_product(bt_noised: torch.Tensor, p_a_t: torch.Tensor, out: torch.Tensor) -> None:
    """Qᵀ = B'·P_A per instance into out (E, N, r) int32: bt_noised (E, N, K) int8 and P_Aᵀ
    (E, r, K) int8 (K-contiguous, as `noise.dense_sparse_factor` stores it)."""
    plain_gemm(bt_noised, p_a_t, None, None, out=None, out_i32=out)


def digit_operands(u_a: torch.Tensor, apb: torch.Tensor, q_t: torch.Tensor, u_b: torch.Tensor, *,
                   digits: int, left: torch.Tensor, right: torch.Tensor) -> None:
    """The peel GEMM's operands: left (E, M, D·2r) = per digit [U_A | (A·P_B)_d], right
    (E, N, D·2r) = per digit [Q_d | U_B], top digit first (two launches)."""
    e, m, rank = u_a.shape
    n, depth = u_b.shape[1], digits * 2 * rank
    for name, t, shape, dtype in (("u_a", u_a, (e, m, rank), torch.int8), ("apb", apb, (e, m, rank), torch.int32),
                                  ("q_t", q_t, (e, n, rank), torch.int32), ("u_b", u_b, (e, n, rank), torch.int8),
                                  ("left", left, (e, m, depth), torch.int8),
                                  ("right", right, (e, n, depth), torch.int8)):
        check_operand(name, t, shape, dtype)
    for small, wide, out, wide_first in ((u_a, apb, left, False), (u_b, q_t, right, True)):
        rows = small.shape[0] * small.shape[1]
        rank = small.shape[2]
        _digit_operand_kernel[(-(-rows // _DIGIT_ROWS),)](small, wide, out, rows, R=rank, DIGITS=digits,
                                                          WIDE_FIRST=int(wide_first), BR=_DIGIT_ROWS)


def split_peel(raw: torch.Tensor, u_a: torch.Tensor, q_t: torch.Tensor, apb: torch.Tensor,
               u_b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, *, k: int,
               out: torch.Tensor, exact_in_place: bool = False, tiling: Tiling | None = None,
               operands: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """out (E, M, N) bf16 = dequant(A·B) from raw = A'·B' (E, M, N) int32, U_A (E, M, r) int8,
    Qᵀ (E, N, r) int32, A·P_B (E, M, r) int32, U_B (E, N, r) int8, scale_a (E, M), scale_b (E, N)
    float32; K is the GEMM depth (it bounds Q). exact_in_place: raw is overwritten with A·B.
    operands: the (left, right) digit buffers to reuse ((E, M, D·2r) and (E, N, D·2r) int8, D =
    q_limbs(k)); allocated here when None. `digit_operands` then `peel_digits`, in one call."""
    e, m, n = raw.shape
    rank = u_a.shape[-1]
    left, right = operands if operands is not None else peel_operands(e, m, n, rank, k, raw.device)
    digit_operands(u_a, apb, q_t, u_b, digits=q_limbs(k), left=left, right=right)
    peel_digits(raw, left, right, scale_a, scale_b, rank=rank, out=out, exact_in_place=exact_in_place,
                tiling=tiling)


def peel_digits(raw: torch.Tensor, left: torch.Tensor, right: torch.Tensor, scale_a: torch.Tensor,
                scale_b: torch.Tensor, *, rank: int, out: torch.Tensor, exact_in_place: bool = False,
                tiling: Tiling | None = None) -> None:
    """The peel GEMM on digit operands built ahead by `digit_operands` (the pipeline builds them on
    its side stream beside the mined GEMM, so only this pass follows the GEMM)."""
    e, m, n = raw.shape
    depth = left.shape[-1] if left.dim() == 3 else 0
    if depth == 0 or depth % (2 * rank):
        raise MinedGemmError(f"left must be (E, M, D·2r) digit columns for rank {rank}, got {tuple(left.shape)}")
    check_operand("raw", raw, (e, m, n), torch.int32)
    check_operand("left", left, (e, m, depth), torch.int8)
    check_operand("right", right, (e, n, depth), torch.int8)
    check_operand("scale_a", scale_a, (e, m), torch.float32)
    check_operand("scale_b", scale_b, (e, n), torch.float32)
    check_operand("out", out, (e, m, n), torch.bfloat16)
    tiling = tiling or default_peel_tiling(m, n, rank)
    for extent, block, what in ((m, tiling.block_m, "M"), (n, tiling.block_n, "N"),
                                (2 * rank, tiling.block_k, "2·rank")):
        if extent % block:
            raise MinedGemmError(f"{what}={extent} is not a multiple of the peel block {block}")
    grid = (n // tiling.block_n, m // tiling.block_m, e)
    _split_peel_kernel[grid](raw, left, right, scale_a, scale_b, out, raw, m, n, DEPTH=depth,
                             SEGMENT=2 * rank, BM=tiling.block_m, BN=tiling.block_n, BK=tiling.block_k,
                             WRITE_I32=int(exact_in_place), num_warps=tiling.num_warps,
                             num_stages=tiling.num_stages)


def peel_operands(experts: int, m: int, n: int, rank: int, k: int,
                  device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """Buffers for the peel GEMM's digit operands (left, right); a static pass allocates them once."""
    depth = q_limbs(k) * 2 * rank
    return (torch.empty((experts, m, depth), dtype=torch.int8, device=device),
            torch.empty((experts, n, depth), dtype=torch.int8, device=device))
