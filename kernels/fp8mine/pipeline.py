"""The mined FP8 V4 layer GEMM on Hopper: B side per job, A side per launch, the mined pass.

- `BSide` pre-quantizes the weights once (the planes depend on the weights only) and prepares a
  `BState` per chosen ancestor σ_d: keyB, the plane trees and HB, seedB, F_A, F_B, E_B, B′ and the
  B peel. On CUDA this runs on a side stream into the inactive one of two slots (double-buffered);
  the active state is reused while its σ_d is among the template's 4 most recent ancestors (the
  state window) and the parent's state is prefetched before it leaves.
- `prepare_a` is the per-launch A side after the rows' pre-quantization: HA, (HR, HO), seedA,
  noise and jackpot keys, E_A and A′ (a same-launch MoE pass: written straight into expert
  order) — device tensors only, no host syncs.
- `MinedGemm.forward` runs the routing table (side stream) beside the rows kernel → A side → A
  peel → grouped FP8 GEMM (128-k promotion; the CuTe GEMM folds the lottery tiles in its
  epilogue where its config allows) → the lottery (first winner into the latch; on the side
  stream beside the peel pass) → peel + unscale into the BF16 output, rows in expert order.
  Dense V4 is one group.
- `MinedGemm(lagged=True)` (decode): launch t serves x_t with clean rows and hashes launch t−1's
  A′ rows in the same GEMM; the A side runs on a side stream beside the GEMM, and the lottery,
  payload and publish of those rows run there one launch later (lagged.py, docs/kernels-fp8mine.md).
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import torch

from proof.fp8.params import STATE_WINDOW_DEPTH, JobParams, make_job

from . import noise, prequant, quant, transcript
from .hashing import constant_bytes
from .lagged import LagSlot, MinedSlot, Operand, clean_peel, lagged_front
from .lottery import LotteryLatch, threshold_words
from .matmul import fold_fits, fold_in_gemm, folded_lanes, gather_in_gemm, grouped_matmul, peel_in_gemm
from .peel import (TAIL_BYTES, TilePoll, a_peel, b_peel, padded_rows, peel_and_unscale, peel_tiles, reads_tiles,
                   transposed_codes, write_tails)
from .routing import RoutingTable, RowTiles, dense_table, routing_table, row_tiles


# The lagged pass's GEMM runs on every SM and shares each with the side stream
# (`grouped_gemm(side_smem=)`: 128 registers a thread at launch, this much shared memory left to
# side kernels; every side kernel fits in 32K registers). H200, GLM-5 decode: 238.6 µs a pass at
# 64 KiB (48 KiB 239.0, 96 KiB 260.4: the GEMM loses stages) vs 253.3 with 16 whole SMs left.
LAGGED_SIDE_SMEM = 64 * 1024
LAGGED_SIDE_SMS = 16  # LAGGED_SIDE_SMEM = 0: whole SMs the persistent GEMM leaves to the side stream
# Where a lagged launch draws the tickets of the rows the previous launch's GEMM hashed (MINED):
# True: at its start, beside the front (which the lottery's kernels then slow: 9.7 against 7.3 µs
# in an H200 timeline); False: under the GEMM after the clean A peel, on the SMs the A side
# already shares. H200, session 25, same runs: GLM-5 FC1 decode 218.3 / 217.9 against 219.9 /
# 219.2 µs, DeepSeek-V3 255.6 / 256.5 against 258.0 / 256.0 (H100s: within 0.5 µs either way).
LAGGED_LOTTERY_FIRST = False
# The lagged GEMM folds its READY rows' lottery tiles in its epilogue (64 bytes a 4×64 tile,
# straight into their compact layout) and stores a bf16 accumulator, which only the clean rows'
# peel reads; MINED's take then copies those lanes, not the READY rows' fp32 accumulator, and the
# next launch's lottery reads them (`run_folded`). False keeps the fp32 accumulator and its row
# copy (timed against it in session 22; gpu_check times LAGGED_COMPACT_ACC's two forms instead).
LAGGED_FOLD = True
# That folding GEMM stores only the clean rows' bf16 accumulator, compact (where the serving peel
# reads them without a row shift), from registers: READY rows are folded and never stored, and the
# GEMM has no D. H100, session 29, the GEMM alone: 272.9 against 275.3 µs with the bf16 D of all 2R
# rows (GLM-5 decode), 314.5 against 316.4 (DeepSeek-V3); the served outputs bitwise equal. False:
# the whole tiles' bf16 accumulator through TMA (gpu_check times both).
LAGGED_COMPACT_ACC = True
# That folding GEMM takes its tiles from a counter (quack's dynamic persistent scheduler; the front
# zeroes `Operand.tile_counter`) instead of a fixed share a CTA: the CTAs whose SMs the side
# stream's kernels share run slower and take fewer tiles, rather than the whole GEMM waiting for
# their last one. False: the static schedule.
LAGGED_DYNAMIC = True
# MINED's take of those lanes (and READY's tail) is copied by more programs of the serving peel's
# launch, so nothing on the side stream follows the GEMM and the next launch's front depends on
# the peel alone. False: the take kernel on the side stream after the GEMM.
LAGGED_TAKE_IN_PEEL = True
# The compact-storing GEMM counts each expert's finished tiles and lets the serving peel launch
# from its first tiles on; the peel serves each expert once its count is complete, while the GEMM
# goes on, instead of waiting for the whole GEMM (`peel.TilePoll`). Written in session 30 without
# a device run: off until a GPU test and a same-run timing keep it.
LAGGED_PEEL_POLLS = False
# The same-launch MoE pass writes A′ straight into the GEMM's expert-order rows from the noisy
# codes launch (top_k copies of each token row; `RoutingTable.positions`) instead of token order
# and an index_select after it (194 µs at GLM-5 FC1 prefill on the H100, session 16). False
# keeps the gather (gpu_check times both).
A_IN_EXPERT_ORDER = True


class PipelineError(ValueError):
    """Bad arguments to the mined layer."""


@dataclass
class BState:
    """One job's B side (fixed while σ_d is in the window)."""

    ancestor_header: bytes
    seed_b: torch.Tensor  # (1, 8) int32
    f_a: torch.Tensor  # (k, 32) e4m3
    f_b: torch.Tensor  # (k, 32) e4m3
    f_b_t: torch.Tensor  # (32, k) uint8: F_Bᵀ's codes, K-major (the A peel's e4m3 dot)
    side: quant.NoisySide  # B′ codes (n, k), α/β (n,), E_B
    peel: torch.Tensor  # (n, 64) bf16
    inv_alpha: torch.Tensor  # (n,) fp32 1/α_B, the peel epilogue's column scale (once per job)
    ready: torch.cuda.Event | None = None

    def adopt(self, stream: torch.cuda.Stream) -> None:
        """Make `stream` wait for the preparation and tell the allocator it uses these tensors."""
        if self.ready is None:
            return
        stream.wait_event(self.ready)
        for t in (self.seed_b, self.f_a, self.f_b, self.f_b_t, self.side.codes, self.side.alpha,
                  self.side.beta, self.side.e_lines, self.peel, self.inv_alpha):
            t.record_stream(stream)


