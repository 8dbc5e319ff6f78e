"""Noisy quantization (§7) as Triton kernels: the per-row scales
nb = fma(δ√r, l2f, linf_f), α = bf16(448 / nb), β = bf16(bf16(α · l2f) · δ√r/256²), and the
element op code = e4m3(clamp(fma(α, X, bf16(β · bf16(N))), ±448)).

Same arithmetic as numerics.bf16_fma (TwoSum, round-to-odd at f32, RNE to bf16), written on bit
patterns so the CPU interpreter and the GPU agree: bf16 rounding and the e4m3 encode are integer
operations, and FP fusion is disabled at launch so no multiply/add pair is contracted. The
element op runs that FMA in f32 (the product of two bf16 values is exact there unless it is a
non-zero below 2^-126 or overflows), and a tile holding such a product takes the f64 form
(_fma_bf16): bit-identical results with f32 instructions for real data, one pass over X and N.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
import triton
import triton.language as tl

from kernels.triton_jit import jit

_BLOCK = 1024  # rows per row-scales program
_NOISY_ROWS = 4  # noisy-codes tile: α, β once per row, 16-byte vector loads along k
_NOISY_COLS = 512
_DOT_ROWS = 64  # the tile when the kernel forms N itself: one m64nNk32 e4m3 WGMMA per tile
# at every size: reading the planes by blocks (`tile_values`), GLM-5 prefill's codes launch took
# 72.1 / 72.8 µs at 64 columns against 75.5 / 76.4 at 128 and 83.2 / 84.4 for 128 × 64 (H100,
# session 21; 106–112 µs for all three with a scale load per element); ridge: 27.2 vs 29.2 µs
_DOT_COLS = 64
_DOT_WARPS = 4  # one warpgroup: the 64-row tile is one m64 WGMMA


class Planes(NamedTuple):
    """Pre-quantized rows as committed: int8 codes (rows, k) and bf16 scales (rows, k/8). Given
    these in place of X, the codes launch opens X = RNE_bf16(q · s) itself (`tile_values`), so
    the rows launch need not write the opened values (2 bytes an element) for it to read back."""

    codes: torch.Tensor
    scales: torch.Tensor


@jit
def _rne_bf16(bits):
    """RNE of f32 bit patterns (int32) to bf16, returned as f32 bit patterns; NaN stays NaN."""
    u = bits.to(tl.uint32, bitcast=True)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return tl.where(nan, u | 0x00400000, rounded).to(tl.int32, bitcast=True)


@jit
def _round_to_odd_f32(hi, lo):
    """The exact f64 pair hi + lo rounded to f32 with round-to-odd, as int32 bits."""
    nearest = hi.to(tl.float32)
    residual = (hi - nearest.to(tl.float64)) + lo
    bits = nearest.to(tl.int32, bitcast=True)
    magnitude = bits & 0x7FFFFFFF
    finite = magnitude < 0x7F800000
    nudge = (residual != 0.0) & ((bits & 1) == 0) & finite
    outward = (residual > 0.0) == (bits >= 0)  # the residual points away from zero
    stepped = tl.where(outward, bits + 1, bits - 1)
    from_zero = tl.where(residual > 0.0, 1, -2147483647)  # ±smallest subnormal
    stepped = tl.where(magnitude == 0, from_zero, stepped)
    return tl.where(nudge, stepped, bits)


@jit
def _e4m3_code(bits):
    """RNE encode of f32 bit patterns to e4m3 bytes (int32 0..255), saturating: |x| > 448
    encodes as ±448, NaN as 0x7F | sign. Normal results round the f32 bits below the 3 kept
    mantissa bits (the carry runs into the exponent); below 2^-6 the grid is 2^-9 and
    RNE(|x| · 2^9) comes from the 1.5·2^23 magic constant (needs FP fusion off)."""
    sign = (bits >> 24) & 0x80
    magnitude = bits & 0x7FFFFFFF
    clamped = tl.minimum(magnitude, 0x43E00000)  # 448
    normal = ((clamped + 0x7FFFF + ((clamped >> 20) & 1)) >> 20) - (120 << 3)
    tiny = ((clamped.to(tl.float32, bitcast=True) * 512.0 + 12582912.0).to(tl.int32, bitcast=True)) & 0xF
    code = tl.where(clamped < 0x3C800000, tiny, normal)  # 2^-6
    return tl.where(magnitude > 0x7F800000, 0x7F, code) | sign


@jit
def _fma_bf16(a, b, c):
    """fma(a, b, c) rounded once to bf16 (f32 inputs holding bf16 values) → f32 bits (int32)."""
    product = a.to(tl.float64) * b.to(tl.float64)  # exact
    addend = c.to(tl.float64)
    total = product + addend
    back = total - addend
    error = (product - back) + (addend - (total - back))
    finite = (total == total) & (total - total == 0.0)
    return _rne_bf16(_round_to_odd_f32(total, tl.where(finite, error, 0.0)))


@jit
def _fma_bf16_f32(a, b, c):
    """fma(a, b, c) rounded once to bf16 → f32 bits (int32), in f32 arithmetic only: the same
    formulation as _fma_bf16 (TwoSum, round-to-odd at f32, RNE to bf16) with the product a·b
    itself in f32, so it equals _fma_bf16 wherever that product is exact in f32 — see
    _product_leaves_f32. A non-finite sum is never nudged (its residual is NaN)."""
    product = a * b
    total = product + c
    back = total - product
    error = (product - (total - back)) + (c - back)
    bits = total.to(tl.int32, bitcast=True)
    nudge = (error != 0.0) & ((bits & 1) == 0) & ((bits & 0x7FFFFFFF) < 0x7F800000)
    outward = (error > 0.0) == (bits >= 0)  # the residual points away from zero (total ≠ 0 here)
    return _rne_bf16(tl.where(nudge, tl.where(outward, bits + 1, bits - 1), bits))


@jit
def _product_leaves_f32(a, b):
    """Where the f32 product of two bf16 values is not exact: a non-zero product below 2^-126
    (f32 subnormal or underflow; 16 significant bits need a normal f32) or an overflow."""
    magnitude = tl.abs(a * b).to(tl.int32, bitcast=True)
    return ((magnitude < 0x00800000) & (a != 0.0) & (b != 0.0)) | (magnitude == 0x7F800000)


@jit
def _bf16_of_bits(ptr, offs, live):
    """Load bf16 bit patterns (int16) as f32 values."""
    return (tl.load(ptr + offs, mask=live, other=0).to(tl.int32) << 16).to(tl.float32, bitcast=True)


@jit
def _floor_norm(x):
    """max(x, 2^-32), NaN-propagating."""
    return tl.where(x != x, x, tl.where(x >= 2.3283064365386963e-10, x, 2.3283064365386963e-10))


@jit
def alpha_beta(l2, linf, delta_r, delta_over_std):
    """(α, β) as f32 bit patterns (int32) of bf16 values from the raw norms as f32 values (a 1-D
    tensor). Shared by the row-scales kernel and the fused decode row kernel (prequant_kernel)."""
    l2f = _floor_norm(l2)
    linf_f = _floor_norm(linf)
    bound = _fma_bf16(tl.full(l2.shape, 0.0, tl.float32) + delta_r, l2f, linf_f).to(tl.float32, bitcast=True)
    alpha = _rne_bf16(tl.math.div_rn(tl.full(l2.shape, 448.0, tl.float32), bound).to(tl.int32, bitcast=True))
    scaled = _rne_bf16((alpha.to(tl.float32, bitcast=True) * l2f).to(tl.int32, bitcast=True))
    return alpha, _rne_bf16((scaled.to(tl.float32, bitcast=True) * delta_over_std).to(tl.int32, bitcast=True))


@jit
def _row_scales_kernel(l2_ptr, linf_ptr, alpha_ptr, beta_ptr, rows, delta_r, delta_over_std,
                       BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = offs < rows
    alpha, beta = alpha_beta(_bf16_of_bits(l2_ptr, offs, live), _bf16_of_bits(linf_ptr, offs, live),
                             delta_r, delta_over_std)
    tl.store(alpha_ptr + offs, (alpha >> 16).to(tl.int16), mask=live)
    tl.store(beta_ptr + offs, (beta >> 16).to(tl.int16), mask=live)


@jit
def _noise_dot(e_ptr, f_ptr, r, cols, live_r, live_c):
    """N = E·Fᵀ of the tile (E (rows, 32), F (k, 32) e4m3 codes) as one K = 32 e4m3 MMA from +0,
    then the fp32 promotion into a +0 total (the Hopper model's single-group window; a −0 window
    becomes +0) — the same instructions the windowed GEMM's first window runs."""
    kk = tl.arange(0, 32)
    e = tl.load(e_ptr + r.to(tl.int64)[:, None] * 32 + kk[None, :], mask=live_r[:, None], other=0)
    f = tl.load(f_ptr + cols.to(tl.int64)[:, None] * 32 + kk[None, :], mask=live_c[:, None], other=0)
    window = tl.dot(e.to(tl.float8e4nv, bitcast=True), tl.trans(f.to(tl.float8e4nv, bitcast=True)))
    return tl.fma(window, 1.0, tl.full(window.shape, 0.0, tl.float32))  # the RNE promotion, kept apart from the dot


