"""Keyed BLAKE3 chunk trees and multi-leaf Merkle openings (pearl-blake3's Merkle tree).

Pearl commits matrices as keyed BLAKE3 trees whose leaves are L-byte chunks (L = 1024 for the INT
certificates, 128/256/512/1024 for V4).  Proofs open individual leaves, so we need the BLAKE3
chaining values of chunks and parents, which the `blake3` package does not expose: this module has
its own compression function, vectorised with numpy across chunks (block j of every chunk is
compressed in one pass; parents are compressed level by level).

Conventions (docs/protocol-chain.md):
- data is zero-padded to a multiple of the leaf size; empty data is one all-zero leaf;
- leaf i = keyed, non-root chunk chaining value with block counter i;
- parents pair neighbours with keyed PARENT compressions (counter 0), an odd last node is promoted
  unchanged, and the one compression at the top gets ROOT; a single leaf's root is the
  ROOT-finalised chunk hash.  With L = 1024 this is BLAKE3's own tree, so the root equals
  ``blake3(padded, key=key)``.
"""
from __future__ import annotations

from collections.abc import Sequence

import blake3
import numpy as np

CHUNK_START = 1
CHUNK_END = 2
PARENT = 4
ROOT = 8
KEYED_HASH = 16

BLOCK_LEN = 64
KEY_LEN = 32
OUT_LEN = 32
LEAF_SIZES = (128, 256, 512, 1024)

IV = (0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A, 0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19)
_PERMUTATION = (2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8)


def _message_schedule() -> tuple[tuple[int, ...], ...]:
    """Word order of the message for each of the 7 rounds (the permutation applied r times)."""
    rounds = [tuple(range(16))]
    for _ in range(6):
        previous = rounds[-1]
        rounds.append(tuple(previous[p] for p in _PERMUTATION))
    return tuple(rounds)


_SCHEDULE = _message_schedule()
# (a, b, c, d) state indices of the four column and four diagonal G applications of a round.
_G_INDICES = ((0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15),
              (0, 5, 10, 15), (1, 6, 11, 12), (2, 7, 8, 13), (3, 4, 9, 14))
# Number of chunks compressed together; keeps the working arrays inside the CPU caches.
_BATCH = 8192


def _rotr(x: np.ndarray, n: int, tmp: np.ndarray) -> None:
    """In-place 32-bit rotate right."""
    np.right_shift(x, n, out=tmp)
    np.left_shift(x, 32 - n, out=x)
    np.bitwise_or(x, tmp, out=x)


def _compress_lanes(cv: np.ndarray, words: np.ndarray, counter: np.ndarray | int,
                    flags: np.ndarray | int, block_len: int = BLOCK_LEN,
                    full_output: bool = False) -> np.ndarray:
    """Compress N blocks at once (the tree only ever compresses full 64-byte blocks).

    cv: (8, N) uint32, words: (16, N) uint32 message words, counter/flags: per lane or scalar.
    Returns (8, N) chaining values, or (16, N) with `full_output`.
    """
    lanes = cv.shape[1]
    counter = np.broadcast_to(np.asarray(counter, dtype=np.uint64), (lanes,))
    v = [cv[i].copy() for i in range(8)]
    v += [np.full(lanes, IV[i], dtype=np.uint32) for i in range(4)]
    v.append((counter & 0xFFFFFFFF).astype(np.uint32))
    v.append((counter >> np.uint64(32)).astype(np.uint32))
    v.append(np.full(lanes, block_len, dtype=np.uint32))
    v.append(np.broadcast_to(np.asarray(flags, dtype=np.uint32), (lanes,)).copy())
    tmp = np.empty(lanes, dtype=np.uint32)
    for schedule in _SCHEDULE:
        for g, (a, b, c, d) in enumerate(_G_INDICES):
            va, vb, vc, vd = v[a], v[b], v[c], v[d]
            va += vb
            va += words[schedule[2 * g]]
            vd ^= va
            _rotr(vd, 16, tmp)
            vc += vd
            vb ^= vc
            _rotr(vb, 12, tmp)
            va += vb
            va += words[schedule[2 * g + 1]]
            vd ^= va
            _rotr(vd, 8, tmp)
            vc += vd
            vb ^= vc
            _rotr(vb, 7, tmp)
    out = np.empty((16 if full_output else 8, lanes), dtype=np.uint32)
    for i in range(8):
        np.bitwise_xor(v[i], v[i + 8], out=out[i])
        if full_output:
            np.bitwise_xor(v[i + 8], cv[i], out=out[i + 8])
    return out


