"""Merkle openings of committed buffers (1024-byte leaves), built and checked with proof.blake3tree."""
from __future__ import annotations

from typing import Sequence

from ..blake3tree import MerkleTree, leaves_for_rows, verify_opening
from .errors import Int7Error
from .plain_proof import LEAF_SIZE, MatrixOpening, MerkleOpening


def open_leaves(tree: MerkleTree, leaf_indices: Sequence[int]) -> MerkleOpening:
    """The opening of `leaf_indices` (sorted, unique) in `tree`."""
    indices = tuple(int(i) for i in leaf_indices)
    return MerkleOpening(tuple(tree.leaf(i) for i in indices), indices, tree.num_leaves, tree.root,
                         tuple(tree.siblings(indices)))


def open_rows(tree: MerkleTree, rows: Sequence[int], row_bytes: int) -> MatrixOpening:
    """Open every leaf overlapping the full rows `rows` of a row-major buffer."""
    return MatrixOpening(open_leaves(tree, leaves_for_rows(rows, row_bytes, LEAF_SIZE)),
                         tuple(int(r) for r in rows))


def leaf_count(num_bytes: int) -> int:
    """Leaves of a committed buffer of `num_bytes` bytes (zero-padded to whole leaves)."""
    return max(1, -(-num_bytes // LEAF_SIZE))


def check_opening(name: str, key: bytes, opening: MerkleOpening, expected_total: int) -> None:
    """Raise Int7Error unless `opening` is a valid opening of a tree of `expected_total` leaves."""
    if opening.total_leaves != expected_total:
        raise Int7Error(f"{name} opening: total_leaves {opening.total_leaves} but the declared "
                        f"dimensions imply {expected_total}")
    if len(opening.leaves) != len(opening.leaf_indices):
        raise Int7Error(f"{name} opening: {len(opening.leaves)} leaves for "
                        f"{len(opening.leaf_indices)} leaf indices")
    if any(b <= a for a, b in zip(opening.leaf_indices, opening.leaf_indices[1:])):
        raise Int7Error(f"{name} opening: leaf indices are not strictly ascending")
    if opening.leaf_indices and opening.leaf_indices[-1] >= expected_total:
        raise Int7Error(f"{name} opening: leaf index {opening.leaf_indices[-1]} out of range")
    if not verify_opening(key, LEAF_SIZE, opening.total_leaves, opening.leaf_indices,
                          opening.leaves, opening.siblings, opening.root):
        raise Int7Error(f"{name} opening: leaves and siblings do not hash to the committed root")
