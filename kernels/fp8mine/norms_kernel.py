"""Row norms (§4) as one Triton kernel: linf and the exact integer-frame l2 per row.

Per row: blocks of 8 codes with a bf16 scale |s| = M·2^(E*−134); p_b = M²·Σq² (< 2^33);
E_MAX = max 2E* over live blocks; S = Σ floor(p_b·2^Wl2 / 2^(E_MAX − 2E*)) (int64, < 2^61);
l2 = grid4(RNE_bf16(√(S·2^(E_MAX−268−Wl2)/k))); linf = RNE_bf16(max |q|·|s|).
The square root is correctly rounded without big integers: an f64 estimate gives a candidate
code within one of the answer, and exact int64 comparisons of v with the squared midpoints to the
neighbouring codes (shifting the side with the larger exponent down and keeping the remainder, so
nothing overflows) pick the RNE result. S needs E_MAX first: with the whole row in one step
(k ≤ 8192) the per-block terms are computed once and both reductions read them from registers;
longer rows take two passes over the blocks (E_MAX, then S).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_jit import jit

from .noisy_kernel import _rne_bf16

_MAX_BLOCKS = 1024  # scale blocks (of 8 codes) per step: 8192 codes, 32 per thread of 8 warps


def block_shape(nblocks: int) -> tuple[int, int]:
    """(rows, scale blocks) per program and step: one row per program, the whole row in one step
    up to k = 8192 (64 decode rows then spread over 64 SMs and read their codes once per pass;
    the first pass put 4 rows on a program that walked 64 blocks at a time, 12 serial steps per
    pass at k = 6144, on 16 programs)."""
    return 1, min(_MAX_BLOCKS, triton.next_power_of_2(nblocks))


def _warps(blocks_per_step: int) -> int:
    """8 warps from 512 blocks a step: the 1024-block row then takes 125 registers (no spills) and
    an SM holds 16 warps; with 4 warps it took 196 and an SM held 8 (sm_90 cubin, cuobjdump)."""
    return 8 if blocks_per_step >= 512 else 4


@jit
def _block_terms(codes_ptr, scales_ptr, rows, row_live, b0, nblocks, k,
                 BR: tl.constexpr, BB: tl.constexpr):
    """Per (row, block): energy M²Σq² (int64), doubled exponent 2·max(E*, 1), peak |q|max·|s| (f32)."""
    blocks = b0 + tl.arange(0, BB)
    live = row_live[:, None] & (blocks < nblocks)[None, :]
    scale = tl.load(scales_ptr + rows[:, None] * nblocks + blocks[None, :], mask=live, other=0)
    lane = tl.arange(0, 8)
    code_ptr = codes_ptr + rows[:, None, None] * k + blocks[None, :, None] * 8 + lane[None, None, :]
    q = tl.load(code_ptr, mask=live[:, :, None], other=0).to(tl.int32)
    return block_terms_of(q, scale.to(tl.int32))


@jit
def block_terms_of(q, scale_bits):
    """Block terms from codes q (rows, blocks, 8) int32 and bf16 scale bits (rows, blocks) int32:
    shared by this kernel (planes loaded) and the fused decode row kernel (planes in registers)."""
    magnitude = scale_bits & 0x7FFF
    exp_field = magnitude >> 7
    mantissa = (magnitude & 0x7F) + tl.where(exp_field != 0, 128, 0)
    doubled = 2 * tl.maximum(exp_field, 1)
    # tl.sum's / tl.max's own combines: the same operations on the GPU, and the interpreter then
    # reduces with numpy instead of element by element
    square_sum = tl.reduce(q * q, 2, tl.standard._sum_combine)
    peak = tl.reduce(tl.abs(q), 2, tl.standard._elementwise_max)
    energy = (mantissa * mantissa).to(tl.int64) * square_sum.to(tl.int64)
    value = (magnitude << 16).to(tl.float32, bitcast=True)
    return energy, doubled, peak.to(tl.float32) * value


@jit
def _compare_scaled(a, a_exp, b):
    """sign(a·2^a_exp − b) for int64 a, b in [0, 2^62)."""
    up = a_exp >= 0
    shift = tl.minimum(tl.abs(a_exp), 63).to(tl.int64)
    big = tl.where(up, b, a)
    small = tl.where(up, a, b)
    quotient = big >> shift
    remainder = big - (quotient << shift)
    order = tl.where(small > quotient, 1, tl.where(small < quotient, -1, 0))
    tie = tl.where(remainder != 0, -1, 0)
    small_vs_big = tl.where(order != 0, order, tie)
    return tl.where(up, small_vs_big, -small_vs_big)


@jit
def _sqrt_vs_midpoint(num, exponent, k, code):
    """sign(√(num·2^exponent/k) − midpoint(code, code + 1))."""
    exp_lo = code >> 7
    sig_lo = (code & 0x7F) + tl.where(exp_lo != 0, 128, 0)
    q_lo = tl.maximum(exp_lo, 1) - 134
    hi = code + 1
    exp_hi = hi >> 7
    sig_hi = (hi & 0x7F) + tl.where(exp_hi != 0, 128, 0)
    q_hi = tl.maximum(exp_hi, 1) - 134
    doubled_mid = (sig_lo + (sig_hi << (q_hi - q_lo))).to(tl.int64)
    return _compare_scaled(num, exponent - 2 * q_lo + 2, k * doubled_mid * doubled_mid)


@jit
def _rne_sqrt_code(num, exponent, k):
    """RNE_bf16(√(num·2^exponent/k)) as an int32 bf16 code (num > 0)."""
    scale = ((exponent + 1023).to(tl.int64) << 52).to(tl.float64, bitcast=True)  # 2^exponent
    estimate = tl.sqrt(num.to(tl.float64) * scale / k)
    candidate = _rne_bf16(estimate.to(tl.float32).to(tl.int32, bitcast=True)) >> 16
    lower = tl.maximum(candidate - 1, 0)
    below = _sqrt_vs_midpoint(num, exponent, k, lower)
    above = _sqrt_vs_midpoint(num, exponent, k, candidate)
    down = (candidate > 0) & ((below < 0) | ((below == 0) & ((lower & 1) == 0)))
    up = (above > 0) | ((above == 0) & ((candidate & 1) == 1))
    return tl.where(down, lower, tl.where(up, candidate + 1, candidate))


@jit
def _frame_sum(energy, doubled, e_max, wl2):
    """Σ floor(energy · 2^Wl2 / 2^(E_MAX − doubled)) over the blocks axis (int64)."""
    shift = tl.minimum(tl.maximum(e_max[:, None] - doubled, 0), 63).to(tl.int64)
    return tl.reduce((energy << wl2) >> shift, 1, tl.standard._sum_combine)


@jit
def _norm_codes(frame, e_max, peak, k, wl2):
    """(l2, linf) bf16 codes (int32) from a row's frame sum S, E_MAX and peak |q|·|s|."""
    root = _rne_sqrt_code(tl.maximum(frame, 1), e_max - 268 - wl2, k)
    l2 = tl.where(frame != 0, (root + 2) & ~3, 0)
    return l2, _rne_bf16(peak.to(tl.int32, bitcast=True)) >> 16


