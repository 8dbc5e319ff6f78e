"""The A side's noisy codes and its A peel in one launch (§7, §10; `pipeline.A_PEEL_IN_NOISY`).

The A peel's right half Σ_k A′[r, k] · F_B[k, :] reads every A′ code once more after the noisy
launch wrote it (a second launch, ~100 µs at GLM-5 FC1 prefill on the H100, on the serving
stream before the GEMM: side-stream placement waited behind the persistent GEMM). Here the launch
that computes the codes also takes their dot with F_B's fp32 values while the codes are in
registers: each program walks a span of column tiles of one row block, storing the codes
(`noisy_kernel.store_codes`, token or expert order) and accumulating its (rows, 32) partial sum;
`peel.finish_a_peel` adds the spans' partials in order (the last program of a row block does it,
so no combine launch) and stores the A peel rows [β ⊙ E_A | bf16(Σ)].

The codes are bit for bit those of `noisy_kernel` (the same `noisy_codes_tile`); the A peel's
sums are taken in 64-column steps rather than the A peel kernel's 128, so its bf16 rows can differ
from `peel.a_peel`'s in the last place (the peel is approximate, not consensus).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_jit import jit

from .noisy_kernel import _bf16_of_bits, noisy_codes_tile, scattered_out, store_codes, tile_noise
from .peel import counters, e4m3_value, finish_a_peel, split_k, stream_id

_ROWS = 64  # the row block (and the tile height of the E·F dot, as noisy_codes_of_lines)
_COLS = 64  # the column tile
_PROGRAMS = 1024  # split the columns until row blocks × spans reaches this (prefill: 128 × 8)


@jit
def _noisy_peel_kernel(x_ptr, noise_ptr, e_ptr, f_ptr, f_b_ptr, alpha_ptr, beta_ptr, out_ptr, positions_ptr,
                       peel_ptr, partial_ptr, counter_ptr, rows, k, stride, span, splits, BR: tl.constexpr,
                       BC: tl.constexpr, DOT: tl.constexpr, TOP_K: tl.constexpr):
    """Row block program_id(0), columns [program_id(1)·span, + span) in BC steps: the codes of
    each tile (as _noisy_kernel), then Σ codes' values · F_B over the span (tf32 dot: e4m3 values
    are exact there), finished by `finish_a_peel`."""
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    live_r = r < rows
    alpha = _bf16_of_bits(alpha_ptr, r, live_r)[:, None]
    beta = _bf16_of_bits(beta_ptr, r, live_r)[:, None]
    j = tl.arange(0, 32)
    total = tl.full((BR, 32), 0.0, tl.float32)
    start = tl.program_id(1) * span
    for c0 in range(start, tl.minimum(start + span, k), BC):
        cols = c0 + tl.arange(0, BC)
        live_c = cols < k
        live = live_r[:, None] & live_c[None, :]
        offs = r.to(tl.int64)[:, None] * k + cols[None, :]
        x, dot = tile_noise(x_ptr, noise_ptr, e_ptr, f_ptr, r, cols, offs, live_r, live, k, DOT)
        codes = noisy_codes_tile(x, alpha, beta, dot)
        store_codes(out_ptr, positions_ptr, codes.to(tl.uint8), r, cols, live_r, live, stride, TOP_K)
        values = tl.where(live, e4m3_value(codes), 0.0)
        f_b = tl.load(f_b_ptr + cols.to(tl.int64)[:, None] * 32 + j[None, :], mask=live_c[:, None], other=0.0)
        total = tl.dot(values, f_b, total)
    finish_a_peel(peel_ptr, beta_ptr, e_ptr, partial_ptr, counter_ptr, r, total, rows, splits, BR)


def spans(rows: int, k: int) -> tuple[int, int]:
    """(column spans, columns a span): enough (row block, span) programs to reach _PROGRAMS,
    each span a whole number of column tiles."""
    return split_k(k, _COLS, min(triton.cdiv(k, _COLS), _PROGRAMS // triton.cdiv(rows, _ROWS)))


def noisy_codes_and_peel(alpha: torch.Tensor, beta: torch.Tensor, x: torch.Tensor, e_lines: torch.Tensor,
                         f_lines: torch.Tensor, f_b_values: torch.Tensor, positions: torch.Tensor | None = None,
                         noise: torch.Tensor | None = None, tail: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, A peel): `noisy_kernel.noisy_codes_of_lines`'s codes (or, given the fp32 noise dot
    `noise`, `noisy_codes`'s: the CPU path) and the A peel (rows, 64) bf16 against F_B's fp32
    values (k, 32), in one launch; tail as `noisy_kernel.scattered_out`."""
    rows, k = x.shape
    if f_b_values.dtype != torch.float32 or f_b_values.shape != (k, 32):
        raise ValueError(f"f_b_values must be fp32 ({k}, 32), got {f_b_values.dtype} {tuple(f_b_values.shape)}")
    out, where, top_k = scattered_out(x, positions, tail)
    splits, per_span = spans(rows, k)
    row_blocks = triton.cdiv(rows, _ROWS)
    peel = torch.empty((rows, 64), dtype=torch.int16, device=x.device)
    if splits > 1:
        partial = torch.empty((splits, rows, 32), dtype=torch.float32, device=x.device)
        done = counters(x.device, stream_id(x.device), row_blocks)
    else:
        partial = done = peel
    x16 = x.contiguous().view(torch.int16)
    dot = noise is None
    _noisy_peel_kernel[(row_blocks, splits)](
        x16, x16 if dot else noise.contiguous(), e_lines.contiguous().view(torch.uint8),
        f_lines.contiguous().view(torch.uint8), f_b_values.contiguous(), alpha.contiguous().view(torch.int16),
        beta.contiguous().view(torch.int16), out, where, peel, partial, done, rows, k, k + tail, per_span, splits,
        BR=_ROWS, BC=_COLS, DOT=dot, TOP_K=top_k, enable_fp_fusion=False, num_warps=4)
    return out[:, :k].view(torch.float8_e4m3fn), peel.view(torch.bfloat16)