@jit
def _fma_rn_bf16(a, b, c):
    """a·b + c of bf16 tensors rounded once to bf16 by the device (PTX fma.rn.bf16)."""
    return tl.inline_asm_elementwise("fma.rn.bf16 $0, $1, $2, $3;", "=h,h,h,h", [a, b, c],
                                     dtype=tl.bfloat16, is_pure=True, pack=1)


@jit
def _noisy_codes_by_device(x, alpha, beta, dot):
    """`noisy_codes_tile` with the device's rounding instructions (CUDA: `_by_device`): bf16
    conversions round to nearest even, the FMA rounds once, the e4m3 encode saturates at ±448."""
    noise = dot.to(tl.bfloat16)
    scaled = (beta * noise.to(tl.float32)).to(tl.bfloat16)
    value = _fma_rn_bf16(alpha.to(tl.bfloat16), x.to(tl.bfloat16), scaled)
    return value.to(tl.float32).to(tl.float8e4nv).to(tl.uint8, bitcast=True).to(tl.int32)


@jit
def noisy_codes_tile(x, alpha, beta, dot, HW: tl.constexpr):
    """The element op on one tile: e4m3 codes (int32 0..255, clamped to ±448) of
    fma(α, X, bf16(β · bf16(N))) rounded once to bf16 (α, β per row, N the fp32 noise dot), in f32
    (_fma_bf16_f32) unless a product α·X of the tile is not exact in f32, then the whole tile in
    f64; with HW, by the device's own rounding instructions (`_noisy_codes_by_device`)."""
    if HW:
        return _noisy_codes_by_device(x, alpha, beta, dot)
    noise = _rne_bf16(dot.to(tl.int32, bitcast=True))
    scaled = _rne_bf16((beta * noise.to(tl.float32, bitcast=True)).to(tl.int32, bitcast=True)).to(tl.float32, bitcast=True)
    leaves = tl.reduce(tl.reduce(_product_leaves_f32(alpha, x).to(tl.int32), 1, tl.standard._elementwise_max),
                       0, tl.standard._elementwise_max)
    if leaves == 0:
        value = _fma_bf16_f32(alpha, x, scaled)
    else:
        value = _fma_bf16(alpha, x, scaled)
    return _e4m3_code(value)


