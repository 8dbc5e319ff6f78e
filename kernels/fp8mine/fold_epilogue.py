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
consumer warps hold the tensor cores idle through ~1000 dependent operations a tile. The same
holds for the lagged pass's serving peel: done in this epilogue with CUDA-core FMAs it cost the
decode GEMM ~90 µs on an H100 (its loads wait on a saturated DRAM; "Twenty-ninth session"), so
the lagged GEMM only stores its clean rows compact here (`CompactStoreMixin`) for the peel pass.

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
from quack.compile_utils import make_fake_tensor
from cutlass._mlir.dialects import llvm
from cutlass._mlir_helpers.arith import bitcast
from cutlass.cutlass_dsl import T, dsl_user_op
from cutlass.experimental import primitives as prims

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


@dsl_user_op
def _bf16x2_word(low: Float32, high: Float32, *, loc=None, ip=None) -> Int32:
    """low + 0 and high + 0 (a zero as +0, as the stored accumulator) rounded to nearest-even
    bf16 by the hardware conversion (F2FP, the TMA store's), packed low | high << 16. The
    hardware form, not integer rounding: a NaN stays the canonical bf16 NaN (integer RNE carried
    WGMMA's 0x7FFFFFFF into the sign bit and stored −0)."""
    args = [(Float32(v) + Float32(0.0)).ir_value(loc=loc, ip=ip) for v in (high, low)]
    return Int32(llvm.inline_asm(T.i32(), args, "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f",
                                 has_side_effects=False, is_align_stack=False))


