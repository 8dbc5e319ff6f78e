"""Peel and unscale (§10; approximate, not consensus): the useful BF16 output from the mined
pre-peel accumulator.

A peel (rows, 2r) = [β_A ⊙ E_A | A′ · F_Bᵀ]; B peel (n, 2r) = [(β_B ⊙ N_B − B′) · F_Aᵀ | −β_B ⊙ E_B]
(the first block one bf16 FMA per element, as the reference); C″ = acc + A_peel · B_peelᵀ =
(A′ − β_A N_A)(B′ − β_B N_B)ᵀ; out = C″ / (α_A α_B) in BF16.

Per launch this is the A peel (one Triton pass over A′; split over k when there are too few
rows to fill the SMs, the last program of a row block adding the partials; at prefill F_B's
fp32 values, decoded once per job), then either the peel tails (`write_tails`: the GEMM peels in
its epilogue, peel_epilogue.py, at prefill) or the rank-64 correction, add and unscale
fused in one pass over the accumulator (row tiles never straddle an expert, so a tile's correction is one small dot against its
expert's B peel; A peel rows and α_A are gathered through Rflat in the kernel; at prefill a
program walks its row tile over 1024 columns with the accumulator tiles prefetched, see
`peel_shape`; at decode a program takes all rows of one expert and 128 columns instead, see
`_expert_peel_kernel`). The lottery is its own pass (lottery.py): fused into this one it
was slower on the H200 than the two passes apart (docs/kernels-fp8mine.md). The B peel is per
job (torch ops).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kernels.stream_counters import stream_counters
from kernels.triton_jit import jit, pdl_enabled, pdl_launch

from .noisy_kernel import _bf16_of_bits, _rne_bf16
from .numerics import bf16_fma
from .quant import NoisySide
from .routing import RoutingTable, RowTiles, row_tiles
from .word_copy import chunks, copy_two_ranges

ROW_CHUNK = 2048  # rows per pass of the torch FMA emulation (bounds its f64 temporaries)
TAIL_BYTES = 128  # a bf16 peel row (64 values) after an operand row's codes: the peel GEMM's extra k-tile
_A_PEEL_ROWS = 16
_A_PEEL_WIDE_ROWS = 64  # row block at decode (few rows) and once rows alone fill the GPU (prefill)
_A_PEEL_WIDE_FROM = 64 * 128  # rows from which the wide block is used
_A_PEEL_PROGRAMS = 264  # split k until row blocks × splits reaches this (2 × 132 SMs: GLM-5 prefill 80 vs 90 µs at 128, H100, session 18)
_A_PEEL_DECODE_ROWS = 256  # rows up to which the A peel is a decode one (64-row blocks, few programs)
_A_PEEL_DECODE_PROGRAMS = 16  # decode: few programs, k split 16 ways (side work beside the lagged GEMM)
_PEEL_ROWS = 64  # row-tile height of the prefill pass (experts averaging ≥ 64 rows)
_PEEL_WIDE_COLS = 64  # prefill: 64-column steps, 3-stage cp.async prefetch (82 KB smem, 112 regs: 2 an SM)
_PEEL_SPAN = 1024  # most columns one prefill program walks
_PEEL_MIN_PROGRAMS = 4 * 132  # keep ≥ 4 programs per H200 SM when widening spans
_EXPERT_PEEL_COLS = 128  # decode: columns a program (one B-peel load, kept for all its expert's rows)
_EXPERT_PEEL_WARPS = 4
_POLL_SPINS = tl.constexpr(1 << 14)  # acquire loads (~1 µs each) an expert's peel program tries before it waits for the whole GEMM


def _decoded(codes: torch.Tensor) -> torch.Tensor:
    """e4m3 codes → bf16 values (exact)."""
    return codes.float().to(torch.bfloat16)


@jit
def e4m3_value(code):
    """e4m3 codes (int32 0..255) → their f32 values (exact; the NaN codes give ±480). The 7
    exponent/mantissa bits go to f32 bits 20..26 (exponent field e, or an f32 subnormal when
    e = 0) and the product with 2^120 rebias them: 2^(e−7)·1.m, or m·2^−9. No FTZ in Triton."""
    bits = ((code << 20) & 0x07F00000) | ((code << 24) & -2147483648)  # 0x80000000: the sign
    return bits.to(tl.float32, bitcast=True) * 1.329227995784916e36  # 2^120


@jit
def _store_a_peel(out_ptr, beta_ptr, e_ptr, r, right_sum, rows, BR: tl.constexpr):
    """Rows r of the A peel: [bf16(β[r] · E[r, :]) | bf16(right_sum)]."""
    live = (r < rows)[:, None]
    r64 = r.to(tl.int64)[:, None]
    j = tl.arange(0, 32)[None, :]
    beta = _bf16_of_bits(beta_ptr, r, r < rows)
    e = e4m3_value(tl.load(e_ptr + r64 * 32 + j, mask=live, other=0).to(tl.int32))
    left = _rne_bf16((beta[:, None] * e).to(tl.int32, bitcast=True)) >> 16
    right = _rne_bf16(right_sum.to(tl.int32, bitcast=True)) >> 16
    out = out_ptr + r64 * 64 + j
    tl.store(out, left.to(tl.int16), mask=live)
    tl.store(out + 32, right.to(tl.int16), mask=live)


@jit
def _a_peel_kernel(codes_ptr, positions_ptr, beta_ptr, e_ptr, f_t_ptr, out_ptr, partial_ptr, counter_ptr, rows, k,
                   stride, k_per_split, splits, BR: tl.constexpr, BK: tl.constexpr, TOP_K: tl.constexpr):
    """Σ_k A′[r, k] · F_B[k, :] over split program_id(1)'s k range for BR rows, stored by
    `finish_a_peel` (several splits: no combine launch). Each BK step is an e4m3 · e4m3
    tensor-core window against F_Bᵀ's codes (32, k), promoted to fp32 apart from the dot as the
    Hopper model does: the codes go to the tensor cores as loaded (1 byte, not the 4 of the fp32
    values a TF32 dot read: H100, session 20, GLM-5 prefill 24 vs 81 µs). The peel is approximate
    (§10): its sums round to bf16. TOP_K > 0: the codes are in expert order and row r is read
    from codes row positions[r·TOP_K] (its first copy). stride: the codes' row stride (k, or k
    plus a peel tail)."""
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    live = (r < rows)[:, None]
    r64 = r.to(tl.int64)[:, None]
    if TOP_K == 0:
        source = r64
    else:
        source = tl.load(positions_ptr + r64 * TOP_K, mask=live, other=0).to(tl.int64)
    kk = tl.arange(0, BK)
    total = tl.full((BR, 32), 0.0, tl.float32)
    k_start = tl.program_id(1) * k_per_split
    k_end = tl.minimum(k_start + k_per_split, k)
    for k0 in range(k_start, k_end, BK):
        codes = tl.load(codes_ptr + source * stride + k0 + kk[None, :], mask=live, other=0)
        f_t = tl.load(f_t_ptr + tl.arange(0, 32).to(tl.int64)[:, None] * k + k0 + kk[None, :])
        window = tl.dot(codes.to(tl.float8e4nv, bitcast=True), tl.trans(f_t.to(tl.float8e4nv, bitcast=True)))
        total = tl.fma(window, 1.0, total)  # promoted apart from the dot, as the windowed GEMM
    finish_a_peel(out_ptr, beta_ptr, e_ptr, partial_ptr, counter_ptr, r, total, rows, splits, BR)


@jit
def finish_a_peel(out_ptr, beta_ptr, e_ptr, partial_ptr, counter_ptr, r, total, rows, splits, BR: tl.constexpr):
    """This program's Σ A′·F_B over its k split (`total`, (BR, 32) fp32) into the A peel rows r:
    directly with one split; else into partial[split, r, :], and the row block's last program to
    finish (an acq_rel counter per row block, reset by it) adds the partials in split order
    (deterministic) and stores the rows."""
    if splits == 1:
        _store_a_peel(out_ptr, beta_ptr, e_ptr, r, total, rows, BR)
    else:
        live = (r < rows)[:, None]
        cell = r.to(tl.int64)[:, None] * 32 + tl.arange(0, 32)[None, :]
        tl.store(partial_ptr + tl.program_id(1) * rows * 32 + cell, total, mask=live)
        tl.debug_barrier()  # every thread's stores come before the release below
        counter = counter_ptr + tl.program_id(0)
        if tl.atomic_add(counter, 1, sem="acq_rel") == splits - 1:
            total = tl.full((BR, 32), 0.0, tl.float32)
            for split in range(splits):
                total += tl.load(partial_ptr + split * rows * 32 + cell, mask=live, other=0.0, cache_modifier=".cg")
            _store_a_peel(out_ptr, beta_ptr, e_ptr, r, total, rows, BR)
            tl.store(counter, 0)  # ready for the next launch (graph replays reuse the counters)


def a_peel_rows(rows: int) -> int:
    """Row block of the A peel: 64 at decode (≤ _A_PEEL_DECODE_ROWS rows: a few blocks, k split
    across the side stream's SMs, so each program walks only a few k steps with one F_B block
    per step for all its rows) and at prefill (64-row blocks alone give 128+ programs); 16
    between (more row blocks)."""
    return _A_PEEL_ROWS if _A_PEEL_DECODE_ROWS < rows < _A_PEEL_WIDE_FROM else _A_PEEL_WIDE_ROWS


def a_peel_splits(rows: int, k: int, block_k: int) -> tuple[int, int]:
    """(k splits, k per split), each k range a whole number of BK steps. Decode: ~16 programs
    (the SMs the lagged pass leaves beside its GEMM; 64 rows, k = 6144 → 16 splits of 3 steps);
    else enough (row block, k split) programs for two a GPU's SMs (GLM-5 prefill: 128 row
    blocks × 2 splits)."""
    row_blocks = triton.cdiv(rows, a_peel_rows(rows))
    programs = _A_PEEL_DECODE_PROGRAMS if rows <= _A_PEEL_DECODE_ROWS else _A_PEEL_PROGRAMS
    return split_k(k, block_k, min(k // block_k, programs // row_blocks))


def split_k(k: int, block_k: int, wanted: int) -> tuple[int, int]:
    """(splits, k per split) closest to `wanted` splits (at least one) with each k range a whole
    number of block_k steps."""
    per_split = triton.cdiv(triton.cdiv(k, max(1, wanted)), block_k) * block_k
    return triton.cdiv(k, per_split), per_split


def a_peel(side: NoisySide, f_b: torch.Tensor, f_b_t: torch.Tensor | None = None) -> torch.Tensor:
    """(rows, 64) bf16: [β_A ⊙ E_A | A′ · F_Bᵀ] (k a multiple of 32). One Triton launch: split
    over k when the rows alone give too few programs (decode), the last program of each row
    block adding the partial sums; the sums are e4m3 tensor-core windows against F_Bᵀ's codes
    (`f_b_t`, (32, k), formed once per job; or here from F_B (k, 32)). Codes in expert order
    (`side.positions`) are read at each token's first copy."""
    rows, k = side.alpha.shape[0], side.codes.shape[1]
    device = side.codes.device
    block_k = 128 if k % 128 == 0 else 32
    splits, per_split = a_peel_splits(rows, k, block_k)
    out = torch.empty((rows, 64), dtype=torch.int16, device=device)
    block_rows = a_peel_rows(rows)
    row_blocks = triton.cdiv(rows, block_rows)
    if splits > 1:
        partial = torch.empty((splits, rows, 32), dtype=torch.float32, device=device)
        done = stream_counters(device, row_blocks)
    else:
        partial = done = out
    beta, e_lines = side.beta.contiguous().view(torch.int16), side.e_lines.contiguous().view(torch.uint8)
    f_t = transposed_codes(f_b) if f_b_t is None else f_b_t
    codes = (side.codes if side.codes.stride(1) == 1 else side.codes.contiguous()).view(torch.uint8)
    positions = codes if side.positions is None else side.positions
    _a_peel_kernel[(row_blocks, splits)](
        codes, positions, beta, e_lines, f_t, out, partial, done, rows, k, codes.stride(0), per_split, splits,
        BR=block_rows, BK=block_k, TOP_K=side.top_k, num_warps=4,
        num_stages=4)  # one warpgroup, ~80 registers, cp.async two k steps ahead (sm_90 cubin)
    return out.view(torch.bfloat16)


