"""The FP8 lottery inside the mined GEMM's epilogue (§9): fold, ticket, threshold compare and the
first-winner latch while the window-promoted accumulator is still in registers, so the 4×64
tiles are never written out and read back for the lottery (at GLM-5 prefill that pass read 1 GB).

Why it fits there: Hopper's WGMMA accumulator gives lane l of a warp the rows l/4 and l/4 + 8 of
its 16-row slab at columns 8·nb + 2·(l % 4) + c. The fold lane j = 4·row + g of a 4×64 tile
(lottery.py) is therefore thread l = j of a half-warp, and its 16 values are that thread's own
fragment elements of one 64-column block in (nb, c) order: the fold is thread-local. A half-warp
holds the 16 lanes of S ≤ 4 tiles (two row halves × the warpgroup's 64-column blocks); S × 16
shuffles hand thread s < S the message of tile s, and it runs the keyed compression, the compare,
and on a win the lock CAS and the record, in the word layout `LotteryLatch.poll` reads.

The host side checks what the kernel assumes (`fits`): 64-column blocks inside one warpgroup's
columns, N a multiple of the tile width (no column tile past n_e), ≤ 16 tiles per half-warp.
This module imports cutlass and quack at import time, like kernels.grouped_gemm_sm90.
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple, Optional

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, Int32, Uint32, const_expr
from cutlass._mlir_helpers.arith import bitcast
from cutlass.cutlass_dsl import T
from quack.compile_utils import make_fake_tensor
from quack.cute_dsl_utils import mlir_namedtuple
from quack.gemm_default_epi import GemmDefaultEpiMixin

from kernels.grouped_gemm import launch_variant
from kernels.grouped_gemm_config import GroupedGemmConfig, Output, Precision, select_config
from kernels.grouped_gemm_sm90 import GroupedGemmFp32AccSm90, compile_variant
from kernels.int7.blake3 import CHUNK_END, CHUNK_START, IV, KEYED_HASH, ROOT

from .lottery import (GROUP_ID, HASH_A, HASH_B, MAGIC, MAGIC_AT, TARGET, TICKET, TILE_COLUMN, TILE_ROW,
                      LotteryBuffers)

FOLD_MULTIPLIER = 0x9E3779B1
_FLAGS = CHUNK_START | CHUNK_END | ROOT | KEYED_HASH
_PERMUTATION = (2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8)
_BLOCK_COLS = 64  # a lottery tile's columns: 8 column groups of the accumulator fragment
_MAX_TILES_PER_HALF_WARP = 4  # 6 (192-wide warpgroup tiles) spills the sm_90a epilogue


def _u32(x: Float32) -> Uint32:
    return Uint32(bitcast(x.ir_value(), T.i32()))


def _rotr(x: Uint32, n: int) -> Uint32:
    return (x >> n) | (x << (32 - n))


def _g(v: list, a: int, b: int, c: int, d: int, x: Uint32, y: Uint32) -> None:
    v[a] = v[a] + v[b] + x
    v[d] = _rotr(v[d] ^ v[a], 16)
    v[c] = v[c] + v[d]
    v[b] = _rotr(v[b] ^ v[c], 12)
    v[a] = v[a] + v[b] + y
    v[d] = _rotr(v[d] ^ v[a], 8)
    v[c] = v[c] + v[d]
    v[b] = _rotr(v[b] ^ v[c], 7)


def compress(key: list, message: list) -> list:
    """One keyed BLAKE3 compression of a full 64-byte root block (counter 0): the 8 output words.
    Plain Python traced inline (the rounds unroll; the permutation is register renaming)."""
    v = list(key) + [Uint32(w) for w in IV[:4]] + [Uint32(0), Uint32(0), Uint32(64), Uint32(_FLAGS)]
    m = list(message)
    for _ in range(7):
        _g(v, 0, 4, 8, 12, m[0], m[1])
        _g(v, 1, 5, 9, 13, m[2], m[3])
        _g(v, 2, 6, 10, 14, m[4], m[5])
        _g(v, 3, 7, 11, 15, m[6], m[7])
        _g(v, 0, 5, 10, 15, m[8], m[9])
        _g(v, 1, 6, 11, 12, m[10], m[11])
        _g(v, 2, 7, 8, 13, m[12], m[13])
        _g(v, 3, 4, 9, 14, m[14], m[15])
        m = [m[i] for i in _PERMUTATION]
    return [v[i] ^ v[i + 8] for i in range(8)]


def _at_most(h: list, threshold: cute.Tensor):
    """LE256(h) ≤ LE256(threshold words), word 7 most significant."""
    le = h[0] <= Uint32(threshold[0])
    for i in range(1, 8):
        t = Uint32(threshold[i])
        le = (h[i] < t) | ((h[i] == t) & le)
    return le


def _fold(acc: cute.Tensor, h: int, mm: int, mn: int, block: int) -> Uint32:
    """The fold lane of this thread for row half h and 64-column block `block` of fragment
    (mm, mn): lane = rotl13(lane·0x9E3779B1 + bits) over columns 8·nb + 2g + c in (nb, c) order,
    each value +0-normalised as the Hopper model writes a zero."""
    lane = Uint32(0)
    for nb in range(8 * block, 8 * block + 8):
        for c in range(2):
            x = lane * Uint32(FOLD_MULTIPLIER) + _u32(acc[(c, h, nb), mm, mn] + Float32(0.0))
            lane = (x << 13) | (x >> 19)
    return lane


class LotteryEpilogueMixin:
    """epi_visit_acc: the lottery of every whole 4×64 tile of the CTA tile (expert-local rows)."""

    store_tickets = False  # checks only: every live tile's ticket into `lottery_tickets`

    @cute.jit
    def epi_visit_acc(self, params, acc: cute.Tensor, tiled_mma, tile_coord_mnkl, tidx: Int32) -> None:
        tile_m, tile_n = self.cta_tile_shape_mnk[0], self.cta_tile_shape_mnk[1]
        ident = tiled_mma.get_slice(tidx).partition_C(cute.make_identity_tensor((tile_m, tile_n)))
        fragment_cols = cute.size(acc, mode=[0, 2])
        blocks = const_expr(fragment_cols // 8)
        slots = const_expr(2 * cute.size(acc, mode=[1]) * cute.size(acc, mode=[2]) * blocks)
        expert = tile_coord_mnkl[3]
        start = params.lottery_bounds[expert]
        rows = params.lottery_bounds[expert + 1] - start
        lane_id = tidx % 32
        j = lane_id % 16
        half = lane_id - j
        message = [Uint32(0)] * 16
        tile_row, col_tile, live = Int32(0), Int32(0), lane_id < 0
        s = 0
        for mm in cutlass.range_constexpr(cute.size(acc, mode=[1])):
            for mn in cutlass.range_constexpr(cute.size(acc, mode=[2])):
                for h in cutlass.range_constexpr(2):
                    for block in cutlass.range_constexpr(blocks):
                        lane = _fold(acc, h, mm, mn, block)
                        mine = j == s
                        for w in cutlass.range_constexpr(16):
                            word = cute.arch.shuffle_sync(lane, half + w)
                            message[w] = cutlass.select_(mine, word, message[w])
                        m, n = ident[(0, h, 8 * block), mm, mn]
                        row = tile_coord_mnkl[0] * tile_m + m  # this half-warp's rows: 4t .. 4t + 3
                        t = row // 4
                        tile_row = cutlass.select_(mine, t, tile_row)
                        col_tile = cutlass.select_(mine, (tile_coord_mnkl[1] * tile_n + n) // _BLOCK_COLS, col_tile)
                        live = cutlass.select_(mine, 4 * t + 3 < rows, live)
                        s += 1
        if j < slots:
            key = [Uint32(params.lottery_key[i]) for i in range(8)]
            ticket = compress(key, message)
            if const_expr(self.store_tickets):
                if live:
                    for i in cutlass.range_constexpr(8):
                        params.lottery_tickets[start + 4 * tile_row, col_tile, i] = Int32(ticket[i])
            if live & _at_most(ticket, params.lottery_threshold):
                _latch(params, tile_row, col_tile, expert, ticket)


@cute.jit
def _latch(params, tile_row: Int32, col_tile: Int32, expert: Int32, ticket: list) -> None:
    """The first winner takes the lock and writes the record; STATUS last, with release."""
    record = params.lottery_record
    if cute.arch.atomic_cas(params.lottery_lock.iterator, cmp=Int32(0), val=Int32(1)) == 0:
        for i in cutlass.range_constexpr(1, 16):
            record[i] = params.lottery_header[i]
        record[MAGIC_AT] = Int32(MAGIC[0])
        record[MAGIC_AT + 1] = Int32(MAGIC[1])
        record[TILE_ROW] = tile_row
        record[TILE_COLUMN] = col_tile
        record[GROUP_ID] = expert
        for i in cutlass.range_constexpr(8):
            record[TICKET + i] = Int32(ticket[i])
            record[TARGET + i] = params.lottery_threshold[i]
            record[HASH_A + i] = params.lottery_key[i]
            record[HASH_B + i] = params.lottery_seed_b[i]
        params.lottery_fresh[0] = Int32(1)
        cute.arch.atomic_exch(record.iterator, Int32(1), sem="release", scope="gpu")


_LOTTERY_FIELDS = ("lottery_bounds", "lottery_key", "lottery_threshold", "lottery_seed_b", "lottery_header",
                   "lottery_lock", "lottery_record", "lottery_fresh", "lottery_tickets")


@mlir_namedtuple
class LotteryEpilogueArguments(NamedTuple):
    """quack's default epilogue arguments (all unused here) and the lottery's device buffers."""

    alpha: Optional[Float32 | cute.Tensor] = None
    beta: Optional[Float32 | cute.Tensor] = None
    mRowVecBroadcast: Optional[cute.Tensor] = None
    mColVecBroadcast: Optional[cute.Tensor] = None
    add_to_output: cutlass.Constexpr[bool] = False
    rounding_mode: cutlass.Constexpr[int] = 0
    sr_seed: Optional[Int32 | cute.Tensor] = None
    split_k_semaphore: Optional[cute.Tensor] = None
    split_k_workspace: Optional[cute.Tensor] = None
    mSFD: Optional[cute.Tensor] = None
    sfd_norm_const: Optional[Float32 | cute.Tensor] = None
    mSFDCol: Optional[cute.Tensor] = None
    lottery_bounds: Optional[cute.Tensor] = None
    lottery_key: Optional[cute.Tensor] = None
    lottery_threshold: Optional[cute.Tensor] = None
    lottery_seed_b: Optional[cute.Tensor] = None
    lottery_header: Optional[cute.Tensor] = None
    lottery_lock: Optional[cute.Tensor] = None
    lottery_record: Optional[cute.Tensor] = None
    lottery_fresh: Optional[cute.Tensor] = None
    lottery_tickets: Optional[cute.Tensor] = None


class Fp32LotterySm90(LotteryEpilogueMixin, GroupedGemmFp32AccSm90):
    """The raw fp32 accumulator out (as GroupedGemmFp32AccSm90) with the lottery in the epilogue."""

    EpilogueArguments = LotteryEpilogueArguments
    _extra_param_fields = GemmDefaultEpiMixin._extra_param_fields + tuple(
        (name, Optional[cute.Tensor], None) for name in _LOTTERY_FIELDS)

    def epi_to_underlying_arguments(self, args, *, loc=None, ip=None):
        self.rounding_mode = args.rounding_mode
        d = self._epi_ops_to_params_dict(args)
        d["split_k_semaphore"] = d["split_k_workspace"] = None
        d.update({name: getattr(args, name) for name in _LOTTERY_FIELDS})
        return self.EpilogueParams(**d)


class Fp32LotteryTicketsSm90(Fp32LotterySm90):
    """The same, also writing every live tile's ticket (GPU checks against lottery.py)."""

    store_tickets = True


