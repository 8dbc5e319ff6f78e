"""Block-scaled int8 pre-quantization and the exact row norms on the device (§4).

Same rules as proof.fp8.prequant, as torch tensor code without host syncs:
- planes: per block of 8 along k, s = bf16(max(amax, 2^-100) · f32(1/127)), q = RNE(x · (1/s))
  clamped to ±127, and the opened value RNE_bf16(q · s), in one Triton kernel (prequant_kernel.py);
- the row norms (linf and the exact integer-frame l2) in one Triton kernel (norms_kernel.py).
"""
from __future__ import annotations

import torch

from proof.fp8.prequant import BLOCK_SIZE, l2_frame_width

from . import norms_kernel, prequant_kernel



class PrequantError(ValueError):
    """Bad input to the device pre-quantization."""


def prequantize_and_open(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rows, k) activations or weights (bf16 or fp32) → int8 codes (rows, k), bf16 scales
    (rows, k/8) and the opened bf16 values RNE_bf16(q · s), in one Triton pass."""
    if x.dim() != 2 or x.shape[1] % BLOCK_SIZE or x.shape[1] == 0:
        raise PrequantError(f"x must be (rows, k) with k a positive multiple of {BLOCK_SIZE}, "
                            f"got {tuple(x.shape)}")
    return prequant_kernel.prequantize(x.to(torch.float32) if x.dtype != torch.bfloat16 else x)


def _check_planes(codes: torch.Tensor, scales: torch.Tensor) -> None:
    if codes.dtype != torch.int8 or codes.dim() != 2 or codes.shape[1] % BLOCK_SIZE:
        raise PrequantError(f"codes must be int8 (rows, k), k % 8 == 0, got {codes.dtype} {tuple(codes.shape)}")
    if scales.dtype != torch.bfloat16 or scales.shape != (codes.shape[0], codes.shape[1] // BLOCK_SIZE):
        raise PrequantError(f"scales must be bf16 (rows, k/8) for codes {tuple(codes.shape)}, "
                            f"got {scales.dtype} {tuple(scales.shape)}")


def row_norms(codes: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (l2, linf) as bf16 tensors, bit-identical to proof.fp8.prequant.row_norms
    (one Triton kernel, norms_kernel.py)."""
    _check_planes(codes, scales)
    return norms_kernel.row_norms(codes, scales, l2_frame_width(codes.shape[1]))