def transposed_codes(f_b: torch.Tensor) -> torch.Tensor:
    """F_Bᵀ's e4m3 codes (32, k) as bytes: the K-major operand of the A peel's e4m3 dot."""
    return f_b.contiguous().view(torch.uint8).t().contiguous()


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


class TilePoll(NamedTuple):
    """What a decode peel polls instead of waiting for its whole GEMM (`peel_and_unscale(poll=)`):
    the GEMM's per-expert finished-tile counts (`fold_epilogue.folded_grouped_gemm(expert_done=)`),
    its row bounds (e+1,) and tile shape, from which each expert's tile count follows."""

    done: torch.Tensor  # (e,) int32
    bounds: torch.Tensor  # (e+1,) int32: the GEMM's, not the peel's
    tile_m: int
    tile_n: int


class PeelShape(NamedTuple):
    """Launch shape of the peel pass: columns per step, steps per program, pipeline stages of
    the step loop (accumulator and B-peel tiles prefetched by cp.async), warps."""

    cols: int
    steps: int
    stages: int
    warps: int


def peel_shape(row_tiles_: int, n: int, acc_bytes: int = 4) -> PeelShape:
    """The prefill pass (64-row tiles): a program walks its row tile across up to _PEEL_SPAN
    columns in 64-column steps (3 stages); spans halve while they would leave fewer than
    _PEEL_MIN_PROGRAMS programs. 8 warps on an fp32 accumulator, 4 on a bf16 one (acc_bytes 2:
    H100, GLM-5 prefill, 461 against 542 µs with 8; the copy of its bytes takes 438).
    (Decode runs `_expert_peel_kernel` instead.)"""
    col_tiles = triton.cdiv(n, _PEEL_WIDE_COLS)
    steps = 1
    while steps * 2 <= min(col_tiles, _PEEL_SPAN // _PEEL_WIDE_COLS) and \
            row_tiles_ * triton.cdiv(col_tiles, steps * 2) >= _PEEL_MIN_PROGRAMS:
        steps *= 2
    return PeelShape(_PEEL_WIDE_COLS, steps, 3, 8 if acc_bytes == 4 else 4)


@jit
def _peel_unscale_kernel(acc_ptr, shift_ptr, rflat_ptr, a_peel_ptr, alpha_a_ptr, b_peel_ptr, alpha_b_ptr,
                         tile_row_ptr, tile_expert_ptr, bounds_ptr, out_ptr, n, acc_rows,
                         BR: tl.constexpr, BN: tl.constexpr, STEPS: tl.constexpr, STAGES: tl.constexpr,
                         SHIFTED: tl.constexpr, RIGHT_ONLY: tl.constexpr):
    """out = (acc + A_peel[token] · B_peel[w]ᵀ) · (1/α_A[token]) · (1/α_B[w, col]) → bf16 for one
    row tile of expert w (rows in expert order, token = Rflat[row]) and STEPS × BN columns, BN at a
    time (STEPS = 1: no loop; STAGES: the loop's cp.async pipeline depth). SHIFTED: output row i of
    expert w reads accumulator row i + shift[w]. RIGHT_ONLY: the A peel's left half is zero (clean
    rows), so only the right halves of the A and B peels are read (half the B-peel bytes).
    Accumulator loads are masked by the expert's end when SHIFTED (the end loads beside the
    shift), otherwise by the accumulator's row count only (no dependent load before the pipeline
    starts)."""
    row0 = tl.load(tile_row_ptr + tl.program_id(0))
    if row0 >= 0:
        rows = row0 + tl.arange(0, BR)
        expert = tl.load(tile_expert_ptr + tl.program_id(0)).to(tl.int64)
        if SHIFTED:
            source = rows.to(tl.int64) + tl.load(shift_ptr + expert)
        else:
            source = rows.to(tl.int64)
        row_end = tl.load(bounds_ptr + expert + 1)
        live_r = rows < row_end
        in_acc = source < acc_rows
        if SHIFTED:
            in_acc = in_acc & live_r
        token = tl.load(rflat_ptr + rows, mask=live_r, other=0).to(tl.int64)
        if RIGHT_ONLY:
            j = 32 + tl.arange(0, 32)[None, :]
        else:
            j = tl.arange(0, 64)[None, :]
        a = _bf16_of_bits(a_peel_ptr, token[:, None] * 64 + j, live_r[:, None])
        inv_a = 1.0 / tl.where(live_r, _bf16_of_bits(alpha_a_ptr, token, live_r), 1.0)
        source_cells = source[:, None] * n
        out_cells = rows.to(tl.int64)[:, None] * n
        for step in tl.range(STEPS, num_stages=STAGES):
            cols = (tl.program_id(1) * STEPS + step) * BN + tl.arange(0, BN)
            live_c = cols < n
            acc = tl.load(acc_ptr + source_cells + cols[None, :], mask=in_acc[:, None] & live_c[None, :],
                          other=0.0).to(tl.float32)  # fp32 or bf16 (exact either way)
            b_rows = expert * n + cols.to(tl.int64)
            b = _bf16_of_bits(b_peel_ptr, b_rows[:, None] * 64 + j, live_c[:, None])
            correction = tl.dot(a, tl.trans(b))  # bf16 values are exact in tf32
            inv_b = 1.0 / tl.where(live_c, _bf16_of_bits(alpha_b_ptr, b_rows, live_c), 1.0)
            out = (acc + correction) * inv_a[:, None] * inv_b[None, :]
            bits = _rne_bf16(out.to(tl.int32, bitcast=True)) >> 16  # RNE, the same in the interpreter
            tl.store(out_ptr + out_cells + cols[None, :], bits.to(tl.int16), mask=live_r[:, None] & live_c[None, :])


@jit
def _acc_block(acc_ptr, rows, row_end, shift, acc_rows, cols, live_c, n):
    """The accumulator tile of one row block of the decode peel (nothing is read for rows past
    the expert's end), loaded a block ahead of its use so its round trip overlaps the block before."""
    source = rows.to(tl.int64) + shift
    in_acc = (rows < row_end) & (source < acc_rows)
    return tl.load(acc_ptr + source[:, None] * n + cols[None, :], mask=in_acc[:, None] & live_c[None, :],
                   other=0.0, eviction_policy="evict_first").to(tl.float32)  # read once; fp32 or bf16


@jit
def _expert_peel_kernel(acc_ptr, shift_ptr, rflat_ptr, a_peel_ptr, alpha_a_ptr, b_peel_ptr, alpha_b_ptr,
                        bounds_ptr, out_ptr, n, acc_rows, experts, first_src_ptr, first_dst_ptr, first_words,
                        second_src_ptr, second_dst_ptr, second_words, done_ptr, gemm_bounds_ptr, tile_m, gemm_col_tiles,
                        BR: tl.constexpr, BN: tl.constexpr, SHIFTED: tl.constexpr, RIGHT_ONLY: tl.constexpr,
                        AFTER_GEMM: tl.constexpr = 0, POLL: tl.constexpr = 0):
    """The decode peel: `_peel_unscale_kernel`'s arithmetic (the same dot, chained from the
    accumulator, and the same roundings) for all rows of one expert and BN columns
    (`_peel_expert`). Programs past the experts copy two int32 word ranges (the lagged pass's
    take of MINED, `word_copy.copy_two_ranges`), so nothing on another stream has to follow the
    GEMM. AFTER_GEMM: launched as the programmatic dependent of the GEMM that writes acc, so the
    peel's first loads run while the GEMM drains; a program waits for the GEMM before it reads
    acc, the A peel (written on another stream while the GEMM runs) or the ranges (the GEMM
    writes the lanes); and every program lets the stream's next kernel launch as it ends (the
    lagged front waits for it; triggering as each program starts instead measured no faster:
    docs/kernels-fp8mine.md "Twenty-eighth session").
    POLL (with AFTER_GEMM): the GEMM counts each expert's finished tiles in done_ptr and lets
    this kernel launch from its first tiles on; an expert's program waits for its expert's count
    only (`_wait_for_tiles`), so the experts the GEMM has finished are served while it goes on.
    The grid is then (column tiles, experts + copy programs), so programs start expert by expert,
    in the order the GEMM's tiles finish. One program of the grid waits for the whole GEMM before
    it ends (a copy program, or else the last one): the next kernel (which may reset the counts
    and the GEMM's tile counter) waits for this whole grid, so it never starts before the GEMM is
    over, while the other programs leave their SM slots as soon as their expert is served
    (waiting in every program would hold ~2 programs an SM beside the GEMM until its end, so
    only the first few experts would run under it)."""
    if POLL:
        p, c = tl.program_id(1), tl.program_id(0)
        col_programs = tl.num_programs(0)
    else:
        p, c = tl.program_id(0), tl.program_id(1)
        col_programs = tl.num_programs(1)
    if p < experts:
        _peel_expert(acc_ptr, shift_ptr, rflat_ptr, a_peel_ptr, alpha_a_ptr, b_peel_ptr, alpha_b_ptr, bounds_ptr,
                     out_ptr, n, acc_rows, p, c, done_ptr, gemm_bounds_ptr, tile_m, gemm_col_tiles, BR, BN, SHIFTED,
                     RIGHT_ONLY, AFTER_GEMM, POLL)
    else:
        if AFTER_GEMM:
            gdc_wait()
        copy_two_ranges((p - experts) * col_programs + c, first_src_ptr, first_dst_ptr,
                        first_words, second_src_ptr, second_dst_ptr, second_words)
    if AFTER_GEMM:
        if POLL:
            if (p == tl.num_programs(1) - 1) & (c == col_programs - 1) & (p < experts):
                gdc_wait()  # no copy program waited: the last program holds the grid open
        gdc_launch_dependents()


@jit
def _wait_for_tiles(done_ptr, gemm_bounds_ptr, expert, tile_m, gemm_col_tiles):
    """Spin (acquire loads) until `expert`'s finished-tile count reaches its tile count in the
    GEMM, ceil(rows / tile_m) · gemm_col_tiles over the GEMM's bounds; after _POLL_SPINS tries wait for
    the whole GEMM instead, so a count that never arrives costs time, never a wrong read."""
    rows = tl.load(gemm_bounds_ptr + expert + 1) - tl.load(gemm_bounds_ptr + expert)
    expected = (rows + tile_m - 1) // tile_m * gemm_col_tiles
    seen = tl.atomic_add(done_ptr + expert, 0, sem="acquire", scope="gpu")
    spins = 0
    while (seen < expected) & (spins < _POLL_SPINS):
        seen = tl.atomic_add(done_ptr + expert, 0, sem="acquire", scope="gpu")
        spins += 1
    if seen < expected:
        gdc_wait()


@jit
def _peel_expert(acc_ptr, shift_ptr, rflat_ptr, a_peel_ptr, alpha_a_ptr, b_peel_ptr, alpha_b_ptr, bounds_ptr, out_ptr,
                 n, acc_rows, expert, col_tile, done_ptr, gemm_bounds_ptr, tile_m, gemm_col_tiles, BR: tl.constexpr,
                 BN: tl.constexpr, SHIFTED: tl.constexpr, RIGHT_ONLY: tl.constexpr, AFTER_GEMM: tl.constexpr,
                 POLL: tl.constexpr):
    """One decode peel program: all rows of `expert`, BN columns. Why a kernel apart: at decode
    an expert has ~16 rows, so the row-tile kernel's 32-row tiles computed half their cells
    masked, paid a tile-map load before the expert's bounds, and a program walked 4 column steps
    at ~2 programs an SM (latency-bound). Here the grid is experts × column tiles (no tile map),
    the B-peel tile and 1/α_B are loaded once and kept while the
    expert's rows go by in BR-row blocks (usually one or two), each block's accumulator tile and
    Rflat entries loaded one block ahead (106 registers at 16 × 128: 4 programs an SM). An
    expert with no rows reads nothing. Dependent loads: (bounds, shift) → (B peel, α_B, Rflat,
    first accumulator tile) → A-peel rows and α_A (no branch on the bounds, so the shift load is
    not sunk behind them). AFTER_GEMM: that chain's first links run before the wait for the GEMM
    (POLL: for this expert's tiles of it)."""
    row_start = tl.load(bounds_ptr + expert)
    row_end = tl.load(bounds_ptr + expert + 1)
    if SHIFTED:
        shift = tl.load(shift_ptr + expert).to(tl.int64)
    else:
        shift = 0
    cols = col_tile * BN + tl.arange(0, BN)
    live_c = cols < n
    used_c = cols < tl.where(row_start < row_end, n, 0)  # an expert with no rows reads no B peel
    if RIGHT_ONLY:
        j = 32 + tl.arange(0, 32)[None, :]
    else:
        j = tl.arange(0, 64)[None, :]
    b_rows = expert.to(tl.int64) * n + cols.to(tl.int64)
    rows = row_start + tl.arange(0, BR)
    token = tl.load(rflat_ptr + rows, mask=rows < row_end, other=0)
    b = _bf16_of_bits(b_peel_ptr, b_rows[:, None] * 64 + j, used_c[:, None])
    inv_b = 1.0 / tl.where(used_c, _bf16_of_bits(alpha_b_ptr, b_rows, used_c), 1.0)
    if POLL:
        if row_start < row_end:  # an expert with no clean rows reads nothing, so waits for nothing
            _wait_for_tiles(done_ptr, gemm_bounds_ptr, expert, tile_m, gemm_col_tiles)
    elif AFTER_GEMM:
        gdc_wait()
    acc = _acc_block(acc_ptr, rows, row_end, shift, acc_rows, cols, live_c, n)
    for _ in range(row_start, row_end, BR):
        live_r = rows < row_end
        gathered = token.to(tl.int64)
        a = _bf16_of_bits(a_peel_ptr, gathered[:, None] * 64 + j, live_r[:, None])
        inv_a = 1.0 / tl.where(live_r, _bf16_of_bits(alpha_a_ptr, gathered, live_r), 1.0)
        next_acc = _acc_block(acc_ptr, rows + BR, row_end, shift, acc_rows, cols, live_c, n)
        next_token = tl.load(rflat_ptr + rows + BR, mask=rows + BR < row_end, other=0)
        out = (acc + tl.dot(a, tl.trans(b))) * inv_a[:, None] * inv_b[None, :]  # the add fuses into the dot
        bits = _rne_bf16(out.to(tl.int32, bitcast=True)) >> 16
        tl.store(out_ptr + rows.to(tl.int64)[:, None] * n + cols[None, :], bits.to(tl.int16),
                 mask=live_r[:, None] & live_c[None, :])
        acc, token, rows = next_acc, next_token, rows + BR


def _expert_rows(rows: int, experts: int) -> int:
    """Row block of the decode peel: 16 (the MMA's height; GLM-5 decode averages 16 rows an
    expert, so one block, a second mostly masked for about half of them) while experts average
    fewer than 32 rows, else 32 (fewer serial blocks)."""
    return 32 if rows >= 32 * experts else 16


def reads_tiles(table: RoutingTable) -> bool:
    """Whether `peel_and_unscale` on this routing reads a row-tile map: prefill (experts average
    ≥ 64 rows); the decode peel by expert walks the experts' bounds instead."""
    return table.rflat.shape[0] >= _PEEL_ROWS * table.experts


def peel_tiles(table: RoutingTable) -> RowTiles:
    """The peel pass's row-tile map of a routing table: one small kernel that a caller may run
    ahead (e.g. on a side stream before the GEMM) so it is not on the launch's tail."""
    return row_tiles(table, _PEEL_ROWS, partial=True)


def peel_and_unscale(acc: torch.Tensor, a_peel_: torch.Tensor, alpha_a: torch.Tensor,
                     b_peel_: torch.Tensor, alpha_b: torch.Tensor, table: RoutingTable,
                     row_shift: torch.Tensor | None = None,
                     tiles: RowTiles | None = None, a_left_zero: bool = False,
                     after_gemm: bool = False,
                     copies: tuple[tuple[torch.Tensor, torch.Tensor], ...] = (),
                     poll: TilePoll | None = None) -> torch.Tensor:
    """out[i, j] = (acc[i, j] + A_peel[t] · B_peel[w, j]) / (α_A[t] α_B[w, j]) as BF16, t = Rflat[i].

    acc (rows, n_e) fp32, or bf16 (the fold GEMM's rounded accumulator), in expert order;
    a_peel_ (m, 64) and alpha_a (m,) in token order;
    b_peel_ (e, n_e, 64), alpha_b (e, n_e). With row_shift (e,) int32, output row i of expert w
    reads acc row i + row_shift[w] (acc may then hold other rows too: a combined launch).
    One Triton pass plus the row-tile map, no host sync (approximate arithmetic: the output is
    not consensus). tiles: `peel_tiles(table)` built ahead, or None to build it here; decode
    (experts averaging < 64 rows) walks the experts' bounds instead and does not read it.
    a_left_zero: the caller promises A_peel[:, :32] = 0 (the lagged pass's clean rows), so the
    kernel reads only the right halves of both peels.
    after_gemm: the caller promises that the last kernel on the stream is the GEMM writing acc
    and that every input but acc, a_peel_ and the copies' sources was written before that GEMM
    started or by work the stream waited for before this launch; the decode peel then starts
    while the GEMM drains (programmatic dependent launch, sm_90 compiled only).
    copies: up to two int32 (source, destination) word ranges that more programs of the same
    launch copy (decode only; after_gemm: read after the GEMM, which may write them), e.g. the
    lagged pass's take of MINED, so that no other stream's kernel has to follow the GEMM.
    poll (decode, after_gemm): the GEMM counts each expert's finished tiles and lets the peel
    launch early; each expert's rows are peeled once that expert's count is complete, while the
    GEMM goes on (`_expert_peel_kernel`'s POLL). Without PDL (an interpreter, or compiled
    without it) the peel runs after the GEMM and the counts are complete when it reads them.
    Polling, the peel writes `out` while the GEMM still runs: no memory the GEMM uses may go back
    to the stream's caching allocator between the GEMM's launch and this call (a temporary copy
    of an operand freed there could become `out`), and a_peel_ must be complete before this
    launch (the stream waited for it), as the peel reads it without waiting for the GEMM.
    """
    rows, n = table.rflat.shape[0], acc.shape[1]
    experts = table.experts
    if len(copies) > 2 or any(t.dtype != torch.int32 or not t.is_contiguous() or t.device != acc.device
                              or src.numel() != dst.numel() for src, dst in copies for t in (src, dst)):
        raise ValueError(f"copies: at most two contiguous int32 (source, destination) ranges of equal length "
                         f"on {acc.device}")
    ranges = [(src.view(-1), dst.view(-1)) for src, dst in copies]
    if (ranges or poll is not None) and reads_tiles(table):
        raise ValueError("copies and polls ride the decode peel only (experts averaging fewer than 64 rows)")
    if poll is not None and (not after_gemm or poll.done.shape != (experts,) or poll.done.dtype != torch.int32
                             or poll.bounds.shape != (experts + 1,) or poll.bounds.dtype != torch.int32):
        raise ValueError(f"poll: after the GEMM, int32 done ({experts},) and bounds ({experts + 1},)")
    none = torch.empty(0, dtype=torch.int32, device=acc.device)
    ranges += [(none, none)] * (2 - len(ranges))
    if b_peel_.shape != (experts, n, 64) or alpha_b.shape != (experts, n) or a_peel_.shape[1] != 64:
        raise ValueError(f"peel shapes do not match acc {tuple(acc.shape)} with {experts} experts: "
                         f"a_peel {tuple(a_peel_.shape)}, b_peel {tuple(b_peel_.shape)}, alpha_b {tuple(alpha_b.shape)}")
    if (acc.shape[0] != rows) if row_shift is None else (row_shift.shape != (experts,) or acc.shape[0] < rows):
        raise ValueError(f"acc {tuple(acc.shape)} does not hold the table's {rows} rows "
                         f"(row_shift {None if row_shift is None else tuple(row_shift.shape)}, {experts} experts)")
    if acc.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"acc must be float32 or bfloat16, got {acc.dtype}")
    out = torch.empty((rows, n), dtype=torch.int16, device=acc.device)
    acc = acc.contiguous()
    operands = (acc, acc if row_shift is None else row_shift, table.rflat, a_peel_.contiguous().view(torch.int16),
                alpha_a.contiguous().view(torch.int16), b_peel_.contiguous().view(torch.int16),
                alpha_b.contiguous().view(torch.int16))
    if not reads_tiles(table):
        overlap = after_gemm and pdl_enabled()
        col_tiles = triton.cdiv(n, _EXPERT_PEEL_COLS)
        copy_rows = triton.cdiv(chunks(ranges[0][0].numel()) + chunks(ranges[1][0].numel()), col_tiles)
        polls = poll is not None and overlap
        grid = (col_tiles, experts + copy_rows) if polls else (experts + copy_rows, col_tiles)
        done, gemm_bounds, tile_m, tile_n = poll if polls else (none, none, 1, 1)
        _expert_peel_kernel[grid](
            *operands, table.bounds, out, n, acc.shape[0], experts, *ranges[0], ranges[0][0].numel(), *ranges[1],
            ranges[1][0].numel(), done, gemm_bounds, tile_m, triton.cdiv(n, tile_n), BR=_expert_rows(rows, experts),
            BN=_EXPERT_PEEL_COLS, SHIFTED=row_shift is not None, RIGHT_ONLY=a_left_zero, AFTER_GEMM=int(overlap),
            POLL=int(polls), num_warps=_EXPERT_PEEL_WARPS, num_stages=1,
            **pdl_launch(overlap))  # the loop prefetches by hand
        return out.view(torch.bfloat16)
    tiles = tiles if tiles is not None else peel_tiles(table)
    shape = peel_shape(tiles.row_start.shape[0], n, acc.element_size())
    grid = (tiles.row_start.shape[0], triton.cdiv(n, shape.steps * shape.cols))
    _peel_unscale_kernel[grid](*operands, tiles.row_start, tiles.expert, table.bounds, out, n, acc.shape[0],
                               BR=_PEEL_ROWS, BN=shape.cols, STEPS=shape.steps, STAGES=shape.stages,
                               SHIFTED=row_shift is not None, RIGHT_ONLY=a_left_zero, num_warps=shape.warps)
    return out.view(torch.bfloat16)