class CompactStoreMixin(FoldEpilogueMixin):
    """epi_visit_acc: the fold of each expert's first (lottery) rows, then the bf16 accumulator
    of the rows after them, stored from registers at their compact positions: expert-local row
    lottery_w + i (i < compact_bounds[w + 1] − compact_bounds[w]) → compact row
    compact_bounds[w] + i. The lagged pass's READY rows are folded and never stored, and its
    clean rows land where the serving peel reads them without a row shift; the kernel has no
    D (a whole-tile TMA store would write both). With expert_done (E,) int32, zero at the
    launch: each finished tile adds one to its expert's count (`signal_tile_done`), and the
    kernel lets its programmatic dependent launch from its first tile on, so a peel that polls
    the counts (`peel.peel_and_unscale(poll=)`) serves each expert while the GEMM goes on."""

    @cute.jit
    def epi_visit_acc(self, params, acc: cute.Tensor, tiled_mma, tile_coord_mnkl, tidx: Int32) -> None:
        if const_expr(params.expert_done is not None):
            # the polling peel (the next kernel) may launch once every CTA has begun a tile
            prims.griddepcontrol(prims.GridDepAction.LAUNCH_DEPENDENTS)
        self.fold_tiles(params, acc, tiled_mma, tile_coord_mnkl, tidx)
        self.store_compact(params, acc, tiled_mma, tile_coord_mnkl, tidx)
        if const_expr(params.expert_done is not None):
            self.signal_tile_done(params, tile_coord_mnkl, tidx)

    @cute.jit
    def signal_tile_done(self, params, tile_coord_mnkl, tidx: Int32) -> None:
        """expert_done[w] += 1 for this tile of expert w, once every epilogue thread's stores are
        issued, so that a peel polling the count with acquire loads reads the finished rows: the
        epilogue's CTA barrier, then CUTLASS's release pattern (`barrier.h` `red_release`: a
        gpu-scope acq_rel fence, which also releases the other threads' weak stores ordered before
        it by the barrier, and a relaxed reduction). A release reduction after the fence would add
        a second MEMBAR.GPU a tile for nothing."""
        self.epilogue_barrier.arrive_and_wait()
        if tidx == 0:
            cute.arch.fence_acq_rel_gpu()
            cute.arch.red(params.expert_done.iterator + tile_coord_mnkl[3], Int32(1), op="add", dtype="s32",
                          sem="relaxed", scope="gpu")

    @cute.jit
    def store_compact(self, params, acc: cute.Tensor, tiled_mma, tile_coord_mnkl, tidx: Int32) -> None:
        """A thread's fragment columns 8·nb + 2·(lane % 4) + c: each (c = 0, 1) pair is one
        word of the bf16 row."""
        tile_m, tile_n = self.cta_tile_shape_mnk[0], self.cta_tile_shape_mnk[1]
        ident = tiled_mma.get_slice(tidx).partition_C(cute.make_identity_tensor((tile_m, tile_n)))
        blocks = const_expr(cute.size(acc, mode=[0]) // 4)  # (c, h, nb): 8-column blocks
        expert = tile_coord_mnkl[3]
        skipped = params.lottery_bounds[expert + 1] - params.lottery_bounds[expert]
        first = params.compact_bounds[expert]
        kept = params.compact_bounds[expert + 1] - first
        n = 2 * cute.size(params.compact_out, mode=[1])
        for mm in cutlass.range_constexpr(cute.size(acc, mode=[1])):
            for mn in cutlass.range_constexpr(cute.size(acc, mode=[2])):
                for h in cutlass.range_constexpr(2):
                    m, _ = ident[(0, h, 0), mm, mn]
                    i = tile_coord_mnkl[0] * tile_m + m - skipped
                    if (i >= 0) & (i < kept):
                        for nb in cutlass.range_constexpr(blocks):
                            _, col = ident[(0, h, nb), mm, mn]
                            col = tile_coord_mnkl[1] * tile_n + col
                            if col < n:  # a cluster's CTA may sit past n_e
                                params.compact_out[first + i, col // 2] = _bf16x2_word(
                                    acc[(0, h, nb), mm, mn], acc[(1, h, nb), mm, mn])


class CompactFoldSm90(MiningParamsMixin, CompactStoreMixin, GroupedGemmFp32AccSm90):
    """The fold of the lottery rows and the compact bf16 store of the rest (no D)."""


def _fake_compact_arguments(m, n, num_experts):
    """`fake_tile_words_arguments` plus the compact store's bounds and int32 view of its rows."""
    return fake_tile_words_arguments(m, n, num_experts)._replace(
        compact_bounds=make_fake_tensor(Int32, (cute.sym_int(),), leading_dim=0),
        compact_out=make_fake_tensor(Int32, (cute.sym_int(), cute.sym_int()), leading_dim=1))


def _fake_signalling_arguments(m, n, num_experts):
    """`_fake_compact_arguments` plus the per-expert finished-tile counts."""
    return _fake_compact_arguments(m, n, num_experts)._replace(
        expert_done=make_fake_tensor(Int32, (cute.sym_int(),), leading_dim=0))


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
                      dynamic: bool = False, compact: bool = False, signal: bool = False) -> Callable:
    """The fp8 grouped GEMM with the fold epilogue, for sm_90a (fake tensors), storing the raw
    accumulator as fp32 (`output` FP32) or rounded to bf16 (BF16: the lanes are folded from the
    fp32 values first, so only what the peel reads is rounded). side_smem > 0: the variant that
    shares every SM with side-stream kernels (`grouped_gemm_sm90.sharing`; cooperative configs
    with one consumer warpgroup), as the lagged decode pass runs it; dynamic: tiles taken from a
    tile counter (`compile_variant`'s), as it runs beside the side stream's kernels. compact:
    the variant that stores only the rows after each expert's lottery rows, in bf16, compact
    (`CompactStoreMixin`; output BF16). signal (with compact): each finished tile counted in
    its expert's expert_done entry, for a peel that polls them; cooperative configs without
    clusters only (a tile's epilogue threads then include thread 0, and no CTA of a cluster
    sits past n_e, where its tile would be counted too)."""
    if output not in _ACC_OUTPUTS.values() or (compact and output is not Output.BF16):
        raise ValueError(f"the fold GEMM stores fp32 or bf16 (compact: bf16), not {output.value}")
    if signal and not (compact and signals(config)):
        raise ValueError(f"tile counts come with the compact store, on a cooperative config without clusters "
                         f"(got {config.key}, compact {compact})")
    base = CompactFoldSm90 if compact else Fp32FoldSm90
    cls = sharing(base, side_smem) if side_smem else base
    fake = _fake_signalling_arguments if signal else _fake_compact_arguments if compact else fake_tile_words_arguments
    return compile_variant(cls, Precision.FP8, output, config, fake, side_smem, dynamic=dynamic,
                           store_d=not compact)


