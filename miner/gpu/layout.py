"""Per-launch layout of routed rows into the fixed-height instances the GPU pipelines mine.

The INT7 mined pass (``kernels.int7.pipeline.MinedPass``) needs the same number M of rows for
every expert, M a multiple of the GEMM's row block; routing is never that even. So each launch:

- counts the rows routed to each expert (the only host sync of a launch),
- dense (``int7-dense``): every expert's instance holds its routed tokens (ascending) and then
  zero rows up to M = the largest count rounded up (zero rows are a valid operand; they are not
  credited as work),
- MoE (``int7-moe``): one instance over all tokens needs tokens · top_k = E · M, every expert
  listing M ascending tokens, and the token count a multiple of the row block too. Zero *phantom* tokens appended after the real ones fill the gap:
  each phantom is routed to top_k distinct experts, the experts with the largest deficit first
  (with one side regular this greedy always succeeds when no deficit exceeds the phantom count).

``slot_of`` maps every (token, slot) of the router's top-k to its row in the (E · M) output, so
the layer output is one ``index_select``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


class LayoutError(ValueError):
    """Routing that cannot be laid out (names what is wrong)."""


@dataclass(frozen=True)
class Layout:
    """Where each routed row goes: E experts × M rows, and the tokens filling them."""

    counts: tuple[int, ...]  # real rows per expert
    rows: int  # M
    tokens: int  # real tokens T
    phantoms: int  # zero tokens appended after the real ones (MoE only)
    row_token: torch.Tensor  # (E·M,) int64: token of every instance row (T.. = zero rows)
    slot_of: torch.Tensor  # (T·top_k,) int64: instance row of each (token, slot), row-major

    @property
    def experts(self) -> int:
        return len(self.counts)

    def credited_rows(self, tile_rows: int) -> int:
        """Real rows that form whole lottery tiles (zero rows are never credited)."""
        return sum(c - c % tile_rows for c in self.counts)


def routing_counts(topk_ids: torch.Tensor, experts: int) -> list[int]:
    """Rows routed to each expert (one host sync)."""
    if topk_ids.dim() != 2 or topk_ids.dtype not in (torch.int32, torch.int64):
        raise LayoutError(f"topk_ids must be an integer (tokens, top_k) tensor, got {topk_ids.dtype} "
                          f"{tuple(topk_ids.shape)}")
    try:
        counts = torch.bincount(topk_ids.reshape(-1).to(torch.int64), minlength=experts).tolist()
    except RuntimeError as exc:  # a negative id
        raise LayoutError(f"topk_ids hold expert ids outside [0, {experts}): {exc}") from exc
    if len(counts) != experts:
        raise LayoutError(f"topk_ids hold expert ids outside [0, {experts})")
    return counts


def _round_up(value: int, multiple: int) -> int:
    return max(multiple, -(-value // multiple) * multiple)


def moe_rows(counts: list[int], top_k: int, multiple: int) -> tuple[int, int]:
    """(M, phantoms) for one MoE instance: E·M = (T + phantoms)·top_k, no deficit above phantoms,
    M and the instance's token count T + phantoms multiples of ``multiple``."""
    experts = len(counts)
    if not 0 < top_k < experts:
        raise LayoutError(f"an MoE instance needs 0 < top_k < experts, got top_k={top_k}, experts={experts}")
    routed = sum(counts)
    if routed % top_k:
        raise LayoutError(f"{routed} routed rows are not a whole number of top-{top_k} tokens")
    rows = _round_up(max(counts), multiple)
    while True:  # (E − top_k)·M grows with M, so some M fits
        spare = experts * rows - routed
        if spare % top_k == 0 and spare // top_k >= rows - min(counts) and \
                (experts * rows // top_k) % multiple == 0:
            return rows, spare // top_k
        rows += multiple


def phantom_routes(counts: list[int], rows: int, phantoms: int, top_k: int) -> list[list[int]]:
    """Each expert's phantom indices (ascending): phantom p goes to top_k experts of largest deficit."""
    deficit = np.array([rows - c for c in counts], dtype=np.int64)
    if deficit.sum() != phantoms * top_k or deficit.min() < 0 or deficit.max() > phantoms:
        raise LayoutError(f"cannot route {phantoms} phantom tokens into deficits {deficit.tolist()}")
    routes: list[list[int]] = [[] for _ in counts]
    for p in range(phantoms):
        for e in np.argsort(-deficit, kind="stable")[:top_k].tolist():
            routes[e].append(p)
            deficit[e] -= 1
    return routes


def layout(topk_ids: torch.Tensor, experts: int, multiple: int, *, moe: bool) -> Layout:
    """The launch's instance layout (rows in each expert's list ascending, as the protocol wants)."""
    counts = routing_counts(topk_ids, experts)
    tokens, top_k = topk_ids.shape
    device = topk_ids.device
    if moe:
        rows, phantoms = moe_rows(counts, top_k, multiple)
    else:
        rows, phantoms = _round_up(max(counts), multiple), 0
    flat = topk_ids.reshape(-1).to(torch.int64)
    order = torch.sort(flat, stable=True).indices
    counts_t = torch.tensor(counts, dtype=torch.int64, device=device)
    starts = torch.cumsum(counts_t, 0) - counts_t
    sorted_expert = flat[order]
    position = torch.arange(flat.numel(), device=device) - starts[sorted_expert]
    row = sorted_expert * rows + position
    slot_of = torch.empty_like(row).index_copy_(0, order, row)
    row_token = torch.full((experts * rows,), tokens, dtype=torch.int64, device=device)
    row_token[row] = order // top_k
    if phantoms:
        routes = phantom_routes(counts, rows, phantoms, top_k)
        at = [e * rows + counts[e] + i for e, r in enumerate(routes) for i in range(len(r))]
        ids = [tokens + p for r in routes for p in r]
        row_token[torch.tensor(at, dtype=torch.int64, device=device)] = torch.tensor(ids, device=device)
    return Layout(tuple(counts), rows, tokens, phantoms, row_token, slot_of)