def has_tail(codes: torch.Tensor) -> bool:
    """Whether the e4m3 rows `codes` (rows, k) lie k + TAIL_BYTES apart (written with a tail:
    `noisy_kernel.scattered_out`), so each row's peel row can ride after it (`padded_rows`)."""
    return codes.dim() == 2 and codes.stride(1) == 1 and codes.stride(0) == codes.shape[1] + TAIL_BYTES


def padded_rows(codes: torch.Tensor) -> torch.Tensor:
    """The (rows, k + TAIL_BYTES) uint8 rows around `codes` (which must `has_tail`): the peel
    GEMM's operand, each row's codes then its peel row's bytes."""
    if not has_tail(codes):
        raise ValueError(f"codes {tuple(codes.shape)} with strides {codes.stride()} carry no peel tail")
    rows, k = codes.shape
    return codes.view(torch.uint8).as_strided((rows, k + TAIL_BYTES), (k + TAIL_BYTES, 1))


@jit
def _tails_kernel(peel_ptr, alpha_ptr, positions_ptr, scale_positions_ptr, padded_ptr, inv_ptr, rows, tail_at,
                  stride, BR: tl.constexpr, TOP_K: tl.constexpr, SCALE_TOP_K: tl.constexpr):
    """BR operand rows: each bf16 peel row (64 int16) into its codes rows' tails (padded_ptr as
    int16, rows `stride` apart, the tail at column tail_at) and 1/α (RNE) per codes row; TOP_K > 0:
    row r's codes rows are positions[r·TOP_K + j], else row r itself. SCALE_TOP_K > 0: 1/α goes
    to the GEMM rows scale_positions[r·SCALE_TOP_K + j] instead (a GEMM gathering token rows)."""
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    live = r < rows
    c = tl.arange(0, 64)
    peel = tl.load(peel_ptr + r.to(tl.int64)[:, None] * 64 + c[None, :], mask=live[:, None], other=0)
    inv = tl.math.div_rn(tl.full((BR,), 1.0, tl.float32), _bf16_of_bits(alpha_ptr, r, live))
    for j in tl.static_range(max(TOP_K, 1)):
        if TOP_K == 0:
            dest = r.to(tl.int64)
        else:
            dest = tl.load(positions_ptr + r.to(tl.int64) * TOP_K + j, mask=live, other=0).to(tl.int64)
        tl.store(padded_ptr + dest[:, None] * stride + tail_at + c[None, :], peel, mask=live[:, None])
        if SCALE_TOP_K == 0:
            tl.store(inv_ptr + dest, inv, mask=live)
    for j in tl.static_range(SCALE_TOP_K):
        row = tl.load(scale_positions_ptr + r.to(tl.int64) * SCALE_TOP_K + j, mask=live, other=0).to(tl.int64)
        tl.store(inv_ptr + row, inv, mask=live)


