"""Torch references for the kernels' ops: slow, literal, and run in a wider type than the kernel.

The grouped GEMM reference loops over experts on whatever device the inputs live on (reading the
offsets to the host is fine here) and accumulates in float64, so it bounds the kernel's error
rather than sharing it; int8 is exact in float64 for any K below 2^38 / 127^2.
"""
from __future__ import annotations

import torch


def grouped_gemm_reference(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor,
                           x_scale: torch.Tensor | None = None,
                           w_scale: torch.Tensor | None = None) -> torch.Tensor:
    """out[rows of e] = (x[rows] @ w[e]^T) * x_scale[rows, None] * w_scale[e] in float64.

    Returns float64 for bf16/fp8 inputs and int32 for int8 inputs (the kernel's exact output).
    """
    bounds = [int(v) for v in offsets.cpu().tolist()]
    if len(bounds) != w.shape[0] + 1:
        raise ValueError(f"offsets has {len(bounds)} entries for {w.shape[0]} experts")
    xd, wd = x.to(torch.float64), w.to(torch.float64)
    out = torch.zeros((x.shape[0], w.shape[1]), dtype=torch.float64, device=x.device)
    for e, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
        if hi < lo:
            raise ValueError(f"offsets decrease at expert {e}: {lo} > {hi}")
        if hi > lo:
            out[lo:hi] = xd[lo:hi] @ wd[e].T
            if w_scale is not None:
                out[lo:hi] *= w_scale[e].to(torch.float64)
    if x_scale is not None:
        out *= x_scale.to(torch.float64)[:, None]
    return out.to(torch.int32) if x.dtype == torch.int8 else out
