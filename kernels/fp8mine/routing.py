"""The MoE routing table on the device (§13): Rflat, the end offsets O, and the lottery row tiles.

Rflat lists, expert by expert, the tokens routed to it (a stable sort of the flattened top-k ids,
so each list ascends); O[w] is the cumulative end offset of expert w. Both are u32 LE when hashed.
The lottery lattice is expert-local: an expert with c rows has c // 4 row tiles, rows 4t..4t+3 of
its list; a trailing partial tile is never mined. Everything is computed with static shapes, so
nothing syncs: the tile map (one small Triton kernel) has a fixed upper bound of entries and marks
unused ones with −1 (each slot finds its expert from a scan of the tile counts: no serial loop).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.triton_jit import jit

_MAP_BLOCK = 256
_MAP_CELLS = 4096  # (slot, expert) cells a tile-map program compares
SMALL_ROUTING = 4096  # most routing entries (m · top_k) ranked by the one-launch table; more by the chunked sort
_ONE_HOT_CELLS = 16384  # (entries × experts) one-hot cells per step of the one-launch table
_ONE_PROGRAM_STEPS = 8  # most steps of the one-launch table's count loop (else the chunked sort)
RANK_WARPS = 16  # 32 one-hot cells a thread
RANK_SLICE = 64  # entries ranked per program of the small table (GLM-5 decode: 512 entries, 8 programs)
_COUNT_CHUNK = 128  # entries per program of the chunked counting sort
_COUNT_EXPERTS = 32  # experts per step of the chunk counts and per program of the prefixes
_SCAN_CELLS = 4096  # (chunk, expert) counts per step of a prefix program


class RoutingError(ValueError):
    """Bad routing input."""


@dataclass
class RoutingTable:
    """Rflat (m·top_k,) int32 token ids in expert order and bounds (e + 1,) int32: 0 then the
    cumulative ends. `offsets` (e,) — Pearl's O, the hashed and proven form — is a view of bounds
    without its leading 0; grouped GEMMs take `bounds` (so neither form costs a launch).
    `positions` (m·top_k,) int32, where the router's tables have it: entry t·top_k + j's row in
    Rflat, so a kernel can write token t's row straight to its top_k expert-order rows."""

    rflat: torch.Tensor
    bounds: torch.Tensor
    positions: torch.Tensor | None = None

    @property
    def offsets(self) -> torch.Tensor:
        return self.bounds[1:]

    @property
    def experts(self) -> int:
        return self.bounds.shape[0] - 1

    def starts(self) -> torch.Tensor:
        """First position of each expert's rows in Rflat, (e,) int64."""
        return self.bounds[:-1].to(torch.int64)


def routing_table(topk_ids: torch.Tensor, experts: int) -> RoutingTable:
    """From router top-k ids (m, top_k) — clamped to [0, e) — to (Rflat, O), without host syncs.

    Decode-sized launches (`one_program_shape`) build the table in one launch (`rank_entries`:
    each program a histogram of all entries, its scan and a stable rank of its 64 entries);
    larger launches (prefill, or many experts) run a counting sort over 128-entry chunks in four launches (no
    sort, no int64 copies).
    """
    routing_args(topk_ids, experts)
    shape = one_program_shape(topk_ids.numel(), experts)
    if shape is not None:
        return _ranked_table(topk_ids.contiguous(), experts, shape)
    return _chunked_table(topk_ids.contiguous(), experts)


def routing_args(topk_ids: torch.Tensor, experts: int) -> None:
    """Raise RoutingError unless topk_ids is an integer (m, top_k) tensor and 1 ≤ e ≤ 1024."""
    if topk_ids.dim() != 2 or topk_ids.dtype not in (torch.int32, torch.int64):
        raise RoutingError(f"topk_ids must be an integer (m, top_k) tensor, "
                           f"got {topk_ids.dtype} {tuple(topk_ids.shape)}")
    if not 1 <= experts <= 1024:
        raise RoutingError(f"experts must be in 1..1024, got {experts}")


@jit
def clamped_ids(ids_ptr, i, live, experts):
    """Entries i's expert ids clamped to [0, e); dead entries get e (past every expert)."""
    ids = tl.minimum(tl.maximum(tl.load(ids_ptr + i, mask=live, other=0), 0), experts - 1).to(tl.int32)
    return tl.where(live, ids, experts)


