"""MoE routing: the per-expert token lists, their commitment and opening (int-protocol.md §3.4, §7).

Routing R lists, for each expert, the ascending global token indices routed to it; flattened
expert-major as u32 LE it is committed as H_R, and its exclusive end offsets O as H_O.
"""
from __future__ import annotations

import struct
from typing import Sequence

import numpy as np

from ..blake3tree import MerkleTree
from .errors import Int7Error
from .openings import open_leaves
from .plain_proof import LEAF_SIZE, MerkleOpening

ENTRY_SIZE = 4

Routing = Sequence[Sequence[int]]


def check_routing(routing: Routing, m: int, experts: int, top_k: int) -> None:
    """Raise Int7Error unless every token is routed to exactly top_k experts, lists ascending."""
    if len(routing) != experts:
        raise Int7Error(f"routing: {len(routing)} expert lists for {experts} experts")
    counts = np.zeros(m, dtype=np.int64)
    for e, tokens in enumerate(routing):
        values = [int(t) for t in tokens]
        if any(b <= a for a, b in zip(values, values[1:])):
            raise Int7Error(f"routing: expert {e}'s token list is not strictly ascending")
        if values and (values[0] < 0 or values[-1] >= m):
            raise Int7Error(f"routing: expert {e} has a token outside [0, {m})")
        counts[values] += 1
    if np.any(counts != top_k):
        raise Int7Error(f"routing: every token must be routed to exactly top_k = {top_k} experts")


def random_routing(rng: np.random.Generator, m: int, experts: int, top_k: int) -> list[list[int]]:
    """Each token picks top_k distinct experts uniformly; lists come out ascending."""
    routing: list[list[int]] = [[] for _ in range(experts)]
    for token in range(m):
        for e in rng.choice(experts, size=top_k, replace=False):
            routing[int(e)].append(token)
    return routing


def flatten(routing: Routing) -> bytes:
    """The committed routing bytes: every expert's list in turn, u32 LE."""
    flat = [int(t) for tokens in routing for t in tokens]
    return struct.pack(f"<{len(flat)}I", *flat)


def end_offsets(routing: Routing) -> list[int]:
    """O[e] = number of entries of experts 0..e (exclusive end of expert e's list)."""
    return [int(v) for v in np.cumsum([len(tokens) for tokens in routing])]


def expert_start(offsets: Sequence[int], expert_idx: int) -> int:
    """First flat position of expert `expert_idx`'s list."""
    return 0 if expert_idx == 0 else int(offsets[expert_idx - 1])


def entry_leaves(start: int, inner_rows: Sequence[int]) -> list[int]:
    """The leaves holding the routing entries at flat positions start + inner (ascending)."""
    return sorted({(start + int(i)) * ENTRY_SIZE // LEAF_SIZE for i in inner_rows})


def open_entries(tree: MerkleTree, start: int, inner_rows: Sequence[int]) -> MerkleOpening:
    """The routing opening for an expert's tile rows."""
    return open_leaves(tree, entry_leaves(start, inner_rows))


def read_entry(opening: MerkleOpening, position: int) -> int:
    """The routing entry at flat `position`, read from the opened leaves."""
    return struct.unpack("<I", opening.leaf_bytes(position * ENTRY_SIZE, ENTRY_SIZE))[0]
