"""Peel and unscale (§10; approximate, not consensus): the useful BF16 output from the mined
pre-peel accumulator.

A peel (rows, 2r) = [β_A ⊙ E_A | A′ · F_Bᵀ]; B peel (n, 2r) = [(β_B ⊙ N_B − B′) · F_Aᵀ | −β_B ⊙ E_B]
(the first block one bf16 FMA per element, as the reference); C″ = acc + A_peel · B_peelᵀ =
(A′ − β_A N_A)(B′ − β_B N_B)ᵀ; out = C″ / (α_A α_B) in BF16.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.int7._jit import jit

from .numerics import bf16_fma
from .quant import NoisySide
from .routing import RoutingTable

ROW_CHUNK = 2048  # rows per pass of the torch FMA emulation (bounds its f64 temporaries)
_UNSCALE_ROWS = 16
_UNSCALE_COLS = 128


def _decoded(codes: torch.Tensor) -> torch.Tensor:
    """e4m3 codes → bf16 values (exact)."""
    return codes.float().to(torch.bfloat16)


def a_peel(side: NoisySide, f_b: torch.Tensor) -> torch.Tensor:
    """(rows, 64) bf16: [β_A ⊙ E_A | A′ · F_Bᵀ]."""
    left = (side.beta.float()[:, None] * side.e_lines.float()).to(torch.bfloat16)
    right = _decoded(side.codes) @ _decoded(f_b)
    return torch.cat([left, right], dim=1)


def b_peel(side: NoisySide, noise: torch.Tensor, f_a: torch.Tensor) -> torch.Tensor:
    """(n, 64) bf16: [(β_B ⊙ N_B − B′) · F_Aᵀ | −β_B ⊙ E_B], N_B the fp32 noise dot (n, k)."""
    left = torch.empty((side.codes.shape[0], f_a.shape[1]), dtype=torch.bfloat16, device=f_a.device)
    for r0 in range(0, side.codes.shape[0], ROW_CHUNK):
        rows = slice(r0, r0 + ROW_CHUNK)
        noise_rows = noise[rows].to(torch.bfloat16)
        residual = bf16_fma(side.beta[rows, None].expand_as(noise_rows), noise_rows, -_decoded(side.codes[rows]))
        left[rows] = residual @ _decoded(f_a)
    right = (-side.beta.float()[:, None] * side.e_lines.float()).to(torch.bfloat16)
    return torch.cat([left, right], dim=1)


def row_experts(table: RoutingTable) -> torch.Tensor:
    """The expert of every row in expert order, (rows,) int64."""
    positions = torch.arange(table.rflat.shape[0], device=table.offsets.device)
    return torch.searchsorted(table.offsets.to(torch.int64), positions, right=True)


@jit
def _unscale_kernel(acc_ptr, corr_ptr, alpha_a_ptr, alpha_b_ptr, expert_ptr, out_ptr, rows, n,
                    BR: tl.constexpr, BN: tl.constexpr):
    """out = (acc + corr) · (1/α_A[row]) · (1/α_B[expert(row), col]) → bf16, one pass."""
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    c = tl.program_id(1) * BN + tl.arange(0, BN)
    live = (r < rows)[:, None] & (c < n)[None, :]
    cell = r.to(tl.int64)[:, None] * n + c[None, :]
    acc = tl.load(acc_ptr + cell, mask=live, other=0.0)
    corr = tl.load(corr_ptr + cell, mask=live, other=0.0).to(tl.float32)
    expert = tl.load(expert_ptr + r, mask=r < rows, other=0)
    inv_a = 1.0 / tl.load(alpha_a_ptr + r, mask=r < rows, other=1.0).to(tl.float32)
    inv_b = 1.0 / tl.load(alpha_b_ptr + expert[:, None] * n + c[None, :], mask=live, other=1.0).to(tl.float32)
    tl.store(out_ptr + cell, ((acc + corr) * inv_a[:, None] * inv_b).to(tl.bfloat16), mask=live)


def peel_and_unscale(acc: torch.Tensor, a_peel_rows: torch.Tensor, alpha_a_rows: torch.Tensor,
                     b_peel_: torch.Tensor, alpha_b: torch.Tensor, table: RoutingTable) -> torch.Tensor:
    """out[i, j] = (acc[i, j] + A_peel[i] · B_peel[w, j]) / (α_A[i] α_B[w, j]) as BF16.

    acc (rows, n_e) fp32 and the A rows in expert order; b_peel_ (e, n_e, 64), alpha_b (e, n_e).
    The correction is one grouped bf16 GEMM (torch._grouped_mm on CUDA; a per-expert loop on the
    CPU or where torch lacks it); the
    add and unscale are one Triton pass (approximate arithmetic: the output is not consensus).
    """
    correction = None
    if acc.device.type == "cuda":
        try:
            correction = torch._grouped_mm(a_peel_rows, b_peel_.transpose(-2, -1), offs=table.offsets)
        except (RuntimeError, AttributeError):  # no grouped bf16 GEMM in this torch build
            correction = None
    if correction is None:  # a per-expert loop: reads the offsets on the host (not graph-safe)
        correction = torch.empty_like(acc)
        start = 0
        for expert, end in enumerate(table.offsets.tolist()):
            correction[start:end] = a_peel_rows[start:end].float() @ b_peel_[expert].float().T
            start = end
    rows, n = acc.shape
    out = torch.empty((rows, n), dtype=torch.bfloat16, device=acc.device)
    grid = (triton.cdiv(rows, _UNSCALE_ROWS), triton.cdiv(n, _UNSCALE_COLS))
    _unscale_kernel[grid](acc.contiguous(), correction.contiguous(), alpha_a_rows.contiguous(),
                          alpha_b.contiguous(), row_experts(table).to(torch.int32), out, rows, n,
                          BR=_UNSCALE_ROWS, BN=_UNSCALE_COLS)
    return out