@jit
def _chunk_counts_kernel(ids_ptr, total, experts, counts_ptr, EB: tl.constexpr, CHUNK: tl.constexpr,
                         WB: tl.constexpr):
    """counts[c, w] = #{entries of chunk c with id w}, for w < EB (a power of two ≥ e)."""
    i = tl.program_id(0) * CHUNK + tl.arange(0, CHUNK)
    ids = clamped_ids(ids_ptr, i, i < total, experts)
    for w0 in range(0, EB, WB):
        w = w0 + tl.arange(0, WB)
        hits = (ids[:, None] == w[None, :]).to(tl.int32)
        tl.store(counts_ptr + tl.program_id(0) * EB + w, tl.reduce(hits, 0, tl.standard._sum_combine))


@jit
def _chunk_prefix_kernel(counts_ptr, chunks, totals_ptr, EB: tl.constexpr, WB: tl.constexpr, TC: tl.constexpr):
    """WB experts a program, walking the chunks TC at a time: in place of the counts,
    prefix[c, w] = #{entries of earlier chunks with id w}; totals[w] = #{entries with id w}."""
    w = tl.program_id(0) * WB + tl.arange(0, WB)
    running = tl.full((WB,), 0, tl.int32)
    for c0 in range(0, chunks, TC):
        c = c0 + tl.arange(0, TC)
        cells = counts_ptr + c[:, None] * EB + w[None, :]
        live = (c < chunks)[:, None]
        tile = tl.load(cells, mask=live, other=0)
        before = tl.associative_scan(tile, 0, tl.standard._sum_combine) - tile
        tl.store(cells, running[None, :] + before, mask=live)
        running += tl.reduce(tile, 0, tl.standard._sum_combine)
    tl.store(totals_ptr + w, running)


@jit
def _bounds_kernel(totals_ptr, experts, total, bounds_ptr, EB: tl.constexpr):
    """bounds[w] = #{entries with id < w} for w < e, bounds[e] = all entries (the chunks' dead
    tail is counted under id e when e < EB)."""
    w = tl.arange(0, EB)
    totals = tl.load(totals_ptr + w)
    tl.store(bounds_ptr + w, tl.associative_scan(totals, 0, tl.standard._sum_combine) - totals, mask=w < experts)
    tl.store(bounds_ptr + experts, total)


