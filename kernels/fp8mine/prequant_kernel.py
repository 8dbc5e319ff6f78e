"""Pre-quantization (§4) as one Triton pass: per block of 8 along k,
s = bf16(max(amax, 2^-100) · f32(1/127)), q = RNE(x · rcp_rn(s)) clamped to ±127, and the opened
value RNE_bf16(q · s). Rounding to an integer uses the 1.5·2^23 magic constant (|x · rcp| ≤ 128,
far inside its exact range) with FP fusion disabled; bf16 rounding is integer arithmetic.

`prequantize_rows` (activations, k ≤ 8192) also computes the row norms and (α, β) in the same
pass: one launch instead of three, the norms read the planes from registers. It writes no opened
values: the codes launch opens X from the planes itself (`noisy_kernel.Planes`; 2 bytes an element
less written and read: GLM-5 prefill rows 114.4 vs 138.2 µs; H100, session 20).
"""
from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from kernels.triton_jit import jit

from .noisy_kernel import _rne_bf16, alpha_beta
from .norms_kernel import block_terms_of, norms_of_terms

_RECIP_127 = float(np.float32(1) / np.float32(127))
_MAGIC = 12582912.0  # 1.5 · 2^23
_ROWS = 8  # 8 rows × 64 scale blocks = 4096 values a program, 16 a thread (8 warps): 47 registers,
_BLOCKS = 64  # so an SM holds 5 programs; 16 rows on 4 warps took 142 registers (3 programs an SM)
_WARPS = 8


@jit
def _prequant_kernel(x_ptr, codes_ptr, scales_ptr, values_ptr, num_rows, k, recip_127, magic,
                     X_BF16: tl.constexpr, BR: tl.constexpr, BB: tl.constexpr):
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    blocks = tl.program_id(1) * BB + tl.arange(0, BB)
    nblocks = k // 8
    live = (rows < num_rows)[:, None] & (blocks < nblocks)[None, :]
    offs = rows.to(tl.int64)[:, None, None] * k + blocks[None, :, None] * 8 + tl.arange(0, 8)[None, None, :]
    if X_BF16:
        bits = tl.load(x_ptr + offs, mask=live[:, :, None], other=0).to(tl.int32) << 16
        x = bits.to(tl.float32, bitcast=True)
    else:
        x = tl.load(x_ptr + offs, mask=live[:, :, None], other=0.0)
    q, scale_bits, value = _quantize_blocks(x, recip_127, magic)
    tl.store(codes_ptr + offs, q.to(tl.int8), mask=live[:, :, None])
    tl.store(values_ptr + offs, value.to(tl.int16), mask=live[:, :, None])
    scale_offs = rows.to(tl.int64)[:, None] * nblocks + blocks[None, :]
    tl.store(scales_ptr + scale_offs, scale_bits.to(tl.int16), mask=live)


@jit
def _quantize_blocks(x, recip_127, magic):
    """Blocks x (rows, blocks, 8) f32 → codes q (f32 integers), bf16 scale bits (rows, blocks)
    int32 and the opened values' bf16 bits (rows, blocks, 8) int32."""
    # tl.max's own combine (tl.maximum, as before): the interpreter then reduces with numpy
    amax = tl.maximum(tl.reduce(tl.abs(x), 2, tl.standard._elementwise_max), 7.888609052210118e-31)  # 2^-100
    scale = _rne_bf16((amax * recip_127).to(tl.int32, bitcast=True)).to(tl.float32, bitcast=True)
    reciprocal = tl.math.div_rn(tl.full(scale.shape, 1.0, tl.float32), scale)
    q = (x * reciprocal[:, :, None] + magic) - magic  # RNE to an integer
    q = tl.minimum(tl.maximum(q, -127.0), 127.0)
    value = _rne_bf16((q * scale[:, :, None]).to(tl.int32, bitcast=True)) >> 16
    return q, scale.to(tl.int32, bitcast=True) >> 16, value