class BSide:
    """The weights' committed planes and up to two prepared job states (double-buffered)."""

    def __init__(self, weights: torch.Tensor):
        if weights.dim() != 3 or weights.dtype != torch.bfloat16:
            raise PipelineError(f"weights must be bf16 (e, n_e, k), got {weights.dtype} {tuple(weights.shape)}")
        self.experts, self.n_e, self.k = weights.shape
        self.device = weights.device
        flat = weights.reshape(-1, self.k)
        self.codes, self.scales, self.values = prequant.prequantize_and_open(flat)
        self.l2, self.linf = prequant.row_norms(self.codes, self.scales)
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.slots: list[BState | None] = [None, None]
        self._active = 0

    def p_b(self, ancestor_header: bytes) -> bytes:
        return self.job(ancestor_header, m=1).p_b()

    def job(self, ancestor_header: bytes, m: int) -> JobParams:
        """The job tuple (MoE iff e > 1) for a launch of m rows against these weights."""
        experts = self.experts if self.experts > 1 else 0
        return make_job(ancestor_header, m=m, n=self.experts * self.n_e, k=self.k, experts=experts)

    def select(self, ancestors: list[bytes]) -> tuple[BState, int]:
        """The state to mine with for a template whose ancestors are `ancestors` (parent first),
        and its depth d (σ_d = ancestors[d − 1]).

        The active state is kept while its σ_d is among the 4 most recent ancestors, so B is
        prepared about once every 3 blocks: at depth 4 (its last block) the parent's state is
        prepared in the other slot on the side stream, and the next template switches to it at
        depth 2. Only a first job (or a reorg) waits for a preparation.
        """
        window = [bytes(h) for h in ancestors[:STATE_WINDOW_DEPTH]]
        if not window:
            raise PipelineError("need at least the parent header")
        active = self.slots[self._active]
        if active is not None and active.ancestor_header in window:
            depth = window.index(active.ancestor_header) + 1
            other = self.slots[self._active ^ 1]
            if depth == STATE_WINDOW_DEPTH and (other is None or other.ancestor_header not in window):
                self._prepare_into(self._active ^ 1, window[0])
            return active, depth
        for slot, state in enumerate(self.slots):
            if state is not None and state.ancestor_header in window:
                self._active = slot
                return state, window.index(state.ancestor_header) + 1
        target = self._active ^ 1 if active is not None else self._active  # never the active slot
        self._prepare_into(target, window[0])
        self._active = target
        return self.slots[target], 1

    def _prepare_into(self, slot: int, ancestor_header: bytes) -> None:
        """Build σ_d's state into `slot`, on the side stream when on CUDA (never the active slot
        while it is in use: callers pass the other one)."""
        if self.stream is None:
            self.slots[slot] = self._build(ancestor_header)
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            state = self._build(ancestor_header)
            state.ready = torch.cuda.Event()
            state.ready.record(self.stream)
        self.slots[slot] = state

    def _build(self, ancestor_header: bytes) -> BState:
        header = constant_bytes(bytes(ancestor_header), self.device)
        key_b = transcript.key_b(header)
        hash_b = transcript.operand_digest(key_b, self.codes, self.scales)
        seed_b = transcript.seed_b(hash_b, key_b, self.p_b(ancestor_header))
        line_key = transcript.noise_key(seed_b)
        f_a = noise.noise_lines(line_key, "A", "F", self.k)
        f_b = noise.noise_lines(line_key, "B", "F", self.k)
        e_b = noise.noise_lines(line_key, "B", "E", self.codes.shape[0])
        # each B′ row carries its B peel row after it (16 MB at GLM-5 FC1), for the GEMM that
        # peels in its epilogue (peel_epilogue): B′ is then never copied
        side, noise_b = quant.noisy_quantize(self.values, self.l2, self.linf, e_b, f_b, tail=TAIL_BYTES)
        peel = b_peel(side, noise_b, f_a)
        _, inv_alpha = write_tails(side, peel)
        return BState(bytes(ancestor_header), seed_b, f_a, f_b, transposed_codes(f_b), side, peel,
                      inv_alpha)