def fits(config: GroupedGemmConfig, n: int) -> bool:
    """Whether the fused lottery supports this config at this N (else the lottery pass runs):
    whole 64-column blocks in each warpgroup's columns, no tile past n_e, ≤ 4 tiles a half-warp."""
    warpgroup_cols = config.tile_n // (2 if config.tile_m == 192 and config.tile_n > 128 else 1)
    if config.tile_m == 192 or warpgroup_cols % _BLOCK_COLS or n % config.tile_n:
        return False
    row_halves = 2 * (config.tile_m // 64 if config.pingpong else 1)
    return row_halves * warpgroup_cols // _BLOCK_COLS <= _MAX_TILES_PER_HALF_WARP


def lottery_config(rows: int, b: torch.Tensor) -> GroupedGemmConfig:
    """The config a launch of `rows` A rows against b (e, n, k) runs (the selector's)."""
    experts, n, k = b.shape
    return select_config(Precision.FP8, rows, experts, n, k)


def _fake_epilogue(tickets: bool, m, n, num_experts) -> LotteryEpilogueArguments:
    def words(count):
        return make_fake_tensor(Int32, (count,), leading_dim=0)
    return LotteryEpilogueArguments(
        lottery_bounds=words(cute.sym_int()), lottery_key=words(8), lottery_threshold=words(8), lottery_seed_b=words(8),
        lottery_header=words(16), lottery_lock=words(1), lottery_record=words(64), lottery_fresh=words(1),
        lottery_tickets=make_fake_tensor(Int32, (m, cute.sym_int(), 8), leading_dim=2)
        if tickets else None)


@functools.lru_cache(maxsize=None)
def compile_lottery_gemm(config: GroupedGemmConfig, tickets: bool = False) -> Callable:
    """The fp8 → raw fp32 grouped GEMM with the lottery epilogue, for sm_90a (fake tensors)."""
    cls = Fp32LotteryTicketsSm90 if tickets else Fp32LotterySm90
    return compile_variant(cls, Precision.FP8, Output.FP32, config, functools.partial(_fake_epilogue, tickets))


def mined_grouped_gemm(a: torch.Tensor, b: torch.Tensor, bounds: torch.Tensor, out: torch.Tensor,
                       lottery: LotteryBuffers, config: GroupedGemmConfig | None = None,
                       tickets: torch.Tensor | None = None) -> torch.Tensor:
    """out = the raw window-promoted fp32 accumulator (as `grouped_gemm` without scales), with every
    whole 4×64 tile's ticket drawn in the epilogue and the first winner latched into `lottery`.

    a (rows, k) e4m3 in expert order, b (e, n, k) e4m3, bounds (e+1,) int32 row offsets.
    config: one that `fits` (default: `lottery_config`, which the caller checked with `fits`).
    tickets: for checks, int32 (rows, n/64, 8) receiving tile (t, c) of expert w's ticket at
    [bounds[w] + 4t, c].
    """
    experts, n, k = b.shape
    config = config or lottery_config(a.shape[0], b)
    if not fits(config, n):
        raise ValueError(f"config {config.key} does not fit the fused lottery at n = {n}")
    fn = compile_lottery_gemm(config, tickets is not None)
    epi = LotteryEpilogueArguments(
        add_to_output=None, rounding_mode=None,  # compile-time fields travel as None
        lottery_bounds=bounds, lottery_key=lottery.key, lottery_threshold=lottery.threshold,
        lottery_seed_b=lottery.seed_b, lottery_header=lottery.header, lottery_lock=lottery.lock,
        lottery_record=lottery.record, lottery_fresh=lottery.fresh, lottery_tickets=tickets)
    launch_variant(fn, a, b, bounds, out, config, epi)
    return out