def _check_key(key: bytes) -> None:
    if not isinstance(key, (bytes, bytearray)) or len(key) != KEY_LEN:
        raise ValueError(f"key must be {KEY_LEN} bytes, got {_describe(key)}")


def _check_leaf_size(leaf_size: int) -> None:
    if leaf_size not in LEAF_SIZES:
        raise ValueError(f"leaf_size must be one of {LEAF_SIZES}, got {leaf_size!r}")


def _describe(value: object) -> str:
    if isinstance(value, (bytes, bytearray)):
        return f"{len(value)} bytes"
    return type(value).__name__


def key_words(key: bytes) -> list[int]:
    """The 8 little-endian words of a 32-byte key (the initial chaining value of keyed mode)."""
    _check_key(key)
    return [int(w) for w in np.frombuffer(bytes(key), dtype="<u4")]


def compress(cv: Sequence[int], block: bytes, counter: int, block_len: int, flags: int) -> list[int]:
    """The BLAKE3 compression function: 16 output words (the first 8 are the chaining value).

    `block` is at most 64 bytes and is zero-padded to 64; `block_len` is what BLAKE3 mixes in as
    the block length.
    """
    if len(cv) != 8:
        raise ValueError(f"cv must have 8 words, got {len(cv)}")
    if len(block) > BLOCK_LEN:
        raise ValueError(f"block must be at most {BLOCK_LEN} bytes, got {len(block)}")
    if not 0 <= block_len <= BLOCK_LEN:
        raise ValueError(f"block_len must be in [0, {BLOCK_LEN}], got {block_len}")
    if not 0 <= counter < 1 << 64:
        raise ValueError(f"counter must fit in 64 bits, got {counter}")
    padded = bytes(block) + bytes(BLOCK_LEN - len(block))
    words = np.frombuffer(padded, dtype="<u4").astype(np.uint32).reshape(16, 1)
    cv_lanes = np.array(cv, dtype=np.uint32).reshape(8, 1)
    lanes = _compress_lanes(cv_lanes, words, counter, flags, block_len, full_output=True)
    return [int(w) for w in lanes[:, 0]]