@jit
def norms_of_terms(energy, doubled, block_peak, k, wl2):
    """(l2, linf) bf16 codes (int32) of rows whose block terms (rows, blocks) are all in hand."""
    e_max = tl.reduce(tl.where(energy != 0, doubled, 0), 1, tl.standard._elementwise_max)
    peak = tl.reduce(block_peak, 1, tl.standard._elementwise_max)
    return _norm_codes(_frame_sum(energy, doubled, e_max, wl2), e_max, peak, k, wl2)


@jit
def _norms_kernel(codes_ptr, scales_ptr, l2_ptr, linf_ptr, num_rows, k, wl2,
                  BR: tl.constexpr, BB: tl.constexpr, ONE_STEP: tl.constexpr):
    """ONE_STEP (the row fits in one BB-block step): the block terms are computed once and kept
    in registers for both reductions; otherwise pass 1 (E_MAX, peak) and pass 2 (S) each walk
    the row."""
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    row_live = rows < num_rows
    rows64 = tl.where(row_live, rows, 0).to(tl.int64)
    nblocks = k // 8
    if ONE_STEP:
        energy, doubled, block_peak = _block_terms(codes_ptr, scales_ptr, rows64, row_live, 0, nblocks, k, BR, BB)
        l2, linf = norms_of_terms(energy, doubled, block_peak, k, wl2)
    else:
        e_max = tl.full((BR,), 0, tl.int32)
        peak = tl.full((BR,), 0.0, tl.float32)
        for b0 in range(0, nblocks, BB):
            energy, doubled, block_peak = _block_terms(codes_ptr, scales_ptr, rows64, row_live, b0, nblocks, k, BR, BB)
            e_max = tl.maximum(e_max, tl.reduce(tl.where(energy != 0, doubled, 0), 1, tl.standard._elementwise_max))
            peak = tl.maximum(peak, tl.reduce(block_peak, 1, tl.standard._elementwise_max))
        frame = tl.full((BR,), 0, tl.int64)
        for b0 in range(0, nblocks, BB):
            energy, doubled, block_peak = _block_terms(codes_ptr, scales_ptr, rows64, row_live, b0, nblocks, k, BR, BB)
            frame += _frame_sum(energy, doubled, e_max, wl2)
        l2, linf = _norm_codes(frame, e_max, peak, k, wl2)
    tl.store(l2_ptr + rows, l2.to(tl.int16), mask=row_live)
    tl.store(linf_ptr + rows, linf.to(tl.int16), mask=row_live)


def row_norms(codes: torch.Tensor, scales: torch.Tensor, wl2: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(l2, linf) bf16 per row of int8 codes (rows, k) and bf16 scales (rows, k/8)."""
    rows, k = codes.shape
    l2 = torch.empty(rows, dtype=torch.int16, device=codes.device)
    linf = torch.empty(rows, dtype=torch.int16, device=codes.device)
    per_program, blocks = block_shape(k // 8)
    _norms_kernel[(triton.cdiv(rows, per_program),)](codes.contiguous(), scales.contiguous().view(torch.int16),
                                                     l2, linf, rows, k, wl2, BR=per_program, BB=blocks,
                                                     ONE_STEP=blocks >= k // 8, num_warps=_warps(per_program * blocks),
                                                     enable_fp_fusion=False)
    return l2.view(torch.bfloat16), linf.view(torch.bfloat16)