_TAIL_ROWS = 32


def write_tails(side: NoisySide, peel_rows: torch.Tensor,
                gathered: RoutingTable | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Store each operand row's bf16 peel row (rows, 64) in its codes' tails (every expert-order
    copy where `side.positions`) and return (`padded_rows(side.codes)`, 1/α (codes rows,) fp32 in
    the codes' row order): the peel GEMM's operand and its row scale, from one launch.

    gathered: the GEMM reads token-order codes through this table's Rflat (`matmul.gather_in_gemm`);
    1/α is then returned per Rflat row, in expert order (the table's `positions`), so no gather
    launch follows (7 µs at GLM-5 prefill, H100, session 24)."""
    padded = padded_rows(side.codes)
    rows, k = side.alpha.shape[0], side.codes.shape[1]
    if peel_rows.shape != (rows, 64) or peel_rows.dtype != torch.bfloat16:
        raise ValueError(f"peel rows must be bf16 ({rows}, 64), got {peel_rows.dtype} {tuple(peel_rows.shape)}")
    scale_top_k = 0
    if gathered is not None:
        if side.positions is not None or gathered.positions is None or gathered.positions.numel() % max(rows, 1):
            raise ValueError("a gathered GEMM reads token-order codes through a routing table with positions")
        scale_top_k = gathered.positions.numel() // rows
    inv = torch.empty(side.codes.shape[0] if gathered is None else gathered.rflat.shape[0], dtype=torch.float32,
                      device=padded.device)
    int16 = padded.view(torch.int16)
    _tails_kernel[(triton.cdiv(rows, _TAIL_ROWS),)](
        peel_rows.contiguous().view(torch.int16), side.alpha.contiguous().view(torch.int16),
        inv if side.positions is None else side.positions, inv if gathered is None else gathered.positions,
        int16, inv, rows, k // 2, int16.stride(0), BR=_TAIL_ROWS, TOP_K=side.top_k, SCALE_TOP_K=scale_top_k)
    return padded, inv
