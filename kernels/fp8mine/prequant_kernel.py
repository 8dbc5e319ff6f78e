"""Pre-quantization (§4) as one Triton pass: per block of 8 along k,
s = bf16(max(amax, 2^-100) · f32(1/127)), q = RNE(x · rcp_rn(s)) clamped to ±127, and the opened
value RNE_bf16(q · s). Rounding to an integer uses the 1.5·2^23 magic constant (|x · rcp| ≤ 128,
far inside its exact range) with FP fusion disabled; bf16 rounding is integer arithmetic.
"""
from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from kernels.int7._jit import jit

from .noisy_kernel import _rne_bf16

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
    # tl.max's own combine (tl.maximum, as before): the interpreter then reduces with numpy
    amax = tl.maximum(tl.reduce(tl.abs(x), 2, tl.standard._elementwise_max), 7.888609052210118e-31)  # 2^-100
    scale = _rne_bf16((amax * recip_127).to(tl.int32, bitcast=True)).to(tl.float32, bitcast=True)
    reciprocal = tl.math.div_rn(tl.full(scale.shape, 1.0, tl.float32), scale)
    q = (x * reciprocal[:, :, None] + magic) - magic  # RNE to an integer
    q = tl.minimum(tl.maximum(q, -127.0), 127.0)
    value = _rne_bf16((q * scale[:, :, None]).to(tl.int32, bitcast=True)) >> 16
    tl.store(codes_ptr + offs, q.to(tl.int8), mask=live[:, :, None])
    tl.store(values_ptr + offs, value.to(tl.int16), mask=live[:, :, None])
    scale_offs = rows.to(tl.int64)[:, None] * nblocks + blocks[None, :]
    tl.store(scales_ptr + scale_offs, (scale.to(tl.int32, bitcast=True) >> 16).to(tl.int16), mask=live)


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
