"""The FP8 lottery's fold inside the mined GEMM's epilogue (§9): every whole 4×64 tile's 16 lanes
are folded while the window-promoted accumulator is still in registers and stored as its 64-byte
message, so the lottery (`LotteryLatch.run_folded`: compression, threshold, first-winner latch)
reads 64 bytes a tile instead of the tile's 1 KB of accumulator (at GLM-5 prefill 67 MB, not 1 GB).

Why it fits there: Hopper's WGMMA accumulator gives lane l of a warp the rows l/4 and l/4 + 8 of
its 16-row slab at columns 8·nb + 2·(l % 4) + c. The fold lane j = 4·row + g of a 4×64 tile
(lottery.py) is therefore lane j of a half-warp, and its 16 values are that lane's own fragment
elements of one 64-column block in (nb, c) order: the fold is thread-local, and the half-warp's 16
lanes store one tile's message as 64 contiguous bytes.

Why the compression is not here too: drawing the tickets in the epilogue as well (a shuffle
transpose, then one lane per tile compressing, or four lanes sharing a compression) cost the
GLM-5 prefill GEMM 194-200 µs on the H200 (docs/kernels-fp8mine.md "Ninth session"): the
consumer warps hold the tensor cores idle through ~1000 dependent operations a tile.

The host side checks what the kernel assumes (`fits`). This module imports cutlass and quack at
import time, like kernels.grouped_gemm_sm90.
"""
from __future__ import annotations

import functools
from typing import Callable

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, Int32, Uint32, const_expr
from cutlass._mlir_helpers.arith import bitcast
from cutlass.cutlass_dsl import T

from kernels.grouped_gemm import launch_variant, shared_config
from kernels.grouped_gemm_config import GroupedGemmConfig, Output, Precision, select_config
from kernels.grouped_gemm_sm90 import GroupedGemmFp32AccSm90, compile_variant, sharing
from kernels.mining_epilogue import MiningParamsMixin, fake_tile_words_arguments, mining_arguments
from proof.fp8.lottery import FOLD_MULTIPLIER, FOLD_ROTATION

_BLOCK_COLS = 64  # a lottery tile's columns: 8 column groups of the accumulator fragment
_MAX_BLOCKS_PER_THREAD = 6  # (row halves × 64-column blocks) a thread folds: 192-wide tiles, no spill
_ACC_OUTPUTS = {torch.float32: Output.FP32, torch.bfloat16: Output.BF16}  # the stored accumulator


def _u32(x: Float32) -> Uint32:
    return Uint32(bitcast(x.ir_value(), T.i32()))


def _fold(acc: cute.Tensor, h: int, mm: int, mn: int, block: int) -> Uint32:
    """This thread's fold lane for row half h and 64-column block `block` of fragment (mm, mn):
    lane = rotl13(lane·0x9E3779B1 + bits) (proof.fp8.lottery's constants) over columns 8·nb + 2g + c in (nb, c) order, each value
    +0-normalised as the Hopper model writes a zero."""
    lane = Uint32(0)
    for nb in range(8 * block, 8 * block + 8):
        for c in range(2):
            x = lane * Uint32(FOLD_MULTIPLIER) + _u32(acc[(c, h, nb), mm, mn] + Float32(0.0))
            lane = (x << FOLD_ROTATION) | (x >> (32 - FOLD_ROTATION))
    return lane