@jit
def _step_bits(x_ptr, at, num_rows, k, b0, BB: tl.constexpr):
    """Scale blocks b0 .. b0 + BB of bf16 row `at` (a (1,) tensor) as f32 bit patterns (1, BB, 8);
    zero past the row's blocks and past num_rows."""
    blocks = b0 + tl.arange(0, BB)
    live = (blocks < k // 8)[None, :] & (at < num_rows)[:, None]
    offs = at.to(tl.int64)[:, None, None] * k + blocks[None, :, None] * 8 + tl.arange(0, 8)[None, None, :]
    return tl.load(x_ptr + offs, mask=live[:, :, None], other=0).to(tl.int32) << 16


@jit
def _rows_kernel(x_ptr, codes_ptr, scales_ptr, l2_ptr, linf_ptr, alpha_ptr, beta_ptr,
                 num_rows, k, wl2, recip_127, magic, delta_r, delta_over_std,
                 BB: tl.constexpr, STEPS: tl.constexpr, SP: tl.constexpr):
    """Whole bf16 rows → planes, norms and (α, β), one row per step of a program, each row in STEPS
    steps of BB scale blocks. A step's codes and scales are stored and its block terms kept in an
    (SP, BB) tile (SP = STEPS rounded up to a power of two), so the norms read the planes from
    registers, not memory, while a thread holds only two steps of x: the one it quantizes and the
    next one (of this row or the program's next row), loaded before its work so their latency
    overlaps it. Holding the whole padded row and the next one took 186 registers a thread, two
    programs an SM (12 % occupancy; Nsight Compute, H100, session 21)."""
    nblocks = k // 8
    first = tl.full((1,), 0, tl.int32)
    step = tl.num_programs(0)
    steps = tl.arange(0, SP)[:, None]
    ahead = _step_bits(x_ptr, first + tl.program_id(0), num_rows, k, 0, BB)
    for row in range(tl.program_id(0), num_rows, step):
        at = first + row
        energy_all = tl.full((SP, BB), 0, tl.int64)
        doubled_all = tl.full((SP, BB), 0, tl.int32)
        peak_all = tl.full((SP, BB), 0.0, tl.float32)
        for s in tl.static_range(STEPS):
            bits = ahead
            if s + 1 < STEPS:
                ahead = _step_bits(x_ptr, at, num_rows, k, (s + 1) * BB, BB)
            else:
                ahead = _step_bits(x_ptr, at + step, num_rows, k, 0, BB)
            blocks = s * BB + tl.arange(0, BB)
            live = (blocks < nblocks)[None, :]
            q, scale_bits, _ = _quantize_blocks(bits.to(tl.float32, bitcast=True), recip_127, magic)
            offs = at.to(tl.int64)[:, None, None] * k + blocks[None, :, None] * 8 + tl.arange(0, 8)[None, None, :]
            tl.store(codes_ptr + offs, q.to(tl.int8), mask=live[:, :, None])
            tl.store(scales_ptr + at.to(tl.int64)[:, None] * nblocks + blocks[None, :], scale_bits.to(tl.int16), mask=live)
            energy, doubled, peak = block_terms_of(q.to(tl.int32), tl.where(live, scale_bits, 0))
            energy_all = tl.where(steps == s, energy, energy_all)
            doubled_all = tl.where(steps == s, doubled, doubled_all)
            peak_all = tl.where(steps == s, peak, peak_all)
        l2, linf = norms_of_terms(tl.reshape(energy_all, (1, SP * BB)), tl.reshape(doubled_all, (1, SP * BB)),
                                  tl.reshape(peak_all, (1, SP * BB)), k, wl2)
        alpha, beta = alpha_beta((l2 << 16).to(tl.float32, bitcast=True), (linf << 16).to(tl.float32, bitcast=True),
                                 delta_r, delta_over_std)
        tl.store(l2_ptr + at, l2.to(tl.int16))
        tl.store(linf_ptr + at, linf.to(tl.int16))
        tl.store(alpha_ptr + at, (alpha >> 16).to(tl.int16))
        tl.store(beta_ptr + at, (beta >> 16).to(tl.int16))


def prequantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (rows, k) bf16 or fp32 → (int8 codes, bf16 scales (rows, k/8), bf16 opened values)."""
    rows, k = x.shape
    codes = torch.empty((rows, k), dtype=torch.int8, device=x.device)
    values = torch.empty((rows, k), dtype=torch.int16, device=x.device)
    scales = torch.empty((rows, k // 8), dtype=torch.int16, device=x.device)
    is_bf16 = x.dtype == torch.bfloat16
    source = x.contiguous().view(torch.int16) if is_bf16 else x.contiguous()
    grid = (triton.cdiv(rows, _ROWS), triton.cdiv(k // 8, _BLOCKS))
    _prequant_kernel[grid](source, codes, scales, values, rows, k, _RECIP_127, _MAGIC,
                           X_BF16=is_bf16, BR=_ROWS, BB=_BLOCKS, num_warps=_WARPS,
                           enable_fp_fusion=False)
    return codes, scales.view(torch.bfloat16), values.view(torch.bfloat16)


MAX_ROW_BLOCKS = 1024  # the fused row kernel takes rows of k ≤ 8192 (longer ones: three launches)
ROW_STEP_BLOCKS = 256  # scale blocks a step of the fused row kernel (2048 values)
_ROW_PROGRAMS = 32  # decode (≤ 64 rows): one wave beside the lagged GEMM
# Beyond decode a program walks this many rows. 32 programs for any row count (the first form)
# walked 256 rows each at prefill (8192 rows): the A side took 1500 µs on the H200 where its
# stages took 585, so the program count now grows with the rows.
ROWS_PER_PROGRAM = 2
# 8 warps at decode: a program fits in the 32K registers the shared-SM lagged GEMM leaves an SM
# (the whole-row kernel before took ~100 at 8 warps; 16 warps x 88 did not fit, and waited for the
# GEMM's end: 285.6 vs 238.6 us a pass on the H200). Stepped: 5.5 µs at GLM-5 decode (64 rows)
# against 5.9 for the whole-row kernel (H100, session 21)
_ROW_WARPS = 8
# Beyond decode nothing runs beside it: steps of 256 blocks on 4 warps, 2 rows a program, took
# 82.2 / 82.3 µs at GLM-5 prefill against 109.7 / 110.2 for the whole-row kernel at its best
# shape (8 rows, 4 warps); 128-block steps 90.6, 8 warps 84.1, 8 rows 83.1 (H100, session 21,
# same run; every output bitwise equal)
_PREFILL_ROW_WARPS = 4


def row_programs(rows: int) -> int:
    """Programs of the fused row kernel: ≤ 32 at decode (≤ 64 rows: 2 a program at most), else
    one per ROWS_PER_PROGRAM rows."""
    if rows <= 2 * _ROW_PROGRAMS:
        return max(1, min(rows, _ROW_PROGRAMS))
    return triton.cdiv(rows, ROWS_PER_PROGRAM)


def row_warps(rows: int) -> int:
    """Warps of a fused row program: decode's (`_ROW_WARPS`, beside the lagged GEMM) up to 64 rows."""
    return _ROW_WARPS if rows <= 2 * _ROW_PROGRAMS else _PREFILL_ROW_WARPS


def prequantize_rows(x: torch.Tensor, wl2: int, delta_r: float, delta_over_std: float) -> tuple[torch.Tensor, ...]:
    """bf16 x (rows, k ≤ 8192) → (codes, scales, l2, linf, α, β) in one launch (`row_programs`;
    each program walks its rows). wl2: the l2 frame width of k; delta_r, delta_over_std: the
    device's scale constants as floats."""
    rows, k = x.shape
    steps = triton.cdiv(k // 8, ROW_STEP_BLOCKS)
    device = x.device
    codes = torch.empty((rows, k), dtype=torch.int8, device=device)
    scales = torch.empty((rows, k // 8), dtype=torch.int16, device=device)
    per_row = torch.empty((4, rows), dtype=torch.int16, device=device)  # l2, linf, α, β
    _rows_kernel[(row_programs(rows),)](
        x.contiguous().view(torch.int16), codes, scales, per_row[0], per_row[1], per_row[2], per_row[3],
        rows, k, wl2, _RECIP_127, _MAGIC, delta_r, delta_over_std, BB=ROW_STEP_BLOCKS, STEPS=steps,
        SP=triton.next_power_of_2(steps), num_warps=row_warps(rows), enable_fp_fusion=False)
    l2, linf, alpha, beta = per_row.view(torch.bfloat16)
    return codes, scales.view(torch.bfloat16), l2, linf, alpha, beta