@jit
def _chunk_scatter_kernel(ids_ptr, total, experts, top_k, prefix_ptr, bounds_ptr, rflat_ptr, positions_ptr,
                          EB: tl.constexpr, CHUNK: tl.constexpr):
    """Rflat[bounds[id] + prefix[c, id] + #{earlier entries of chunk c with id}] = i // top_k."""
    i = tl.program_id(0) * CHUNK + tl.arange(0, CHUNK)
    live = i < total
    ids = clamped_ids(ids_ptr, i, live, experts)
    lane = tl.arange(0, CHUNK)
    earlier = (ids[None, :] == ids[:, None]) & (lane[None, :] < lane[:, None])
    rank = tl.reduce(earlier.to(tl.int32), 1, tl.standard._sum_combine)
    base = tl.load(bounds_ptr + ids, mask=live, other=0) + tl.load(prefix_ptr + tl.program_id(0) * EB + ids,
                                                                   mask=live, other=0)
    tl.store(rflat_ptr + base + rank, i // top_k, mask=live)
    tl.store(positions_ptr + i, base + rank, mask=live)


def _chunked_table(topk_ids: torch.Tensor, experts: int) -> RoutingTable:
    """The stable counting sort in four launches, none serial over the whole launch: counts per
    (chunk, expert); per-expert prefixes over the chunks (expert blocks in parallel); the bounds
    (one program, e ≤ 1024 totals); a scatter that ranks entries within their chunk."""
    total = topk_ids.numel()
    chunks = triton.cdiv(total, _COUNT_CHUNK)
    eb = max(triton.next_power_of_2(experts), 2)
    wb = min(eb, _COUNT_EXPERTS)
    counts = torch.empty((chunks, eb), dtype=torch.int32, device=topk_ids.device)
    totals = torch.empty(eb, dtype=torch.int32, device=topk_ids.device)
    rflat, positions = torch.empty((2, total), dtype=torch.int32, device=topk_ids.device)
    bounds = torch.empty(experts + 1, dtype=torch.int32, device=topk_ids.device)
    _chunk_counts_kernel[(chunks,)](topk_ids, total, experts, counts, EB=eb, CHUNK=_COUNT_CHUNK, WB=wb)
    _chunk_prefix_kernel[(eb // wb,)](counts, chunks, totals, EB=eb, WB=wb, TC=_SCAN_CELLS // wb)
    _bounds_kernel[(1,)](totals, experts, total, bounds, EB=eb)
    _chunk_scatter_kernel[(chunks,)](topk_ids, total, experts, topk_ids.shape[1], counts, bounds, rflat,
                                     positions, EB=eb, CHUNK=_COUNT_CHUNK)
    return RoutingTable(rflat, bounds, positions)


@jit
def _one_hot(ids_ptr, i, total, experts, w):
    """(entries i, experts w) int32: 1 where entry i (live, id clamped) routes to expert w."""
    live = i < total
    return ((clamped_ids(ids_ptr, i, live, experts)[:, None] == w[None, :]) & live[:, None]).to(tl.int32)


@jit
def rank_entries(ids_ptr, total, experts, top_k, rflat_ptr, bounds_ptr, positions_ptr, part, EB: tl.constexpr,
                 CHUNK: tl.constexpr, SLICE: tl.constexpr):
    """Rank entries [part·SLICE, (part + 1)·SLICE) of the table; program part = 0 also writes the
    bounds. Every part reads all ids (L2-hot, ≤ 16 KB) and takes per-expert counts over all
    entries and over those before its slice (one-hot column sums over CHUNK-entry steps), their
    exclusive scan (the bounds); an entry's position = its expert's start + its expert's entries
    before the slice + earlier entries of its expert inside the slice (a SLICE × SLICE compare).
    Stable; the parts run side by side and none scans down the entries."""
    w = tl.arange(0, EB)
    first = part * SLICE
    counts = tl.full((EB,), 0, tl.int32)
    before = tl.full((EB,), 0, tl.int32)
    for c0 in range(0, total, CHUNK):
        i = c0 + tl.arange(0, CHUNK)
        hot = _one_hot(ids_ptr, i, total, experts, w)
        counts += tl.reduce(hot, 0, tl.standard._sum_combine)
        before += tl.reduce(tl.where((i < first)[:, None], hot, 0), 0, tl.standard._sum_combine)
    starts = tl.associative_scan(counts, 0, tl.standard._sum_combine) - counts
    first_part = (w * 0 + part) == 0
    tl.store(bounds_ptr + w, starts, mask=(w < experts) & first_part)
    tl.store(bounds_ptr + experts + w, total + w * 0, mask=(w == 0) & first_part)
    lane = tl.arange(0, SLICE)
    i = first + lane
    live = i < total
    ids = clamped_ids(ids_ptr, i, live, experts)
    earlier = (ids[:, None] == ids[None, :]) & (lane[None, :] < lane[:, None])
    within = tl.reduce(earlier.to(tl.int32), 1, tl.standard._sum_combine)
    hot = ((ids[:, None] == w[None, :]) & live[:, None]).to(tl.int32)
    base = tl.reduce(hot * (starts + before)[None, :], 1, tl.standard._sum_combine)
    tl.store(rflat_ptr + base + within, i // top_k, mask=live)
    tl.store(positions_ptr + i, base + within, mask=live)


@jit
def entries_before(ids_ptr, total, experts, key_id, key_at, CHUNK: tl.constexpr):
    """Per key (expert id, flat index): the live entries a stable sort by expert puts before it,
    #{f : id_f < id or (id_f = id and f < at)}, in CHUNK-entry steps (keys × CHUNK compares).
    An entry's own (id, f) gives its Rflat position; (w, 0) gives expert w's start (the bounds,
    total at w = e). No histogram and no scan, so any program can rank any few entries alone."""
    count = key_id * 0
    for c0 in range(0, total, CHUNK):
        f = c0 + tl.arange(0, CHUNK)
        ids = clamped_ids(ids_ptr, f, f < total, experts)[None, :]  # dead entries: id e, never before
        before = (ids < key_id[:, None]) | ((ids == key_id[:, None]) & (f[None, :] < key_at[:, None]))
        count += tl.reduce(before.to(tl.int32), 1, tl.standard._sum_combine)
    return count


@jit
def _ranked_kernel(ids_ptr, total, experts, top_k, rflat_ptr, bounds_ptr, positions_ptr, EB: tl.constexpr,
                   CHUNK: tl.constexpr, SLICE: tl.constexpr):
    """The routing table (`rank_entries`) as its own launch: a program per SLICE entries."""
    rank_entries(ids_ptr, total, experts, top_k, rflat_ptr, bounds_ptr, positions_ptr, tl.program_id(0), EB, CHUNK,
                 SLICE)


def rank_parts(total: int) -> int:
    """Programs (slices of RANK_SLICE entries) that rank a table of `total` entries."""
    return max(1, triton.cdiv(total, RANK_SLICE))


def one_program_shape(total: int, experts: int) -> tuple[int, int] | None:
    """(EB, CHUNK) of the one-launch table, or None when the chunked sort is the better one:
    more than SMALL_ROUTING entries, or more than _ONE_PROGRAM_STEPS one-hot steps per pass."""
    eb = max(triton.next_power_of_2(experts), 2)
    chunk = max(1, min(triton.next_power_of_2(max(total, 1)), _ONE_HOT_CELLS // eb))
    if total > SMALL_ROUTING or triton.cdiv(total, chunk) > _ONE_PROGRAM_STEPS:
        return None
    return eb, chunk


def _ranked_table(topk_ids: torch.Tensor, experts: int, shape: tuple[int, int]) -> RoutingTable:
    total = topk_ids.numel()
    rflat, positions = torch.empty((2, total), dtype=torch.int32, device=topk_ids.device)
    bounds = torch.empty(experts + 1, dtype=torch.int32, device=topk_ids.device)
    _ranked_kernel[(rank_parts(total),)](topk_ids, total, experts, topk_ids.shape[1], rflat, bounds, positions,
                                         EB=shape[0], CHUNK=shape[1], SLICE=RANK_SLICE, num_warps=RANK_WARPS)
    return RoutingTable(rflat, bounds, positions)


@functools.lru_cache(maxsize=64)
def dense_table(m: int, device: torch.device | str) -> RoutingTable:
    """Dense V4 as one group: every row, in order. Cached per (m, device): the tensors are made
    once (before any graph capture) and never written."""
    return RoutingTable(torch.arange(m, dtype=torch.int32, device=device),
                        torch.tensor([0, m], dtype=torch.int32, device=device))


@dataclass
class RowTiles:
    """The lottery row tiles of a launch, (T,) each; unused entries have row_start = −1.

    row_start: first row of the tile in expert order; expert: its group; local: its expert-local
    tile index (the record's TILE_ROW). T = total_rows // 4 bounds the count for any routing.
    """

    row_start: torch.Tensor
    expert: torch.Tensor
    local: torch.Tensor


@jit
def _tile_map_kernel(ends_ptr, experts, tile_rows, partial, row_start_ptr, expert_ptr, local_ptr,
                     slots, BLOCK: tl.constexpr, EB: tl.constexpr):
    """Slot s → (first row, expert, expert-local index) of the s-th row tile; −1 past the end.
    Every expert's tile count and first tile come from one vector load of the ends and a scan;
    a slot's expert is the number of experts whose tiles end at or before it (no serial walk)."""
    slot = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    w = tl.arange(0, EB)
    ends = tl.load(ends_ptr + w, mask=w < experts, other=0)
    starts = tl.load(ends_ptr + w - 1, mask=(w >= 1) & (w < experts), other=0)
    rows = tl.where(w < experts, ends - starts, 0)
    tiles = tl.where(partial != 0, (rows + tile_rows - 1) // tile_rows, rows // tile_rows)
    tile_end = tl.associative_scan(tiles, 0, tl.standard._sum_combine)
    expert = tl.reduce((tile_end[None, :] <= slot[:, None]).to(tl.int32), 1, tl.standard._sum_combine)
    mine = w[None, :] == expert[:, None]
    local = slot - tl.reduce(tl.where(mine, tile_end - tiles, 0), 1, tl.standard._sum_combine)
    first_row = tl.reduce(tl.where(mine, starts, 0), 1, tl.standard._sum_combine) + tile_rows * local
    used = slot < tl.reduce(tiles, 0, tl.standard._sum_combine)
    live = slot < slots
    tl.store(row_start_ptr + slot, tl.where(used, first_row, -1), mask=live)
    tl.store(expert_ptr + slot, tl.where(used, expert, 0), mask=live)
    tl.store(local_ptr + slot, tl.where(used, local, 0), mask=live)


def map_block(experts: int) -> tuple[int, int]:
    """(slots a program, EB) of the tile map: ≤ _MAP_CELLS (slot, expert) cells a program."""
    eb = max(triton.next_power_of_2(experts), 2)
    return max(16, min(_MAP_BLOCK, _MAP_CELLS // eb)), eb


def row_tiles(table: RoutingTable, tile_rows: int = 4, partial: bool = False) -> RowTiles:
    """Enumerate each expert's row tiles without a host sync (one small kernel).

    Lottery tiles are whole (partial=False: an expert's trailing rows < tile_rows are skipped);
    GEMM tiles cover every row (partial=True, the last tile of an expert may be short). The slot
    count is a static bound: rows // tile_rows (+ e when partial).
    """
    total = table.rflat.shape[0]
    slots = total // tile_rows + (table.experts if partial else 0)
    out = torch.empty((3, max(slots, 1)), dtype=torch.int32, device=table.offsets.device)
    block, eb = map_block(table.experts)
    _tile_map_kernel[(triton.cdiv(max(slots, 1), block),)](
        table.offsets, table.experts, tile_rows, int(partial), out[0], out[1], out[2], slots,
        BLOCK=block, EB=eb)
    return RowTiles(out[0, :slots], out[1, :slots], out[2, :slots])
