"""The noisy-quantization element op as one Triton kernel (§7):
code = e4m3(clamp(fma(α, X, bf16(β · bf16(N))), ±448)) per element, α/β per row.

Same arithmetic as numerics.bf16_fma (f64 product, TwoSum, round-to-odd at f32, RNE to bf16),
written on bit patterns so the CPU interpreter and the GPU agree: bf16 rounding and the e4m3
encode are integer operations, and FP fusion is disabled at launch so no multiply/add pair is
contracted. One pass over X and N instead of a chain of f64 tensor passes.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.int7._jit import jit

_BLOCK = 1024


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
    """RNE encode of f32 bit patterns with |x| ≤ 448 (or NaN) to e4m3 bytes (int32 0..255)."""
    sign = (bits >> 24) & 0x80
    magnitude = bits & 0x7FFFFFFF
    exponent = (magnitude >> 23) - 127
    significand = (magnitude & 0x7FFFFF) | 0x800000
    shift = tl.minimum(20 + tl.maximum(-6 - exponent, 0), 31)
    kept = significand >> shift
    rest = significand - (kept << shift)
    half = 1 << (shift - 1)
    kept += ((rest > half) | ((rest == half) & ((kept & 1) == 1))).to(tl.int32)
    code = tl.where(exponent >= -6, ((exponent + 7) << 3) + kept - 8, kept)
    code = tl.where(magnitude < 0x00800000, 0, code)  # zero and f32 subnormals
    code = tl.where(magnitude > 0x7F800000, 0x7F, code)  # NaN
    return code | sign


@jit
def _noisy_kernel(x_ptr, noise_ptr, alpha_ptr, beta_ptr, out_ptr, total, k, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = offs < total
    row = offs // k
    x = (tl.load(x_ptr + offs, mask=live, other=0).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    alpha = (tl.load(alpha_ptr + row, mask=live, other=0).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    beta = (tl.load(beta_ptr + row, mask=live, other=0).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    noise = _rne_bf16(tl.load(noise_ptr + offs, mask=live, other=0.0).to(tl.int32, bitcast=True))
    scaled = _rne_bf16((beta * noise.to(tl.float32, bitcast=True)).to(tl.int32, bitcast=True))
    addend = scaled.to(tl.float32, bitcast=True).to(tl.float64)
    product = alpha.to(tl.float64) * x.to(tl.float64)  # exact
    total_ = product + addend
    back = total_ - addend
    error = (product - back) + (addend - (total_ - back))
    finite = (total_ == total_) & (total_ - total_ == 0.0)
    error = tl.where(finite, error, 0.0)
    value = _rne_bf16(_round_to_odd_f32(total_, error)).to(tl.float32, bitcast=True)
    value = tl.where(value > 448.0, 448.0, tl.where(value < -448.0, -448.0, value))
    tl.store(out_ptr + offs, _e4m3_code(value.to(tl.int32, bitcast=True)).to(tl.uint8), mask=live)


def noisy_codes(alpha: torch.Tensor, beta: torch.Tensor, x: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """e4m3 codes (rows, k) from bf16 α, β (rows,), bf16 X (rows, k) and the fp32 noise dot."""
    rows, k = x.shape
    out = torch.empty((rows, k), dtype=torch.uint8, device=x.device)
    total = rows * k
    _noisy_kernel[(triton.cdiv(total, _BLOCK),)](
        x.contiguous().view(torch.int16), noise.contiguous(), alpha.contiguous().view(torch.int16),
        beta.contiguous().view(torch.int16), out, total, k, BLOCK=_BLOCK, enable_fp_fusion=False)
    return out.view(torch.float8_e4m3fn)