def launch_config(rows: int, b_shape: tuple, side_smem: int = 0,
                  config: GroupedGemmConfig | None = None) -> GroupedGemmConfig:
    """The config `folded_grouped_gemm` runs over `rows` A rows (`config`, default the
    selector's, checked, then its shared-SM form): its tile shape is how a peel polling
    expert_done counts an expert's tiles."""
    return shared_config(checked_config(config, rows, tuple(b_shape), False), side_smem)


def signals(config: GroupedGemmConfig) -> bool:
    """Whether the compact store can count finished tiles at this config (`compile_fold_gemm`)."""
    return not config.pingpong and config.cluster_m == config.cluster_n == 1


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
                        side_smem: int = 0, tile_counter: torch.Tensor | None = None,
                        compact_bounds: torch.Tensor | None = None,
                        expert_done: torch.Tensor | None = None) -> torch.Tensor:
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
    compact_bounds (e+1,), with lottery_bounds: out (kept rows, n) bf16 receives only the rows
    after each expert's lottery rows, expert w's row lottery_w + i at out row compact_bounds[w] + i
    (the lagged pass: its clean rows, where the serving peel reads them); the lottery rows are
    folded and not stored, and nothing else of the accumulator is written.
    expert_done (e,) int32, with compact_bounds, zero at the launch (the caller's to reset): each
    finished tile of expert w adds one to expert_done[w] after its rows are stored, and the
    kernel's programmatic dependent may launch from every CTA's first tile on (a peel that
    polls the counts, `peel.peel_and_unscale(poll=)`). Expert w has
    ceil(rows_w / tile_m) · ceil(n / tile_n) tiles (`launch_config`).
    """
    n = b.shape[1]
    rows = a.shape[0]
    config = launch_config(rows, b.shape, side_smem, config)
    if compact_bounds is not None:
        if lottery_bounds is None or compact_bounds.shape != lottery_bounds.shape or compact_bounds.dtype != torch.int32:
            raise ValueError("compact_bounds come with lottery_bounds of the same shape (int32)")
        if out.dtype != torch.bfloat16 or out.dim() != 2 or out.shape[1] != n or not out.is_contiguous():
            raise ValueError(f"a compact out must be contiguous bfloat16 (rows, {n}), got {out.dtype} {tuple(out.shape)}")
    elif out.dtype not in _ACC_OUTPUTS or out.shape != (rows, n):
        raise ValueError(f"out must be float32 or bfloat16 ({rows}, {n}), got {out.dtype} {tuple(out.shape)}")
    if expert_done is not None:
        if compact_bounds is None or expert_done.shape != (b.shape[0],) or expert_done.dtype != torch.int32:
            raise ValueError(f"expert_done comes with compact_bounds: int32 ({b.shape[0]},)")
        if not signals(config):
            raise ValueError(f"{config.key} cannot count its tiles (pingpong or clustered)")
    lane_rows = rows // 4 if lottery_bounds is None else lanes.shape[0]
    if lanes.dtype != torch.int32 or lanes.shape != (lane_rows, n // _BLOCK_COLS, 16):
        raise ValueError(f"lanes must be int32 ({lane_rows}, {n // _BLOCK_COLS}, 16), "
                         f"got {lanes.dtype} {tuple(lanes.shape)}")
    compact = compact_bounds is not None
    signal = expert_done is not None
    epi = mining_arguments(bounds if lottery_bounds is None else lottery_bounds, lanes,
                           **({"compact_bounds": compact_bounds, "compact_out": out.view(torch.int32)} if compact else {}),
                           **({"expert_done": expert_done} if signal else {}))
    launch_variant(compile_fold_gemm(config, _ACC_OUTPUTS[out.dtype], side_smem, tile_counter is not None, compact,
                                     signal),
                   a, b, bounds, None if compact else out, config, epi, max_sms=max_sms, tile_counter=tile_counter)
    return out
