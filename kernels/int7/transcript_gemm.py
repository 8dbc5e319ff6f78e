"""The INT7 mined GEMM on the CuTe grouped int8 GEMM: A'·B' as exact int32, with the INT
transcript (int-protocol.md §5.2) folded in the main loop; each lottery tile's 16 words are stored
for `tile_lottery` (tickets, bound, first winner). For prefill, where the Triton mined kernel's
64 × 128 tiles run ~1.5× slower than this GEMM's 128 × 128 IGMMA tiles (docs/kernels-int7.md).

Why the main loop: S(c), the running sum after chunk c (every r = 128 of K), is needed at every
chunk, not only at the end. With tile_k = r each k-tile is one chunk, and quack's 8-bit main loop
already waits for every k-tile's WGMMAs (its promotion path); here the WGMMAs accumulate straight
into the accumulator and, once they retire, each thread XORs its values of each tile row (a
lottery tile is 2 rows × 128 columns, within one warp's fragment) and three butterfly shuffles
give the 8 lanes holding the tile its chunk XOR X_c. The 16 words J[c mod 16] ← rotl13(J) ⊕ X_c
are spread over those 8 lanes (lane ℓ keeps words 2ℓ and 2ℓ + 1), so every word index is static.
The two consumer warpgroups' MMAs overlap each other's folds.

Scope (`fits`): tile_k = 128 (one chunk a k-tile: K a multiple of 128), 128-column lottery tiles
(tile_n and n multiples of 128; no 192/320-row tiles, whose warpgroups split N). This module
imports cutlass and quack at import time, like kernels.grouped_gemm_sm90.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Int32

from kernels.grouped_gemm import launch_variant
from kernels.grouped_gemm_config import (GroupedGemmConfig, Output, Precision, Regime, candidates, regime_for,
                                         select_config)
from kernels.grouped_gemm_sm90 import GroupedGemmInt8Sm90, sharing, compile_variant
from kernels.mining_epilogue import MiningParamsMixin, fake_tile_words_arguments, mining_arguments
from kernels.visited_mainloop import VisitedMainloopMixin
from proof.int7.transcript import JACKPOT_WORDS, ROTATION

from .mined_gemm import check_operand

CHUNK = 128  # the rank r = tile_k: one transcript chunk a k-tile
TILE_ROWS, TILE_COLS = 2, 128  # the lottery tile (mined_gemm.lottery_tile's widest)
_LANES_PER_TILE = 8  # lanes holding one tile's rows in a warp's fragment: 2 rows × 4 column lanes
_MAX_TILES_PER_THREAD = 4


def _rotl(x: Int32) -> Int32:
    return (x << ROTATION) | ((x >> (32 - ROTATION)) & Int32((1 << ROTATION) - 1))


def _xor_tree(values: list) -> Int32:
    """XOR of the values as a balanced tree (short dependency chains)."""
    while len(values) > 1:
        values = [values[i] ^ values[i + 1] if i + 1 < len(values) else values[i]
                  for i in range(0, len(values), 2)]
    return values[0]


def _thread_tiles(acc: cute.Tensor) -> list[tuple[int, int, int]]:
    """(mm, h, block) of each lottery tile this thread holds rows of: fragment row atom mm, row
    half h (rows g and g + 8 of a warp's 16-row slab), 128-column block."""
    assert cute.size(acc, mode=[2]) == 1, "one MMA atom along N (the warpgroup's whole tile_n)"
    blocks = cute.size(acc, mode=[0, 2]) * 8 // TILE_COLS
    return [(mm, h, block) for mm in range(cute.size(acc, mode=[1])) for h in range(2) for block in range(blocks)]


def _fold_chunk(acc: cute.Tensor, words: cute.Tensor, slot: Int32, lane: Int32) -> None:
    """Fold chunk `slot` (c mod 16) of the running sums in `acc` into this lane's words."""
    for t, (mm, h, block) in enumerate(_thread_tiles(acc)):
        x = _xor_tree([acc[(c, h, nb), mm, 0] for nb in range(16 * block, 16 * block + 16) for c in range(2)])
        for mask in (1, 2, 4):  # the tile's 8 lanes: column lanes (1, 2) and the row pair (4)
            x = x ^ cute.arch.shuffle_sync_bfly(x, offset=mask)
        for w in range(2):
            old = words[2 * t + w]
            words[2 * t + w] = cutlass.select_(slot == 2 * lane + w, _rotl(old) ^ x, old)


class TranscriptMainloopMixin(VisitedMainloopMixin):
    """The transcript folded at every k-tile; epi_visit_acc: the words stored."""

    def begin_tile(self, acc: cute.Tensor) -> None:
        words = cute.make_rmem_tensor((2 * len(_thread_tiles(acc)),), Int32)
        words.fill(0)
        self.transcript_words = words  # this tile's words, for epi_visit_acc (same trace, same tile)

    def visit_k_tile(self, acc: cute.Tensor, k_tile: Int32, k_tile_cnt: Int32) -> None:
        _fold_chunk(acc, self.transcript_words, k_tile % JACKPOT_WORDS, cute.arch.lane_idx() % _LANES_PER_TILE)

    @cute.jit
    def epi_visit_acc(self, params, acc: cute.Tensor, tiled_mma, tile_coord_mnkl, tidx: Int32) -> None:
        words = self.transcript_words
        tile_m, tile_n = self.cta_tile_shape_mnk[0], self.cta_tile_shape_mnk[1]
        ident = tiled_mma.get_slice(tidx).partition_C(cute.make_identity_tensor((tile_m, tile_n)))
        expert = tile_coord_mnkl[3]
        start = params.lottery_bounds[expert]
        rows = params.lottery_bounds[expert + 1] - start
        lane = cute.arch.lane_idx() % _LANES_PER_TILE
        tiles = _thread_tiles(acc)
        for t in cutlass.range_constexpr(len(tiles)):
            mm, h, block = tiles[t]
            m, n = ident[(0, h, 16 * block), mm, 0]
            pair = (tile_coord_mnkl[0] * tile_m + m) // TILE_ROWS  # the tile row, expert-local
            col_tile = (tile_coord_mnkl[1] * tile_n + n) // TILE_COLS
            # a cluster's CTA may sit past n (n / tile_n not a multiple of cluster_n)
            if (TILE_ROWS * pair + TILE_ROWS <= rows) & (col_tile < cute.size(params.lottery_lanes, mode=[1])):
                for w in cutlass.range_constexpr(2):
                    params.lottery_lanes[start // TILE_ROWS + pair, col_tile, 2 * lane + w] = words[2 * t + w]


class Int8TranscriptSm90(MiningParamsMixin, TranscriptMainloopMixin, GroupedGemmInt8Sm90):
    """int8 grouped GEMM, exact s32 out, with the INT transcript's tile words."""


def fits(config: GroupedGemmConfig, n: int, k: int) -> bool:
    """Whether this kernel runs the config at (n, k): one chunk a k-tile, whole 128-column tiles
    inside each warpgroup's columns, at most `_MAX_TILES_PER_THREAD` tiles a thread."""
    if config.tile_k != CHUNK or k % CHUNK or n % TILE_COLS or config.tile_n % TILE_COLS:
        return False
    if config.tile_m in (192, 320):
        return False
    row_halves = 2 * (config.tile_m // 64 if config.pingpong else max(1, config.tile_m // 128))
    return row_halves * config.tile_n // TILE_COLS <= _MAX_TILES_PER_THREAD


# The prefill tile, measured on the H200 (session 11, GLM-5 FC1 prefill, same run): 2322 µs at
# 128 × 256 without a cluster against 2717 at the int8 selector's 128 × 128 (2 × 1 cluster), 3021
# at 128 × 128 without one; a 256-column tile holds 4 lottery tiles a thread, as many as `fits` allows.
PREFILL_CONFIG = GroupedGemmConfig.from_key("128x256x128_c1x1_coop")


@functools.lru_cache(maxsize=256)
def transcript_config(rows: int, experts: int, n: int, k: int, gather: bool = False) -> GroupedGemmConfig | None:
    """PREFILL_CONFIG for prefill-sized launches where it `fits`; otherwise the int8 selector's
    config where it fits (and, gathering, has cluster_n = 1), else the first sweep candidate of
    the regime that does (e.g. Qwen3's N = 3072 selects 128 × 192 tiles), else None."""
    def usable(config: GroupedGemmConfig) -> bool:
        return fits(config, n, k) and (config.cluster_n == 1 or not gather)

    regime = regime_for(rows, experts)
    preferred = [PREFILL_CONFIG] if regime is Regime.PREFILL else []
    chosen = [select_config(Precision.INT8, rows, experts, n, k)]
    return next(filter(usable, preferred + chosen + candidates(Precision.INT8, regime)), None)


@functools.lru_cache(maxsize=256)
def sharing_config(rows: int, experts: int, n: int, k: int) -> GroupedGemmConfig | None:
    """A config for the variant that shares its SMs (`transcript_gemm(side_smem=)`: cooperative,
    one consumer warpgroup, so 64-row tiles): the int8 selector's where it is one (ping-pong
    made cooperative, as `grouped_gemm(side_smem=)` does), else the first such sweep candidate
    of the regime that fits, else None."""
    regime = regime_for(rows, experts)
    for config in [select_config(Precision.INT8, rows, experts, n, k)] + candidates(Precision.INT8, regime):
        config = dataclasses.replace(config, pingpong=False)
        if config.tile_m == 64 and fits(config, n, k):
            return config
    return None


@functools.lru_cache(maxsize=None)
def compile_transcript_gemm(config: GroupedGemmConfig, gather: bool = False, side_smem: int = 0,
                            dynamic: bool = False) -> Callable:
    """The int8 → s32 grouped GEMM with the transcript, for sm_90a (fake tensors); gather: A's
    rows read through an index (`compile_variant`); side_smem > 0: the variant that shares every
    SM with other streams' kernels (`grouped_gemm_sm90.sharing`: one consumer warpgroup);
    dynamic: tiles taken from a tile counter (`compile_variant`'s), as beside the side chain."""
    cls = sharing(Int8TranscriptSm90, side_smem) if side_smem else Int8TranscriptSm90
    return compile_variant(cls, Precision.INT8, Output.INT32, config, fake_tile_words_arguments,
                           side_smem=side_smem, gather=gather, dynamic=dynamic)


def transcript_gemm(a: torch.Tensor, b: torch.Tensor, bounds: torch.Tensor, out: torch.Tensor,
                    words: torch.Tensor, config: GroupedGemmConfig | None = None,
                    a_idx: torch.Tensor | None = None, side_smem: int = 0,
                    tile_counter: torch.Tensor | None = None) -> torch.Tensor:
    """out = A'·B' (int32, exact) per expert, and every whole 2 × 128 lottery tile's 16 transcript
    words into `words`, int32 (rows / 2, n / 128, 16): tile row t of expert e at [bounds[e] / 2 + t]
    (so every expert's rows must be even; the pipeline's are).

    a (rows, k) int8 (A′ rows in expert order), b (e, n, k) int8 (B′ᵀ), bounds (e+1,) int32.
    a_idx: (rows,) int32; then a is (tokens, k) and output row r reads a[a_idx[r]] (the MoE
    routing: no copy of A′ into expert order; the config needs cluster_n = 1).
    side_smem: leave this much shared memory (and half the registers) of every SM to kernels of
    other streams (the lagged decode pass's side chain); the config must be cooperative with one
    consumer warpgroup.
    tile_counter: (1,) int32 on the GEMM's device, zero when the launch starts (the caller
    resets it before every launch: the kernel leaves its tile count there); the persistent CTAs
    then take their tiles from it, so CTAs slowed by side kernels take fewer.
    """
    experts, n, k = b.shape
    rows = a.shape[0] if a_idx is None else a_idx.shape[0]
    config = config or transcript_config(rows, experts, n, k, a_idx is not None)
    if config is None or not fits(config, n, k) or (a_idx is not None and config.cluster_n != 1):
        name = "the selector's config" if config is None else config.key
        raise ValueError(f"{name} does not fit the transcript GEMM{' with a gather' if a_idx is not None else ''} "
                         f"for {rows} rows × {tuple(b.shape)}")
    check_operand("words", words, (rows // TILE_ROWS, n // TILE_COLS, JACKPOT_WORDS), torch.int32)
    launch_variant(compile_transcript_gemm(config, a_idx is not None, side_smem, tile_counter is not None),
                   a, b, bounds, out, config, mining_arguments(bounds, words), a_idx=a_idx, tile_counter=tile_counter)
    return out
