"""The MoE routing table on the device (§13): Rflat, the end offsets O, and the lottery row tiles.

Rflat lists, expert by expert, the tokens routed to it (a stable sort of the flattened top-k ids,
so each list ascends); O[w] is the cumulative end offset of expert w. Both are u32 LE when hashed.
The lottery lattice is expert-local: an expert with c rows has c // 4 row tiles, rows 4t..4t+3 of
its list; a trailing partial tile is never mined. Everything is computed with static shapes, so
nothing syncs: the tile map (one small Triton kernel) has a fixed upper bound of entries and marks
unused ones with −1.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.int7._jit import jit

_MAP_BLOCK = 256
SMALL_ROUTING = 4096  # routing entries (m · top_k) ranked by one kernel; more go through torch.sort
_RANK_BLOCK = 64
_RANK_CHUNK = 128


class RoutingError(ValueError):
    """Bad routing input."""


@dataclass
class RoutingTable:
    """Rflat (m·top_k,) int32 token ids in expert order and bounds (e + 1,) int32: 0 then the
    cumulative ends. `offsets` (e,) — Pearl's O, the hashed and proven form — is a view of bounds
    without its leading 0; grouped GEMMs take `bounds` (so neither form costs a launch)."""

    rflat: torch.Tensor
    bounds: torch.Tensor

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

    Up to SMALL_ROUTING entries (decode) one Triton kernel ranks every entry directly (its
    position is #{entries with a smaller id} + #{earlier entries with its id}: a stable counting
    sort in one launch); larger launches use torch's stable sort and a scatter-add of the counts.
    """
    if topk_ids.dim() != 2 or topk_ids.dtype not in (torch.int32, torch.int64):
        raise RoutingError(f"topk_ids must be an integer (m, top_k) tensor, "
                           f"got {topk_ids.dtype} {tuple(topk_ids.shape)}")
    if not 1 <= experts <= 1024:
        raise RoutingError(f"experts must be in 1..1024, got {experts}")
    top_k = topk_ids.shape[1]
    if topk_ids.numel() <= SMALL_ROUTING:
        return _ranked_table(topk_ids.contiguous(), experts)
    ids = topk_ids.to(torch.int64).clamp(0, experts - 1).reshape(-1)
    order = torch.sort(ids, stable=True).indices
    counts = torch.zeros(experts + 1, dtype=torch.int32, device=ids.device)
    counts[1:].scatter_add_(0, ids, _ones(ids.shape[0], ids.device))
    return RoutingTable(torch.div(order, top_k, rounding_mode="floor").to(torch.int32),
                        torch.cumsum(counts, 0, dtype=torch.int32))


@jit
def _ranked_kernel(ids_ptr, total, experts, top_k, rflat_ptr, bounds_ptr,
                   BLOCK: tl.constexpr, CHUNK: tl.constexpr):
    """Entries i (and experts w) of this program's block: Rflat[rank(i)] = i // top_k and
    bounds[w] = #{entries with id < w}, counting over all entries CHUNK at a time."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live_i = i < total
    id_i = tl.minimum(tl.maximum(tl.load(ids_ptr + i, mask=live_i, other=0), 0), experts - 1).to(tl.int32)
    rank = tl.full((BLOCK,), 0, tl.int32)
    below = tl.full((BLOCK,), 0, tl.int32)  # for w = i: entries with a smaller id
    for j0 in range(0, total, CHUNK):
        j = j0 + tl.arange(0, CHUNK)
        live_j = j < total
        id_j = tl.minimum(tl.maximum(tl.load(ids_ptr + j, mask=live_j, other=0), 0), experts - 1).to(tl.int32)
        id_j = tl.where(live_j, id_j, experts)  # dead entries sort past every expert
        earlier = (id_j[None, :] < id_i[:, None]) | ((id_j[None, :] == id_i[:, None]) & (j[None, :] < i[:, None]))
        # tl.sum's own combine: the interpreter then sums with numpy instead of element by element
        rank += tl.reduce(earlier.to(tl.int32), 1, tl.standard._sum_combine)
        below += tl.reduce((id_j[None, :] < i[:, None]).to(tl.int32), 1, tl.standard._sum_combine)
    tl.store(rflat_ptr + rank, i // top_k, mask=live_i)
    tl.store(bounds_ptr + i, below, mask=i <= experts)


def _ranked_table(topk_ids: torch.Tensor, experts: int) -> RoutingTable:
    total = topk_ids.numel()
    rflat = torch.empty(total, dtype=torch.int32, device=topk_ids.device)
    bounds = torch.empty(experts + 1, dtype=torch.int32, device=topk_ids.device)
    grid = (triton.cdiv(max(total, experts + 1), _RANK_BLOCK),)
    _ranked_kernel[grid](topk_ids, total, experts, topk_ids.shape[1], rflat, bounds,
                         BLOCK=_RANK_BLOCK, CHUNK=_RANK_CHUNK)
    return RoutingTable(rflat, bounds)


@functools.lru_cache(maxsize=64)
def _ones(count: int, device: torch.device | str) -> torch.Tensor:
    """A cached int32 ones vector (made before a graph capture, never written)."""
    return torch.ones(count, dtype=torch.int32, device=device)


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
                     slots, BLOCK: tl.constexpr):
    """Slot s → (first row, expert, expert-local index) of the s-th row tile; −1 past the end."""
    slot = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    row_start = tl.full((BLOCK,), -1, tl.int32)
    expert = tl.full((BLOCK,), 0, tl.int32)
    local = tl.full((BLOCK,), 0, tl.int32)
    start = 0
    first_tile = 0
    for w in range(experts):
        end = tl.load(ends_ptr + w)
        rows = end - start
        tiles = tl.where(partial != 0, (rows + tile_rows - 1) // tile_rows, rows // tile_rows)
        mine = (slot >= first_tile) & (slot < first_tile + tiles)
        row_start = tl.where(mine, start + tile_rows * (slot - first_tile), row_start)
        expert = tl.where(mine, w, expert)
        local = tl.where(mine, slot - first_tile, local)
        first_tile += tiles
        start = end
    live = slot < slots
    tl.store(row_start_ptr + slot, row_start, mask=live)
    tl.store(expert_ptr + slot, expert, mask=live)
    tl.store(local_ptr + slot, local, mask=live)


def row_tiles(table: RoutingTable, tile_rows: int = 4, partial: bool = False) -> RowTiles:
    """Enumerate each expert's row tiles without a host sync (one small kernel).

    Lottery tiles are whole (partial=False: an expert's trailing rows < tile_rows are skipped);
    GEMM tiles cover every row (partial=True, the last tile of an expert may be short). The slot
    count is a static bound: rows // tile_rows (+ e when partial).
    """
    total = table.rflat.shape[0]
    slots = total // tile_rows + (table.experts if partial else 0)
    out = torch.empty((3, max(slots, 1)), dtype=torch.int32, device=table.offsets.device)
    _tile_map_kernel[(triton.cdiv(max(slots, 1), _MAP_BLOCK),)](
        table.offsets, table.experts, tile_rows, int(partial), out[0], out[1], out[2], slots,
        BLOCK=_MAP_BLOCK)
    return RowTiles(out[0, :slots], out[1, :slots], out[2, :slots])