@dataclass
class ASide:
    """One launch's A side (rows in token order)."""

    codes: torch.Tensor  # int8 (m, k) plane
    scales: torch.Tensor  # bf16 (m, k/8) plane
    keys: torch.Tensor  # (4, 8) int32: HA, seedA, noise-line key, jackpot key
    side: quant.NoisySide

    @property
    def seed_a(self) -> torch.Tensor:
        return self.keys[1:2]

    @property
    def pow_key(self) -> torch.Tensor:
        return self.keys[3:4]


def prepare_a(rows: quant.Rows, seed_message: torch.Tensor, p_a_len: int, state: BState,
              table: RoutingTable | None, in_expert_order: bool = False, tail: int = 0) -> ASide:
    """HA (+ HR, HO), seedA, the keys, E_A and A′ from the pre-quantized rows
    (`quant.prepare_rows(x)`), on their device. The A peel is the caller's
    (`peel.a_peel(a.side, state.f_b, state.f_b_t)`): only a same-launch pass peels these
    rows.

    seed_message: the job's `transcript.seed_a_message` (keyA inside; its head is written here).
    in_expert_order (MoE): A′ is written straight into the GEMM's expert-order rows (top_k copies
    of each token, `NoisySide.positions`) instead of token order and a gather after.
    tail: A′'s rows lie k + tail bytes apart (room for each row's peel row: `peel.write_tails`).
    """
    key_a = transcript.key_a_of(seed_message)
    planes = [rows.codes, rows.scales] + ([table.rflat, table.offsets] if table is not None else [])
    roots = transcript.plane_roots(key_a, planes)
    routing = (roots[2], roots[3]) if table is not None else None
    keys, e_a = transcript.launch_keys_and_noise(seed_message, p_a_len, (roots[0], roots[1]), routing,
                                                 rows.codes.shape[0])
    positions = table.positions if in_expert_order and table is not None else None
    if in_expert_order and positions is None:
        raise PipelineError("A′ in expert order needs a routing table with positions")
    side = quant.noisy_side(rows, e_a, state.f_a, positions, tail)
    return ASide(rows.codes, rows.scales, keys, side)


