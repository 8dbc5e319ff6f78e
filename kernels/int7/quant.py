"""Quantisation to the INT protocol's value range: int8 codes in [−64, 64] with a float32 scale per
row (a token for activations, an output channel for weights).

Per-row symmetric: scale = max|x| / 64 (1 for an all-zero row), q = round(x / scale) clamped to
[−64, 64]. The protocol forces 7-bit values (operands in [−64, 64] so that A + E_A fits int8); a
row scale keeps one outlier token from crushing the others, and it is a per-row factor of the
output, applied in the GEMM's epilogue. Pure torch: runs per launch on the serving stream.
"""
from __future__ import annotations

import torch

INT7_LIMIT = 64


class QuantError(ValueError):
    """Bad input to the quantiser."""


def quantize_int7(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale): q int8 in [−64, 64] of x's shape, scale float32 of x.shape[:-1]; x ≈ q·scale."""
    if not x.is_floating_point():
        raise QuantError(f"quantize_int7 needs a floating-point tensor, got {x.dtype}")
    values = x.float()
    amax = values.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / INT7_LIMIT, torch.ones_like(amax))
    q = torch.round(values / scale.unsqueeze(-1)).clamp_(-INT7_LIMIT, INT7_LIMIT).to(torch.int8)
    return q, scale
