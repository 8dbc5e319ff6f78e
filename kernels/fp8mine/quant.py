"""Noisy quantization to e4m3 on the device (§7), Hopper constants.

Both the per-row scales and the element op are Triton kernels (noisy_kernel.py). Per row:
l2f = max(l2, 2^-32), linf_f = max(linf, 2^-32) (NaN-propagating), nb = fma(δ√r, l2f, linf_f),
α = bf16(448 / nb), β = bf16(bf16(α · l2f) · δ√r/256²). Per element:
code = e4m3(clamp(fma(α, X, bf16(β · N)), ±448)), with N = bf16 of the E@F noise dot computed by
the mined GEMM itself (k = 32: one window of one group from +0, as the device's atom) — for B,
whose peel needs N; the A side's codes launch forms its N in-kernel with the same atom.
proof.fp8.quantization is the reference.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from proof.fp8.prequant import BLOCK_SIZE, l2_frame_width
from proof.fp8.quantization import scale_constants

from . import noisy_kernel, prequant, prequant_kernel
from .matmul import matmul
from .noisy_kernel import Planes, noisy_codes, noisy_codes_of_lines

DELTA_R, DELTA_OVER_STD = scale_constants("hopper")


class QuantError(ValueError):
    """Bad input to the device noisy quantization."""


@dataclass
class NoisySide:
    """One operand after noisy quantization: codes (rows, k) e4m3, α/β (rows,) bf16 and the E
    lines (rows, 32) (the peel needs them). With `positions` (a routed A side written straight
    into expert order) codes is (rows·top_k, k): row r's codes at rows positions[r·top_k + j]."""

    codes: torch.Tensor
    alpha: torch.Tensor
    beta: torch.Tensor
    e_lines: torch.Tensor
    positions: torch.Tensor | None = None

    @property
    def top_k(self) -> int:
        """Copies of each row in codes: 0 when codes are the rows themselves."""
        return 0 if self.positions is None else self.positions.shape[0] // self.alpha.shape[0]

    def token_codes(self) -> torch.Tensor:
        """The codes (rows, k), one row per operand row (a gather where they are in expert order)."""
        if self.positions is None:
            return self.codes
        return self.codes.index_select(0, self.positions[::self.top_k])


@dataclass
class Rows:
    """One launch's activations after pre-quantization: planes, norms, (α, β) and maybe opened values."""

    codes: torch.Tensor  # (rows, k) int8
    scales: torch.Tensor  # (rows, k/8) bf16
    values: torch.Tensor | None  # (rows, k) bf16 opened values; None from the one rows launch (the codes launch opens them)
    l2: torch.Tensor  # (rows,) bf16
    linf: torch.Tensor
    alpha: torch.Tensor
    beta: torch.Tensor


def prepare_rows(x: torch.Tensor) -> Rows:
    """prequant.prequantize_and_open + prequant.row_norms + row_scales of bf16 x (rows, k): one
    launch when k ≤ 8192 (`prequant_kernel.row_programs`; decode: three launches of 96, 64 and 1
    programs took 2 waves each on the lagged side stream's ~16 SMs), writing no opened values
    (`noisy_side` opens X from the planes), the three launches otherwise."""
    if x.dtype == torch.bfloat16 and x.dim() == 2 and x.shape[1] % BLOCK_SIZE == 0 \
            and 0 < x.shape[1] <= 8 * prequant_kernel.MAX_ROW_BLOCKS:
        codes, scales, *norms_and_scales = prequant_kernel.prequantize_rows(
            x, l2_frame_width(x.shape[1]), noisy_kernel.bf16_value(DELTA_R), noisy_kernel.bf16_value(DELTA_OVER_STD))
        return Rows(codes, scales, None, *norms_and_scales)
    codes, scales, values = prequant.prequantize_and_open(x)
    l2, linf = prequant.row_norms(codes, scales)
    return Rows(codes, scales, values, l2, linf, *row_scales(l2, linf))


def row_scales(l2: torch.Tensor, linf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(α, β) bf16 per row from the raw bf16 norms (Hopper constants)."""
    return noisy_kernel.row_scales(l2, linf, DELTA_R, DELTA_OVER_STD)


def noisy_quantize(x: torch.Tensor, l2: torch.Tensor, linf: torch.Tensor, e_lines: torch.Tensor,
                   f_lines: torch.Tensor, tail: int = 0) -> tuple[NoisySide, torch.Tensor]:
    """A whole operand: x (rows, k) bf16, norms (rows,), E (rows, 32) and F (k, 32) e4m3 lines.

    Returns the noisy side and the fp32 noise dot N = E@Fᵀ (rows, k); only the B peel needs N,
    so callers drop it afterwards. tail: the codes' rows are `tail` bytes longer than k
    (`noisy_kernel.scattered_out`)."""
    rows, k = x.shape
    if x.dtype != torch.bfloat16 or e_lines.shape != (rows, 32) or f_lines.shape != (k, 32):
        raise QuantError(f"need x bf16 (rows, k), e_lines (rows, 32), f_lines (k, 32); got "
                         f"{x.dtype} {tuple(x.shape)}, {tuple(e_lines.shape)}, {tuple(f_lines.shape)}")
    alpha, beta = row_scales(l2, linf)
    noise = matmul(e_lines, f_lines)
    return NoisySide(noisy_codes(alpha, beta, x, noise, tail=tail), alpha, beta, e_lines), noise


def noisy_side(rows: Rows, e_lines: torch.Tensor, f_lines: torch.Tensor,
               positions: torch.Tensor | None = None, tail: int = 0) -> NoisySide:
    """`noisy_quantize` of pre-quantized rows (`prepare_rows`: opened values or only the planes,
    α, β), for a side whose N nothing else reads (A): on CUDA the codes launch forms N itself (no GEMM launch, N
    never stored); on the CPU the model's N feeds the same element op. positions
    (`RoutingTable.positions`): the codes are written straight into expert order, top_k copies a
    row (no gather after). tail: as `noisy_quantize`."""
    x = rows.values if rows.values is not None else Planes(rows.codes, rows.scales)
    operands = (rows.alpha, rows.beta, x)
    if rows.codes.is_cuda:
        codes = noisy_codes_of_lines(*operands, e_lines, f_lines, positions, tail)
    else:
        codes = noisy_codes(*operands, matmul(e_lines, f_lines), positions, tail)
    return NoisySide(codes, rows.alpha, rows.beta, e_lines, positions)