class FoldEpilogueMixin:
    """epi_visit_acc: the folded lanes of every whole 4×64 tile of the CTA tile (expert-local
    rows: tile t of expert w covers its rows 4t .. 4t + 3) into `lottery_lanes`."""

    @cute.jit
    def epi_visit_acc(self, params, acc: cute.Tensor, tiled_mma, tile_coord_mnkl, tidx: Int32) -> None:
        self.fold_tiles(params, acc, tiled_mma, tile_coord_mnkl, tidx)

    @cute.jit
    def fold_tiles(self, params, acc: cute.Tensor, tiled_mma, tile_coord_mnkl, tidx: Int32) -> None:
        tile_m, tile_n = self.cta_tile_shape_mnk[0], self.cta_tile_shape_mnk[1]
        ident = tiled_mma.get_slice(tidx).partition_C(cute.make_identity_tensor((tile_m, tile_n)))
        blocks = const_expr(cute.size(acc, mode=[0, 2]) // 8)
        expert = tile_coord_mnkl[3]
        start = params.lottery_bounds[expert]
        rows = params.lottery_bounds[expert + 1] - start
        j = tidx % 16  # the fold lane: 4 · (row in the tile) + column group
        for mm in cutlass.range_constexpr(cute.size(acc, mode=[1])):
            for mn in cutlass.range_constexpr(cute.size(acc, mode=[2])):
                for h in cutlass.range_constexpr(2):
                    for block in cutlass.range_constexpr(blocks):
                        lane = _fold(acc, h, mm, mn, block)
                        m, n = ident[(0, h, 8 * block), mm, mn]
                        t = (tile_coord_mnkl[0] * tile_m + m) // 4  # this half-warp's rows: 4t .. 4t + 3
                        col_tile = (tile_coord_mnkl[1] * tile_n + n) // _BLOCK_COLS
                        # a cluster's CTA may sit past n_e (n_e / tile_n not a multiple of cluster_n)
                        if (4 * t + 3 < rows) & (col_tile < cute.size(params.lottery_lanes, mode=[1])):
                            params.lottery_lanes[(start + 4 * t) // 4, col_tile, j] = Int32(lane)


class Fp32FoldSm90(MiningParamsMixin, FoldEpilogueMixin, GroupedGemmFp32AccSm90):
    """The raw accumulator out (as GroupedGemmFp32AccSm90; fp32, or bf16 by the compiled output)
    with the lottery's fold in the epilogue."""


def fits(config: GroupedGemmConfig, n: int) -> bool:
    """Whether the fold epilogue supports this config at this N (else the lottery reads the
    accumulator): whole 64-column blocks in each warpgroup's columns and in n_e, at most
    `_MAX_BLOCKS_PER_THREAD` folds a thread."""
    if config.tile_m == 192 or config.tile_n % _BLOCK_COLS or n % _BLOCK_COLS:
        return False
    row_halves = 2 * (config.tile_m // 64 if config.pingpong else 1)
    return row_halves * config.tile_n // _BLOCK_COLS <= _MAX_BLOCKS_PER_THREAD


@functools.lru_cache(maxsize=256)
def fold_config(rows: int, experts: int, n: int, k: int) -> GroupedGemmConfig | None:
    """The config a launch of `rows` A rows against b (experts, n, k) runs (the selector's), or
    None where it does not `fit`. Cached: the same-launch pass asks on every launch."""
    config = select_config(Precision.FP8, rows, experts, n, k)
    return config if fits(config, n) else None


@functools.lru_cache(maxsize=None)
def compile_fold_gemm(config: GroupedGemmConfig, output: Output = Output.FP32, side_smem: int = 0,
                      dynamic: bool = False) -> Callable:
    """The fp8 grouped GEMM with the fold epilogue, for sm_90a (fake tensors), storing the raw
    accumulator as fp32 (`output` FP32) or rounded to bf16 (BF16: the lanes are folded from the
    fp32 values first, so only what the peel reads is rounded). side_smem > 0: the variant that
    shares every SM with side-stream kernels (`grouped_gemm_sm90.sharing`; cooperative configs
    with one consumer warpgroup), as the lagged decode pass runs it; dynamic: tiles taken from a
    tile counter (`compile_variant`'s), as it runs beside the side stream's kernels."""
    if output not in _ACC_OUTPUTS.values():
        raise ValueError(f"the fold GEMM stores fp32 or bf16, not {output.value}")
    cls = sharing(Fp32FoldSm90, side_smem) if side_smem else Fp32FoldSm90
    return compile_variant(cls, Precision.FP8, output, config, fake_tile_words_arguments, side_smem,
                           dynamic=dynamic)


def checked_config(config: GroupedGemmConfig | None, rows: int, b_shape: tuple, gather: bool,
                   fit=fits) -> GroupedGemmConfig:
    """The launch's config (default `fold_config`'s), refused with a ValueError where `fit` (the
    epilogue's) or, gathering, cluster_n = 1 does not hold."""
    experts, n, k = b_shape
    config = config or fold_config(rows, experts, n, k)
    if config is None or not fit(config, n) or (gather and config.cluster_n != 1):
        name = "the selector's config" if config is None else config.key
        raise ValueError(f"{name} does not fit this epilogue{' with a gather' if gather else ''} "
                         f"for {rows} rows × {tuple(b_shape)}")
    return config


def folded_grouped_gemm(a: torch.Tensor, b: torch.Tensor, bounds: torch.Tensor, out: torch.Tensor,
                        lanes: torch.Tensor, config: GroupedGemmConfig | None = None,
                        lottery_bounds: torch.Tensor | None = None, max_sms: int | None = None,
                        side_smem: int = 0, tile_counter: torch.Tensor | None = None) -> torch.Tensor:
    """out = the raw window-promoted accumulator (as `grouped_gemm` without scales): fp32, or
    rounded to nearest-even bf16 when out is bf16 (half the bytes, for a caller that only peels
    it); and every whole 4×64 tile's 16 lanes, folded from the fp32 values either way, into
    `lanes`, int32 (rows // 4, n / 64, 16): tile t of expert w at [(bounds[w] + 4t) // 4, c]
    (whole tiles never share a row, so never an entry).

    a (rows, k) e4m3 in expert order, b (e, n, k) e4m3, bounds (e+1,) int32 row offsets.
    config: one that `fits` (default: `fold_config`'s).
    lottery_bounds (e+1,): fold only expert w's first lottery_bounds[w+1] − lottery_bounds[w]
    rows, tile t at lanes[(lottery_bounds[w] + 4t) // 4, c] (the lagged pass: its READY rows,
    which lead each expert's combined rows, straight into their own compact layout); lanes then
    need lottery_bounds[e] // 4 entries, which the caller guarantees (no host sync).
    max_sms, side_smem: as `grouped_gemm`'s (side_smem swaps a pingpong config for its
    cooperative twin). tile_counter: (1,) int32, zero at the launch: the persistent CTAs take
    their tiles from it (`launch_variant`'s), so the kernel left alone on the SMs it shares takes
    more of them; the caller zeroes it before every launch.
    """
    n = b.shape[1]
    rows = a.shape[0]
    config = shared_config(checked_config(config, rows, tuple(b.shape), False), side_smem)
    if out.dtype not in _ACC_OUTPUTS or out.shape != (rows, n):
        raise ValueError(f"out must be float32 or bfloat16 ({rows}, {n}), got {out.dtype} {tuple(out.shape)}")
    lane_rows = rows // 4 if lottery_bounds is None else lanes.shape[0]
    if lanes.dtype != torch.int32 or lanes.shape != (lane_rows, n // _BLOCK_COLS, 16):
        raise ValueError(f"lanes must be int32 ({lane_rows}, {n // _BLOCK_COLS}, 16), "
                         f"got {lanes.dtype} {tuple(lanes.shape)}")
    launch_variant(compile_fold_gemm(config, _ACC_OUTPUTS[out.dtype], side_smem, tile_counter is not None), a, b,
                   bounds, out, config, mining_arguments(bounds if lottery_bounds is None else lottery_bounds, lanes),
                   max_sms=max_sms, tile_counter=tile_counter)
    return out
