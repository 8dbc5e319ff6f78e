"""Noisy quantization to e4m3 on the device (§7), Hopper constants.

Both the per-row scales and the element op are Triton kernels (noisy_kernel.py). Per row:
l2f = max(l2, 2^-32), linf_f = max(linf, 2^-32) (NaN-propagating), nb = fma(δ√r, l2f, linf_f),
α = bf16(448 / nb), β = bf16(bf16(α · l2f) · δ√r/256²). Per element:
code = e4m3(clamp(fma(α, X, bf16(β · N)), ±448)), with N = bf16 of the E@F noise dot computed by
the mined GEMM itself (k = 32: one window of one group from +0, as the device's atom).
proof.fp8.quantization is the reference.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from proof.fp8.quantization import scale_constants

from . import noisy_kernel
from .matmul import matmul
from .noisy_kernel import noisy_codes

DELTA_R, DELTA_OVER_STD = scale_constants("hopper")


class QuantError(ValueError):
    """Bad input to the device noisy quantization."""


@dataclass
class NoisySide:
    """One operand after noisy quantization: codes (rows, k) e4m3, α/β (rows,) bf16 and the E
    lines (rows, 32) (the peel needs them)."""

    codes: torch.Tensor
    alpha: torch.Tensor
    beta: torch.Tensor
    e_lines: torch.Tensor


def row_scales(l2: torch.Tensor, linf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(α, β) bf16 per row from the raw bf16 norms (Hopper constants)."""
    return noisy_kernel.row_scales(l2, linf, DELTA_R, DELTA_OVER_STD)


def noisy_quantize(x: torch.Tensor, l2: torch.Tensor, linf: torch.Tensor, e_lines: torch.Tensor,
                   f_lines: torch.Tensor) -> tuple[NoisySide, torch.Tensor]:
    """A whole operand: x (rows, k) bf16, norms (rows,), E (rows, 32) and F (k, 32) e4m3 lines.

    Returns the noisy side and the fp32 noise dot N = E@Fᵀ (rows, k); only the B peel needs N,
    so callers drop it afterwards."""
    rows, k = x.shape
    if x.dtype != torch.bfloat16 or e_lines.shape != (rows, 32) or f_lines.shape != (k, 32):
        raise QuantError(f"need x bf16 (rows, k), e_lines (rows, 32), f_lines (k, 32); got "
                         f"{x.dtype} {tuple(x.shape)}, {tuple(e_lines.shape)}, {tuple(f_lines.shape)}")
    noise = matmul(e_lines, f_lines)
    alpha, beta = row_scales(l2, linf)
    return NoisySide(noisy_codes(alpha, beta, x, noise), alpha, beta, e_lines), noise
