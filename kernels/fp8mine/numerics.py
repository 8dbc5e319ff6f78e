"""BF16 arithmetic on torch tensors with the protocol's exact rounding (§7), for the torch-side
stages (the B peel) and the tests; the hot paths use the Triton kernels in noisy_kernel.py,
which implement the same formulation on bit patterns.

The FMA rounds the exact a·b + c once; it is emulated in f64: the bf16 product is exact in f64,
TwoSum recovers the addition error, the exact sum is rounded to odd at f32 precision, then RNE to
bf16 — round-to-odd at ≥ p + 2 bits followed by RNE at p bits is one correct rounding. The same
formulation runs on CUDA, so no `fma.rn.bf16` intrinsic is needed; tests compare it with
proof.fp8.bf16 on the edge cases. NaN payloads are not preserved (torch canonicalises them).
"""
from __future__ import annotations

import torch


def _round_to_odd_f32(hi: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """The exact f64 pair hi + lo rounded to f32 with round-to-odd (keeps a sticky last bit)."""
    nearest = hi.float()
    residual = (hi - nearest.double()) + lo
    even = (nearest.view(torch.int32) & 1) == 0
    nudge = (residual != 0) & even & torch.isfinite(nearest)
    toward = torch.where(residual > 0, torch.full_like(nearest, float("inf")),
                         torch.full_like(nearest, float("-inf")))
    return torch.where(nudge, torch.nextafter(nearest, toward), nearest)


def bf16_fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """a·b + c rounded once (RNE) to bf16, like ``fma.rn.bf16``; inputs are bf16 tensors."""
    a64, b64, c64 = a.double(), b.double(), c.double()
    product = a64 * b64  # exact: 8-bit significands, exponents far inside f64's range
    total = product + c64
    back = total - c64
    error = (product - back) + (c64 - (total - back))  # TwoSum: product + c = total + error
    error = torch.where(torch.isfinite(total), error, torch.zeros_like(error))
    return _round_to_odd_f32(total, error).to(torch.bfloat16)


def from_bits16(bits: torch.Tensor) -> torch.Tensor:
    """bf16 tensor from bit patterns in [0, 0xFFFF] (any integer dtype)."""
    return bits.to(torch.int32).to(torch.int16).view(torch.bfloat16)