def pad_to_leaves(data: bytes, leaf_size: int) -> bytes:
    """Zero-pad `data` to a whole number of leaves; empty data becomes one all-zero leaf."""
    _check_leaf_size(leaf_size)
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"data must be bytes, got {type(data).__name__}")
    data = bytes(data)
    num_leaves = max(1, -(-len(data) // leaf_size))
    return data + bytes(num_leaves * leaf_size - len(data))


def _key_lanes(key: bytes, lanes: int) -> np.ndarray:
    return np.repeat(np.array(key_words(key), dtype=np.uint32).reshape(8, 1), lanes, axis=1)


def _chunk_cvs(key: bytes, leaves: np.ndarray, counters: np.ndarray, root: bool) -> np.ndarray:
    """Keyed chunk chaining values of leaves (N, blocks, 16) uint32 with block counters (N,).

    Every block is full (the data is padded); `root` sets ROOT on the last block.
    """
    num, blocks, _ = leaves.shape
    out = np.empty((8, num), dtype=np.uint32)
    for start in range(0, num, _BATCH):
        stop = min(num, start + _BATCH)
        cv = _key_lanes(key, stop - start)
        for j in range(blocks):
            flags = KEYED_HASH
            if j == 0:
                flags |= CHUNK_START
            if j == blocks - 1:
                flags |= CHUNK_END | (ROOT if root else 0)
            words = np.ascontiguousarray(leaves[start:stop, j, :].T)
            cv = _compress_lanes(cv, words, counters[start:stop], flags)
        out[:, start:stop] = cv
    return out


def _parent_cvs(key: bytes, left: np.ndarray, right: np.ndarray, root: bool) -> np.ndarray:
    """Keyed parent chaining values of (8, P) left and right children."""
    flags = KEYED_HASH | PARENT | (ROOT if root else 0)
    num = left.shape[1]
    out = np.empty((8, num), dtype=np.uint32)
    for start in range(0, num, _BATCH):
        stop = min(num, start + _BATCH)
        words = np.concatenate([left[:, start:stop], right[:, start:stop]])
        out[:, start:stop] = _compress_lanes(_key_lanes(key, stop - start), words, 0, flags)
    return out


def _leaf_array(leaf_data: bytes, leaf_size: int) -> np.ndarray:
    return np.frombuffer(leaf_data, dtype="<u4").astype(np.uint32, copy=False).reshape(
        -1, leaf_size // BLOCK_LEN, 16)


def _cv_bytes(cv: np.ndarray) -> bytes:
    return cv.astype("<u4").tobytes()


def _level_lengths(total_leaves: int) -> list[int]:
    """Node counts per level from the leaves up to (excluding) the single root."""
    lengths = []
    length = total_leaves
    while length > 1:
        lengths.append(length)
        length = (length + 1) // 2
    return lengths


def _sibling_positions(leaf_indices: Sequence[int], total_leaves: int) -> list[tuple[int, int]]:
    """(level, index) of every sibling an opening needs, in Pearl's order (int-protocol.md §8.2).

    Level by level from the leaves: walk the known nodes in ascending order; an odd node whose left
    neighbour is unknown needs it, an even node whose right neighbour is unknown and exists needs it.
    """
    nodes = sorted(set(leaf_indices))
    positions = []
    for level, length in enumerate(_level_lengths(total_leaves)):
        known = set(nodes)
        for i in nodes:
            if i % 2 == 1 and i - 1 not in known:
                positions.append((level, i - 1))
            elif i % 2 == 0 and i + 1 < length and i + 1 not in known:
                positions.append((level, i + 1))
        nodes = sorted({i // 2 for i in nodes})
    return positions


def _build(key: bytes, padded: bytes, leaf_size: int) -> tuple[list[np.ndarray], bytes]:
    """All non-root levels (each (8, count) uint32) and the root of the padded data."""
    leaves = _leaf_array(padded, leaf_size)
    num = leaves.shape[0]
    counters = np.arange(num, dtype=np.uint64)
    if num == 1:
        return [], _cv_bytes(_chunk_cvs(key, leaves, counters, root=True)[:, 0])
    levels = [_chunk_cvs(key, leaves, counters, root=False)]
    while True:
        level = levels[-1]
        count = level.shape[1]
        pairs = count // 2
        parents = _parent_cvs(key, level[:, 0:2 * pairs:2], level[:, 1:2 * pairs:2], root=count == 2)
        if count == 2:
            return levels, _cv_bytes(parents[:, 0])
        if count % 2:
            parents = np.concatenate([parents, level[:, -1:]], axis=1)
        levels.append(parents)


def keyed_tree_root(key: bytes, data: bytes, leaf_size: int) -> bytes:
    """Root of the keyed chunk tree of `data` (zero-padded to whole leaves) under `key`.

    For 1024-byte leaves this is BLAKE3's own tree, so the (much faster) blake3 package computes it.
    """
    _check_key(key)
    padded = pad_to_leaves(data, leaf_size)
    if leaf_size == 1024:
        return blake3.blake3(padded, key=bytes(key)).digest()
    return _build(key, padded, leaf_size)[1]


class MerkleTree:
    """A keyed chunk tree kept whole so that any set of leaves can be opened."""

    def __init__(self, key: bytes, data: bytes, leaf_size: int) -> None:
        _check_key(key)
        self.key = bytes(key)
        self.leaf_size = leaf_size
        self._padded = pad_to_leaves(data, leaf_size)
        self._levels, self.root = _build(self.key, self._padded, leaf_size)
        self.num_leaves = len(self._padded) // leaf_size

    def leaf(self, index: int) -> bytes:
        """The raw bytes of leaf `index` (what an opening carries)."""
        if not 0 <= index < self.num_leaves:
            raise IndexError(f"leaf index {index} out of range [0, {self.num_leaves})")
        return self._padded[index * self.leaf_size:(index + 1) * self.leaf_size]

    def siblings(self, leaf_indices: Sequence[int]) -> list[bytes]:
        """The sibling hashes that open `leaf_indices` (sorted, unique), in Pearl's order."""
        _check_indices(leaf_indices, self.num_leaves)
        return [_cv_bytes(self._levels[level][:, i])
                for level, i in _sibling_positions(leaf_indices, self.num_leaves)]


def _check_indices(leaf_indices: Sequence[int], total_leaves: int) -> None:
    if len(leaf_indices) == 0:
        raise ValueError("an opening needs at least one leaf index")
    for previous, current in zip(leaf_indices, leaf_indices[1:]):
        if current <= previous:
            raise ValueError(f"leaf indices must be strictly ascending: {previous} then {current}")
    if leaf_indices[0] < 0 or leaf_indices[-1] >= total_leaves:
        raise ValueError(f"leaf indices must lie in [0, {total_leaves})")


def verify_opening(key: bytes, leaf_size: int, total_leaves: int, leaf_indices: Sequence[int],
                   leaves: Sequence[bytes], siblings: Sequence[bytes], root: bytes) -> bool:
    """True when the leaves at `leaf_indices` and `siblings` hash up to `root`.

    False for malformed openings too (unsorted, duplicate or out-of-range indices, a leaf of the
    wrong length, extra or missing siblings): a verifier only needs to know whether it holds.
    """
    _check_key(key)
    _check_leaf_size(leaf_size)
    indices = [int(i) for i in leaf_indices]
    if not 1 <= total_leaves < 1 << 64 or len(leaves) != len(indices):
        return False
    try:
        _check_indices(indices, total_leaves)
    except ValueError:
        return False
    if any(len(leaf) != leaf_size for leaf in leaves) or any(len(s) != OUT_LEN for s in siblings):
        return False
    positions = _sibling_positions(indices, total_leaves)
    if len(positions) != len(siblings):
        return False
    leaf_array = _leaf_array(b"".join(bytes(leaf) for leaf in leaves), leaf_size)
    cvs = _chunk_cvs(key, leaf_array, np.array(indices, dtype=np.uint64), root=total_leaves == 1)
    if total_leaves == 1:
        return _cv_bytes(cvs[:, 0]) == bytes(root)
    nodes = {i: cvs[:, n] for n, i in enumerate(indices)}
    given = iter(siblings)
    for level, length in enumerate(_level_lengths(total_leaves)):
        for position_level, i in positions:
            if position_level == level:
                nodes[i] = np.frombuffer(bytes(next(given)), dtype="<u4").astype(np.uint32)
        parents = sorted({i // 2 for i in nodes})
        paired = [p for p in parents if 2 * p + 1 < length]
        next_nodes = {p: nodes[2 * p] for p in parents if 2 * p + 1 >= length}
        if paired:
            left = np.stack([nodes[2 * p] for p in paired], axis=1)
            right = np.stack([nodes[2 * p + 1] for p in paired], axis=1)
            computed = _parent_cvs(key, left, right, root=length == 2)
            next_nodes.update({p: computed[:, n] for n, p in enumerate(paired)})
        nodes = next_nodes
    return _cv_bytes(nodes[0]) == bytes(root)


def leaves_for_span(start: int, end: int, leaf_size: int) -> list[int]:
    """The leaves overlapping bytes [start, end), ascending: the set Pearl's compiled BLAKE3
    schedule opens for a span (docs/protocol-fp8.md, "Opened leaves")."""
    _check_leaf_size(leaf_size)
    if not 0 <= start < end:
        raise ValueError(f"a byte span needs 0 <= start < end, got [{start}, {end})")
    return list(range(start // leaf_size, (end - 1) // leaf_size + 1))


def leaves_for_rows(row_indices: Sequence[int], row_bytes: int, leaf_size: int) -> list[int]:
    """Every leaf overlapping the full byte range of each row, unique and ascending."""
    _check_leaf_size(leaf_size)
    if row_bytes <= 0:
        raise ValueError(f"row_bytes must be positive, got {row_bytes}")
    leaves: set[int] = set()
    for row in row_indices:
        if row < 0:
            raise ValueError(f"row index must be non-negative, got {row}")
        leaves.update(leaves_for_span(row * row_bytes, (row + 1) * row_bytes, leaf_size))
    return sorted(leaves)