@dataclass
class LaunchResult:
    """What one mined pass produced (device tensors; `out` rows are in expert order).

    `acc` is the pre-peel accumulator: fp32, or rounded to bf16 where the GEMM folded the
    lottery (`matmul.BF16_FOLDED_ACC`; the lottery drew from the fp32 values, only the peel
    read it); None where the GEMM peeled in its epilogue (`matmul.peel_in_gemm`: none is stored).

    Lagged passes: `acc` is the combined accumulator and `operand_bounds` its bounds (e+1,):
    expert w's rows start with the READY (previous launch's) rows, then this launch's clean rows;
    where the GEMM stores compact (`MinedGemm.compact_acc`), only the clean rows, in `table`'s order.
    `a` is this launch's A side (mined by the next launch)."""

    out: torch.Tensor
    acc: torch.Tensor | None
    table: RoutingTable
    a: ASide
    operand_bounds: torch.Tensor | None = None


class MinedGemm:
    """The mined first expert GEMM of one layer (or a dense layer with e = 1).

    Per job: `set_job(header76, ancestors, target)` (host; picks/prepares the B state and writes
    the launch constants into fixed buffers, so a captured graph replays with new jobs). Per launch:
    `forward(x, topk_ids)`; winners appear in `latch` (poll after the launch's stream work).

    lagged: launch t's GEMM hashes launch t−1's rows and launch t + 1 runs their lottery, so a
    winner on x_t's rows is published by launch t + 2 (the first two launches after `set_job`
    publish nothing); its record and payload describe those rows.
    """

    def __init__(self, weights: torch.Tensor, *, m: int, top_k: int = 1, layer_id: int = 0,
                 lagged: bool = False):
        self.b = BSide(weights)
        self.m, self.top_k, self.layer_id = m, top_k, layer_id
        self.moe = self.b.experts > 1
        rows = m * top_k if self.moe else m
        k = self.b.k
        self.latch = LotteryLatch(self.b.device, {
            "codes": ((m, k), torch.int8), "scales": ((m, k // 8), torch.bfloat16),
            "rflat": ((rows,), torch.int32), "offsets": ((self.b.experts,), torch.int32)})
        self.seed_message = torch.zeros((1, transcript.seed_a_message_words(self.moe)), dtype=torch.int32,
                                        device=self.b.device)
        self.p_a_len = 0
        self.threshold = torch.zeros(8, dtype=torch.int32, device=self.b.device)
        self.state: BState | None = None
        self.job: JobParams | None = None
        self.header76 = b""
        self.ancestor_chain: list[bytes] = []
        self.lagged = lagged
        cuda = self.b.device.type == "cuda"
        # high priority: the side work's blocks are placed first wherever an SM has room
        self.side = torch.cuda.Stream(self.b.device, priority=-1) if cuda else None
        if lagged:
            # READY keeps only the tail (planes, routing, key): the operand reads PENDING's A′ rows
            self.ready = LagSlot.allocate(m, rows, k, self.b.experts, self.b.device, with_rows=False)
            self.pending = LagSlot.allocate(m, rows, k, self.b.experts, self.b.device)
            fold = LAGGED_FOLD and fold_fits(2 * rows, (self.b.experts, self.b.n_e, k), self.b.device)
            self.ready_lanes = folded_lanes(rows, self.b.n_e, self.b.device) if fold else None
            self.mined = MinedSlot.allocate(m, rows, self.b.n_e, k, self.b.experts, self.b.device, folded=fold)
            self.compact_acc = LAGGED_COMPACT_ACC and fold  # read once: the peel must read what the GEMM stored
            self.poll_tiles = self._poll_tiles(2 * rows, k) if self.compact_acc and LAGGED_PEEL_POLLS else None
            self.gemm_sms = (torch.cuda.get_device_properties(self.b.device).multi_processor_count
                             - LAGGED_SIDE_SMS) if cuda and not LAGGED_SIDE_SMEM else None

    def _poll_tiles(self, rows: int, k: int) -> tuple[int, int] | None:
        """(tile_m, tile_n) of the lagged GEMM over `rows` combined rows where it can count its
        finished tiles for a polling peel (`LAGGED_PEEL_POLLS`), else None."""
        from .fold_epilogue import launch_config, signals
        config = launch_config(rows, (self.b.experts, self.b.n_e, k), LAGGED_SIDE_SMEM)
        return (config.tile_m, config.tile_n) if signals(config) else None

    def set_job(self, header76: bytes, ancestors: list[bytes], target: int) -> None:
        """Adopt a new template: σ̂, its ancestors (parent first) and the target."""
        if len(header76) != 76:
            raise PipelineError(f"the proposed header must be 76 bytes, got {len(header76)}")
        state, depth = self.b.select(ancestors)
        if self.b.stream is not None:
            state.adopt(torch.cuda.current_stream(self.b.device))
        self.state, self.job = state, self.b.job(state.ancestor_header, self.m)
        self.header76, self.ancestor_chain = bytes(header76), [bytes(h) for h in ancestors[:depth - 1]]
        key_a = transcript.key_a(constant_bytes(self.header76, self.b.device))
        p_a = self.job.p_a()
        self.seed_message.copy_(transcript.seed_a_message(state.seed_b, key_a, p_a, self.moe))
        self.p_a_len = len(p_a)
        self.threshold.copy_(threshold_words(target, self.b.k, self.b.device))
        self.latch.set_header(self.m, self.b.experts * self.b.n_e, self.b.k, self.layer_id,
                              self.m * self.b.k, self.m * self.b.k // 4)
        if self.lagged:  # their keys belong to the old header: a winner on them would be stale
            self.ready.invalidate()
            self.pending.invalidate()
            self.mined.invalidate()

    def forward(self, x: torch.Tensor, topk_ids: torch.Tensor | None = None) -> LaunchResult:
        """One mined pass over x (m, k) bf16 (MoE: with topk_ids (m, top_k))."""
        if self.state is None or self.job is None:
            raise PipelineError("set_job must be called before forward")
        if x.shape != (self.m, self.b.k) or x.dtype != torch.bfloat16:
            raise PipelineError(f"x must be bf16 ({self.m}, {self.b.k}), got {x.dtype} {tuple(x.shape)}")
        if self.moe and (topk_ids is None or topk_ids.shape != (self.m, self.top_k)):
            raise PipelineError(f"MoE launches need topk_ids ({self.m}, {self.top_k})")
        if self.lagged:
            return self._forward_lagged(x, topk_ids)
        state, main = self.state, self._main()
        self._fork(main)
        # The routing table beside the rows kernel (the plane trees read both). Its tensors come
        # from the side stream's pool and are used on the serving stream: safe because every side
        # stream allocation follows a fork from the serving stream (no record_stream, which is
        # fragile inside graph capture).
        with self._on_side():
            table = self._table(topk_ids, x.device)
            tiles = row_tiles(table)  # the lottery's tile map, off the pass's tail
            table_ready = self._event()
        pre = quant.prepare_rows(x)
        self._wait(main, table_ready)
        b_codes, n_rows = self.b_codes(), table.rflat.shape[0]
        # the GEMM peels in its epilogue where it reads A′'s rows with their tails: MoE token rows
        # gathered through Rflat (`gather_in_gemm`), else in expert order or dense by TMA (B′
        # rows always carry their tails: BSide._build)
        gather = self.moe and gather_in_gemm(n_rows, b_codes)
        peeling = peel_in_gemm(n_rows, b_codes) and (not self.moe or gather or A_IN_EXPERT_ORDER)
        a = prepare_a(pre, self.seed_message, self.p_a_len, state, table if self.moe else None,
                      in_expert_order=self.moe and not gather and A_IN_EXPERT_ORDER, tail=TAIL_BYTES if peeling else 0)
        # on the serving stream: a side-stream A peel found no SM free before the persistent GEMM
        # ended, and the peel then waited for it (H100 timeline, session 17)
        peel_rows = a_peel(a.side, state.f_b, state.f_b_t)
        rows = a.side.codes if gather else self.expert_rows(a.side, table)
        sources = {"codes": a.codes, "scales": a.scales, "rflat": table.rflat, "offsets": table.offsets}
        if fold_in_gemm(n_rows, b_codes):
            lanes = folded_lanes(n_rows, b_codes.shape[1], rows.device)
            if peeling:  # no raw accumulator: the output comes peeled
                out = self._peeled(*write_tails(a.side, peel_rows, table if gather else None), table, lanes, gather)
                self.latch.run_folded(lanes, tiles, a.pow_key, self.threshold, state.seed_b, sources)
                self.latch.publish()
                self._join(main)
                return LaunchResult(out, None, table, a)
            acc = grouped_matmul(rows, b_codes, table, fold_into=lanes)
            draw = functools.partial(self.latch.run_folded, lanes)
        else:
            acc = grouped_matmul(rows, b_codes, table)
            draw = functools.partial(self.latch.run, acc)
        self._fork(main)
        with self._on_side():  # the tickets (ALU-bound) beside the peel (DRAM-bound)
            draw(tiles, a.pow_key, self.threshold, state.seed_b, sources)
            self.latch.publish()
        out = peel_and_unscale(acc, peel_rows, a.side.alpha, state.peel.view(self.b.experts, self.b.n_e, -1),
                               state.side.alpha.view(self.b.experts, self.b.n_e), table)
        self._join(main)
        return LaunchResult(out, acc, table, a)

    def _peeled(self, padded_a: torch.Tensor, inv_alpha_rows: torch.Tensor, table: RoutingTable,
                lanes: torch.Tensor, gather: bool = False) -> torch.Tensor:
        """The GEMM with the fold, peel and unscale in its epilogue: the bf16 output. padded_a:
        A′'s expert-order rows (gather: its token rows, read through Rflat), each followed by its
        A peel row, and the 1/α_A of each GEMM row, in expert order (`peel.write_tails`)."""
        from .peel_epilogue import peeled_grouped_gemm
        assert self.state is not None
        experts, n_e, k = self.b.experts, self.b.n_e, self.b.k
        padded_b = padded_rows(self.state.side.codes).view(experts, n_e, k + TAIL_BYTES)
        out = torch.empty((table.rflat.shape[0], n_e), dtype=torch.bfloat16, device=padded_a.device)
        return peeled_grouped_gemm(padded_a.view(torch.float8_e4m3fn), padded_b.view(torch.float8_e4m3fn),
                                   table.bounds, out, lanes, inv_alpha_rows, self.state.inv_alpha.view(experts, n_e),
                                   a_idx=table.rflat if gather else None)

    def _table(self, topk_ids: torch.Tensor | None, device: torch.device) -> RoutingTable:
        return routing_table(topk_ids, self.b.experts) if self.moe else dense_table(self.m, device)

    def _forward_lagged(self, x: torch.Tensor, topk_ids: torch.Tensor | None) -> LaunchResult:
        """Launch t: serve x_t, mine launch t−1's rows (still in PENDING), prepare x_t's (PENDING).

        main: ONE launch before the GEMM (`lagged_front`: routing, x_t's clean quantization and the
        combined operand = per expert [PENDING's A′ rows ; clean rows]) → GEMM → peel of the
        clean rows. side: READY's tail ← PENDING's (planes, routing, key: what MINED's take and
        the peel's row shift read after PENDING is refilled; the A′ rows are not copied); after
        the front (which read PENDING) the clean rows' A peel, the lottery, payload and publish of
        MINED (the rows launch t−1's GEMM hashed; beside the front instead where
        `LAGGED_LOTTERY_FIRST`) and x_t's A side into PENDING while the GEMM runs; after the
        GEMM, MINED ← the READY rows' folded lanes and READY's tail, copied by more programs of
        the serving peel's launch (which starts while the GEMM drains), so the side stream joins
        before the peel and the next launch's front waits for the peel alone. Where the GEMM does
        not fold (or the peel walks row tiles), MINED ← the READY rows' accumulator rows and
        READY's tail on the side stream, issued after the peel so that the peel is not launched
        behind it. The serving stream waits for nothing before the GEMM; the side stream forks
        from and joins it, so one launch is one self-contained (graph-capturable) piece of stream
        work.
        """
        assert self.state is not None
        state, ready, pending, mined = self.state, self.ready, self.pending, self.mined
        main = self._main()
        self._fork(main)
        with self._on_side():
            ready.tail().copy_(pending.tail())
            if LAGGED_LOTTERY_FIRST:
                self._mine_previous()
        operand = lagged_front(x, topk_ids if self.moe else None, self.b.experts, pending)
        table = operand.clean_table
        decode_peel = not reads_tiles(table)  # the peel by expert (else by row tiles)
        take_in_peel = LAGGED_TAKE_IN_PEEL and self.ready_lanes is not None and decode_peel
        self._fork(main)
        with self._on_side():
            clean_tiles = None if decode_peel else peel_tiles(table)
            a_peel_clean = clean_peel(operand, state.f_b, state.f_b_t)
            peel_ready = None if take_in_peel else self._event()
            if not LAGGED_LOTTERY_FIRST:
                self._mine_previous()
            a = prepare_a(quant.prepare_rows(x), self.seed_message, self.p_a_len, state, table if self.moe else None)
            pending.fill(a.side.codes, a.codes, a.scales, a.pow_key, table)
        acc = self._combined_gemm(operand)
        polls = self.poll_tiles is not None and decode_peel  # a row-tile peel waits for the whole GEMM
        poll = TilePoll(operand.expert_done, operand.table.bounds, *self.poll_tiles) if polls else None
        peel_args = (acc, a_peel_clean, operand.clean_alpha, table, clean_tiles, poll)
        if take_in_peel:
            self._join(main)  # the side stream's work ends with PENDING's fill, long before the GEMM's end
            out = self._serving_peel(*peel_args, copies=mined.folded_copies(self.ready_lanes, ready))
        else:
            gemm_done = self._event(main)
            self._wait(main, peel_ready)
            out = self._serving_peel(*peel_args)
            self._wait(self.side, gemm_done)
            with self._on_side():
                mined.take(acc if self.ready_lanes is None else self.ready_lanes, ready, table.bounds)
            self._join(main)
        return LaunchResult(out, acc, table, a, operand.table.bounds)

    def _serving_peel(self, acc: torch.Tensor, a_peel_clean: torch.Tensor, alpha: torch.Tensor, table: RoutingTable,
                      tiles: RowTiles | None, poll: TilePoll | None, copies: tuple = ()) -> torch.Tensor:
        """The serving peel of a lagged launch's clean rows (compact, or shifted by READY's row
        counts in the combined accumulator), the GEMM's programmatic dependent, also copying
        `copies` (MINED's folded take); poll: serving each expert as the GEMM finishes it."""
        state = self.state
        return peel_and_unscale(acc, a_peel_clean, alpha, state.peel.view(self.b.experts, self.b.n_e, -1),
                                state.side.alpha.view(self.b.experts, self.b.n_e), table,
                                row_shift=None if self.compact_acc else self.ready.bounds[1:], tiles=tiles,
                                a_left_zero=True, after_gemm=True, copies=copies, poll=poll)

    def _combined_gemm(self, operand: Operand) -> torch.Tensor:
        """The lagged GEMM over the combined operand, sharing its SMs with the side stream;
        where it folds (`ready_lanes`), the READY rows' tiles by the front's snapshot of their
        bounds (their lanes' compact layout), its tiles taken from the front's zeroed counter
        (LAGGED_DYNAMIC). The counter is good for one launch: the GEMM leaves it at its tile
        count, so running this again on the same operand needs `operand.tile_counter.zero_()`
        first (else tiles are skipped)."""
        folds = self.ready_lanes is not None
        return grouped_matmul(operand.rows, self.b_codes(), operand.table, max_sms=self.gemm_sms,
                              side_smem=LAGGED_SIDE_SMEM, fold_into=self.ready_lanes,
                              fold_bounds=operand.ready_bounds if folds else None,
                              tile_counter=operand.tile_counter if folds and LAGGED_DYNAMIC else None,
                              compact=operand.clean_table if self.compact_acc else None,
                              expert_done=None if self.poll_tiles is None else operand.expert_done)

    def _mine_previous(self) -> None:
        """The lottery, payload and publish of MINED (the rows the previous launch's GEMM hashed)."""
        assert self.state is not None
        mined = self.mined
        draw = self.latch.run_folded if mined.folded else self.latch.run
        draw(mined.acc, row_tiles(mined.slot.table()), mined.slot.pow_key, self.threshold, self.state.seed_b,
             mined.slot.sources())
        self.latch.publish()

    def _event(self, stream: torch.cuda.Stream | None = None) -> torch.cuda.Event | None:
        """An event recorded now on `stream`, by default the side stream (None on the CPU)."""
        if self.side is None:
            return None
        event = torch.cuda.Event()
        event.record(stream if stream is not None else self.side)
        return event

    def _main(self) -> torch.cuda.Stream | None:
        """The serving stream (the caller's current one; None on the CPU)."""
        return torch.cuda.current_stream(self.b.device) if self.side is not None else None

    def _wait(self, stream: torch.cuda.Stream | None, event: torch.cuda.Event | None) -> None:
        """`stream` waits for an event recorded on the other one (nothing on the CPU)."""
        if stream is not None and event is not None:
            stream.wait_event(event)

    def _fork(self, main: torch.cuda.Stream | None) -> None:
        """The side stream waits for the serving stream's work so far."""
        if main is not None:
            self.side.wait_stream(main)

    def _join(self, main: torch.cuda.Stream | None) -> None:
        """The serving stream waits for the side stream's work so far."""
        if main is not None:
            main.wait_stream(self.side)

    def _on_side(self):
        """Work issued inside goes to the side stream (on the CPU: in order, no streams)."""
        return torch.cuda.stream(self.side) if self.side is not None else contextlib.nullcontext()

    def expert_rows(self, side: quant.NoisySide, table: RoutingTable) -> torch.Tensor:
        """A′ rows in expert order (Rflat) as the GEMM's left operand: the codes themselves where
        they were written in that order (or dense), else gathered."""
        if not self.moe or side.positions is not None:
            return side.codes
        return side.codes.view(torch.uint8).index_select(0, table.rflat).view(torch.float8_e4m3fn)

    def b_codes(self) -> torch.Tensor:
        """The active state's B′ codes as (e, n_e, k)."""
        assert self.state is not None
        return self.state.side.codes.view(self.b.experts, self.b.n_e, self.b.k)