@jit
def tile_values(x_ptr, scales_ptr, r, c0, offs, live, live_r, k, BR: tl.constexpr, BC: tl.constexpr,
                PLANES: tl.constexpr, HW: tl.constexpr):
    """X of the (BR, BC) tile whose first column is c0 as f32 values: bf16 bits at x_ptr, or
    (PLANES) opened from the int8 codes at x_ptr and the bf16 scale of each 8-block,
    RNE_bf16(q · s) (the product is exact in f32; HW: rounded by cvt.rn.bf16.f32) — the bits the
    rows launch would have stored. The planes are read as (rows, blocks, 8) so each 8-block's
    scale is one load broadcast along its block: a scale load per element kept the L1 busy (78 %
    at GLM-5 prefill, Nsight Compute, H100, session 21) while DRAM ran at 23 %."""
    if PLANES:
        blocks = c0 // 8 + tl.arange(0, BC // 8)
        live_b = live_r[:, None] & (blocks < k // 8)[None, :]
        rows = r.to(tl.int64)
        at = rows[:, None, None] * k + blocks[None, :, None] * 8 + tl.arange(0, 8)[None, None, :]
        q = tl.load(x_ptr + at, mask=live_b[:, :, None], other=0).to(tl.float32)
        s = _bf16_of_bits(scales_ptr, rows[:, None] * (k // 8) + blocks[None, :], live_b)
        if HW:
            value = (q * s[:, :, None]).to(tl.bfloat16).to(tl.float32)
        else:
            value = _rne_bf16((q * s[:, :, None]).to(tl.int32, bitcast=True)).to(tl.float32, bitcast=True)
        return tl.reshape(value, (BR, BC))
    return _bf16_of_bits(x_ptr, offs, live)


@jit
def tile_noise(x_ptr, scales_ptr, noise_ptr, e_ptr, f_ptr, r, c0, cols, offs, live_r, live, k,
               BR: tl.constexpr, BC: tl.constexpr, DOT: tl.constexpr, PLANES: tl.constexpr, HW: tl.constexpr):
    """(X, N) of one tile: X (`tile_values`) and the noise dot, read from noise_ptr or (DOT)
    formed from the E and F lines."""
    x = tile_values(x_ptr, scales_ptr, r, c0, offs, live, live_r, k, BR, BC, PLANES, HW)
    if DOT:
        dot = _noise_dot(e_ptr, f_ptr, r, cols, live_r, cols < k)
    else:
        dot = tl.load(noise_ptr + offs, mask=live, other=0.0)
    return x, dot


@jit
def store_codes(out_ptr, positions_ptr, codes, r, cols, live_r, live, stride, TOP_K: tl.constexpr):
    """TOP_K = 0: the tile at its own rows; TOP_K > 0: row r at out rows positions[r·TOP_K + j],
    j < TOP_K (the expert-order rows it is routed to). stride: out's row stride (k, or k plus a
    peel tail: `scattered_out`)."""
    if TOP_K == 0:
        tl.store(out_ptr + r.to(tl.int64)[:, None] * stride + cols[None, :], codes, mask=live)
    else:
        for j in tl.static_range(TOP_K):
            dest = tl.load(positions_ptr + r.to(tl.int64) * TOP_K + j, mask=live_r, other=0).to(tl.int64)
            tl.store(out_ptr + dest[:, None] * stride + cols[None, :], codes, mask=live)


@jit
def _noisy_kernel(x_ptr, scales_ptr, noise_ptr, e_ptr, f_ptr, alpha_ptr, beta_ptr, out_ptr, positions_ptr, rows, k,
                  stride, BR: tl.constexpr, BC: tl.constexpr, DOT: tl.constexpr, TOP_K: tl.constexpr,
                  PLANES: tl.constexpr, HW: tl.constexpr):
    """BR rows × BC columns: α, β loaded once per row; X read as values or (PLANES) opened from
    the planes; N read from noise_ptr, or with DOT formed here from the E and F lines (no N in
    memory, no GEMM launch before this one); the element op `noisy_codes_tile` (HW: by the device's
    rounding instructions); the codes stored by `store_codes`."""
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    c0 = tl.program_id(1) * BC
    cols = c0 + tl.arange(0, BC)
    live_r = r < rows
    live = live_r[:, None] & (cols < k)[None, :]
    offs = r.to(tl.int64)[:, None] * k + cols[None, :]
    x, dot = tile_noise(x_ptr, scales_ptr, noise_ptr, e_ptr, f_ptr, r, c0, cols, offs, live_r, live, k, BR, BC, DOT,
                        PLANES, HW)
    alpha = _bf16_of_bits(alpha_ptr, r, live_r)[:, None]
    beta = _bf16_of_bits(beta_ptr, r, live_r)[:, None]
    codes = noisy_codes_tile(x, alpha, beta, dot, HW).to(tl.uint8)
    store_codes(out_ptr, positions_ptr, codes, r, cols, live_r, live, stride, TOP_K)


def _x_arguments(x: torch.Tensor | Planes) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """(x pointer, scales pointer, PLANES) of bf16 values (rows, k) or of `Planes`."""
    if isinstance(x, Planes):
        codes, scales = x
        rows, k = codes.shape
        if codes.dtype != torch.int8 or scales.dtype != torch.bfloat16 or scales.shape != (rows, k // 8) or k % 8:
            raise ValueError(f"planes must be int8 codes (rows, k) and bf16 scales (rows, k/8), got "
                             f"{codes.dtype} {tuple(codes.shape)} and {scales.dtype} {tuple(scales.shape)}")
        return codes.contiguous(), scales.contiguous().view(torch.int16), True
    x16 = x.contiguous().view(torch.int16)
    return x16, x16, False


def _by_device(x: torch.Tensor) -> bool:
    """Whether this launch rounds with the device's own instructions: cvt.rn.bf16.f32 for bf16(N)
    and bf16(β·N), fma.rn.bf16 for the one-rounding FMA, cvt.rn.satfinite.e4m3x2.f32 for the
    saturating encode — on CUDA, where the emulation (~65 integer and TwoSum operations an
    element) bound the launch (GLM-5 prefill codes into expert order 217.6 vs 302.4 µs; H100,
    session 20). The same codes for every input but NaN (0x7F either way up to its sign; planes
    are finite). The CPU interpreter cannot run inline PTX and keeps the emulation."""
    return x.is_cuda


def scattered_out(x: torch.Tensor, positions: torch.Tensor | None,
                  tail: int = 0) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(codes buffer, positions argument, TOP_K) for x's rows stored as themselves (positions None)
    or at their expert-order rows (positions (rows·top_k,) int32: `RoutingTable.positions`).
    tail: bytes left after each row's k codes (the peel GEMM's operand rows carry their peel row
    there: `peel.padded_rows`); the buffer is then (out rows, k + tail) and the codes its first k
    columns."""
    rows, k = x.shape
    if positions is None:
        return torch.empty((rows, k + tail), dtype=torch.uint8, device=x.device), x, 0
    if positions.dtype != torch.int32 or positions.dim() != 1 or rows == 0 or positions.shape[0] % rows:
        raise ValueError(f"positions must be int32 (rows·top_k,) for {rows} rows, "
                         f"got {positions.dtype} {tuple(positions.shape)}")
    total = positions.shape[0]
    return torch.empty((total, k + tail), dtype=torch.uint8, device=x.device), positions.contiguous(), total // rows


def noisy_codes(alpha: torch.Tensor, beta: torch.Tensor, x: torch.Tensor | Planes, noise: torch.Tensor,
                positions: torch.Tensor | None = None, tail: int = 0) -> torch.Tensor:
    """e4m3 codes (rows, k) from bf16 α, β (rows,), X (bf16 (rows, k), or the `Planes` it opens
    from) and the fp32 noise dot; with positions (rows·top_k,), (rows·top_k, k) codes with row r
    at rows positions[r·top_k + j]; tail: rows `tail` bytes apart beyond k (`scattered_out`)."""
    x_ptr, scales_ptr, planes = _x_arguments(x)
    rows, k = x_ptr.shape
    out, where, top_k = scattered_out(x_ptr, positions, tail)
    grid = (triton.cdiv(rows, _NOISY_ROWS), triton.cdiv(k, _NOISY_COLS))
    _noisy_kernel[grid](x_ptr, scales_ptr, noise.contiguous(), x_ptr, x_ptr, alpha.contiguous().view(torch.int16),
                        beta.contiguous().view(torch.int16), out, where, rows, k, k + tail, BR=_NOISY_ROWS,
                        BC=_NOISY_COLS, DOT=False, TOP_K=top_k, PLANES=planes, HW=_by_device(x_ptr),
                        enable_fp_fusion=False)
    return out[:, :k].view(torch.float8_e4m3fn)


def noisy_codes_of_lines(alpha: torch.Tensor, beta: torch.Tensor, x: torch.Tensor | Planes, e_lines: torch.Tensor,
                         f_lines: torch.Tensor, positions: torch.Tensor | None = None, tail: int = 0) -> torch.Tensor:
    """`noisy_codes` with N = E·Fᵀ formed inside the launch from the e4m3 lines E (rows, 32) and
    F (k, 32) — the A side, whose N nothing else reads. The tensor-core dot is the device's own
    FP8 atom, so this is CUDA-only: the caller passes the model's N to `noisy_codes` elsewhere."""
    x_ptr, scales_ptr, planes = _x_arguments(x)
    rows, k = x_ptr.shape
    out, where, top_k = scattered_out(x_ptr, positions, tail)
    grid = (triton.cdiv(rows, _DOT_ROWS), triton.cdiv(k, _DOT_COLS))
    _noisy_kernel[grid](x_ptr, scales_ptr, x_ptr, e_lines.contiguous().view(torch.uint8),
                        f_lines.contiguous().view(torch.uint8), alpha.contiguous().view(torch.int16),
                        beta.contiguous().view(torch.int16), out, where, rows, k, k + tail, BR=_DOT_ROWS,
                        BC=_DOT_COLS, DOT=True, TOP_K=top_k, PLANES=planes, HW=_by_device(x_ptr),
                        enable_fp_fusion=False, num_warps=_DOT_WARPS)
    return out[:, :k].view(torch.float8_e4m3fn)


def bf16_value(bits: int) -> float:
    """The exact value of a bf16 bit pattern (a Python float holds it exactly)."""
    return float(np.array([bits << 16], dtype=np.uint32).view(np.float32)[0])


def row_scales(l2: torch.Tensor, linf: torch.Tensor, delta_r: int,
               delta_over_std: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(α, β) bf16 per row from the raw bf16 norms and the device's bf16 scale constants."""
    rows = l2.shape[0]
    alpha = torch.empty(rows, dtype=torch.int16, device=l2.device)
    beta = torch.empty(rows, dtype=torch.int16, device=l2.device)
    _row_scales_kernel[(max(1, triton.cdiv(rows, _BLOCK)),)](
        l2.contiguous().view(torch.int16), linf.contiguous().view(torch.int16), alpha, beta, rows,
        bf16_value(delta_r), bf16_value(delta_over_std), BLOCK=_BLOCK, enable_fp_fusion=False)
    return alpha.view(torch.bfloat16), beta.view(torch.bfloat16)
