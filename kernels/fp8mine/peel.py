"""Peel and unscale (§10; approximate, not consensus): the useful BF16 output from the mined
pre-peel accumulator.

A peel (rows, 2r) = [β_A ⊙ E_A | A′ · F_Bᵀ]; B peel (n, 2r) = [(β_B ⊙ N_B − B′) · F_Aᵀ | −β_B ⊙ E_B]
(the first block one bf16 FMA per element, as the reference); C″ = acc + A_peel · B_peelᵀ =
(A′ − β_A N_A)(B′ − β_B N_B)ᵀ; out = C″ / (α_A α_B) in BF16. Grouped over experts with
torch._grouped_mm on CUDA (no host sync) and a per-expert loop on the CPU.
"""
from __future__ import annotations

import torch

from .numerics import bf16_fma
from .quant import NoisySide
from .routing import RoutingTable

ROW_CHUNK = 2048  # rows per pass of the torch FMA emulation (bounds its f64 temporaries)


def _decoded(codes: torch.Tensor) -> torch.Tensor:
    """e4m3 codes → bf16 values (exact)."""
    return codes.float().to(torch.bfloat16)


def a_peel(side: NoisySide, f_b: torch.Tensor) -> torch.Tensor:
    """(rows, 64) bf16: [β_A ⊙ E_A | A′ · F_Bᵀ]."""
    left = (side.beta.float()[:, None] * side.e_lines.float()).to(torch.bfloat16)
    right = _decoded(side.codes) @ _decoded(f_b)
    return torch.cat([left, right], dim=1)


def b_peel(side: NoisySide, f_a: torch.Tensor) -> torch.Tensor:
    """(n, 64) bf16: [(β_B ⊙ N_B − B′) · F_Aᵀ | −β_B ⊙ E_B]."""
    left = torch.empty((side.codes.shape[0], f_a.shape[1]), dtype=torch.bfloat16, device=f_a.device)
    for r0 in range(0, side.codes.shape[0], ROW_CHUNK):
        rows = slice(r0, r0 + ROW_CHUNK)
        noise = side.noise[rows]
        residual = bf16_fma(side.beta[rows, None].expand_as(noise), noise, -_decoded(side.codes[rows]))
        left[rows] = residual @ _decoded(f_a)
    right = (-side.beta.float()[:, None] * side.e_lines.float()).to(torch.bfloat16)
    return torch.cat([left, right], dim=1)


def row_experts(table: RoutingTable) -> torch.Tensor:
    """The expert of every row in expert order, (rows,) int64."""
    positions = torch.arange(table.rflat.shape[0], device=table.offsets.device)
    return torch.searchsorted(table.offsets.to(torch.int64), positions, right=True)


def peel_and_unscale(acc: torch.Tensor, a_peel_rows: torch.Tensor, alpha_a_rows: torch.Tensor,
                     b_peel_: torch.Tensor, alpha_b: torch.Tensor, table: RoutingTable) -> torch.Tensor:
    """out[i, j] = (acc[i, j] + A_peel[i] · B_peel[w, j]) / (α_A[i] α_B[w, j]) as BF16.

    acc (rows, n_e) fp32 and the A rows in expert order; b_peel_ (e, n_e, 64), alpha_b (e, n_e).
    """
    if acc.device.type == "cuda":
        correction = torch._grouped_mm(a_peel_rows, b_peel_.transpose(-2, -1), offs=table.offsets)
    else:
        correction = torch.empty_like(acc)
        start = 0
        for expert, end in enumerate(table.offsets.tolist()):
            correction[start:end] = a_peel_rows[start:end].float() @ b_peel_[expert].float().T
            start = end
    inv_b = (1.0 / alpha_b.float()).index_select(0, row_experts(table))
    return ((acc + correction.float()) * (1.0 / alpha_a_rows.float())[:, None] * inv_b).to(torch.bfloat16)
