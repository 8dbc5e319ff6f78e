"""PlainProof: what a miner submits, with Pearl's bincode layout byte for byte (int-protocol.md §8.1).

bincode 1.x fixint, little-endian: usize = u64, Vec = u64 count + items, [u8; 32] raw,
Option = u8 tag. Leaves are `Vec<u8>` of exactly 1024 bytes. The legacy V1 form is the same bytes
without the trailing Option tag; `from_bytes` accepts both, like Pearl's deserialize_compat.
"""
from __future__ import annotations

import base64
import binascii
import struct
from dataclasses import dataclass

from .errors import Int7Error

LEAF_SIZE = 1024
HASH_SIZE = 32


@dataclass(frozen=True)
class MerkleOpening:
    """Opened leaves of a committed buffer (pearl-blake3 MerkleProof)."""

    leaves: tuple[bytes, ...]
    leaf_indices: tuple[int, ...]
    total_leaves: int
    root: bytes
    siblings: tuple[bytes, ...]

    def leaf_bytes(self, start: int, length: int) -> bytes:
        """Bytes [start, start + length) of the committed buffer, read from the opened leaves."""
        by_index = dict(zip(self.leaf_indices, self.leaves))
        out = bytearray()
        position = start
        while position < start + length:
            leaf, offset = divmod(position, LEAF_SIZE)
            if leaf not in by_index:
                raise Int7Error(f"leaf {leaf} (byte {position}) is not opened")
            take = min(LEAF_SIZE - offset, start + length - position)
            out += by_index[leaf][offset:offset + take]
            position += take
        return bytes(out)


@dataclass(frozen=True)
class MatrixOpening:
    """A Merkle opening plus the matrix rows it opens (A rows, or Bᵀ rows = B columns)."""

    proof: MerkleOpening
    row_indices: tuple[int, ...]


@dataclass(frozen=True)
class MoEOpening:
    """The MoE part of a plain proof: the expert, the routing offsets and the routing opening."""

    experts: int
    top_k: int
    expert_idx: int
    routing_end_offsets: tuple[int, ...]
    inner_a_rows: tuple[int, ...]
    routing_proof: MerkleOpening


@dataclass(frozen=True)
class PlainProof:
    """A mined tile's openings; for MoE, n is the per-expert n_e."""

    m: int
    n: int
    k: int
    rank: int
    a: MatrixOpening
    bt: MatrixOpening
    moe: MoEOpening | None = None

    def to_bytes(self, *, legacy: bool = False) -> bytes:
        """bincode bytes; `legacy` gives the V1 form (dense only: no trailing Option tag)."""
        w = _Writer()
        for value in (self.m, self.n, self.k, self.rank):
            w.u64(value)
        _write_matrix(w, self.a)
        _write_matrix(w, self.bt)
        if legacy:
            if self.moe is not None:
                raise Int7Error("plain proof: the legacy V1 form cannot carry an MoE proof")
        elif self.moe is None:
            w.u8(0)
        else:
            w.u8(1)
            moe = self.moe
            w.u64(moe.experts)
            w.u64(moe.top_k)
            w.u16(moe.expert_idx)
            w.vec(moe.routing_end_offsets, w.u32)
            w.vec(moe.inner_a_rows, w.u64)
            _write_merkle(w, moe.routing_proof)
        return w.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> "PlainProof":
        """Parse the current form, or the legacy V1 form (missing Option tag); no trailing bytes."""
        try:
            return _read_plain_proof(bytes(data))
        except Int7Error as current_error:
            try:
                return _read_plain_proof(bytes(data) + b"\x00")
            except Int7Error:
                raise current_error from None

    def to_base64(self, *, legacy: bool = False) -> str:
        """Standard base64 with padding, as the gateway's submitPlainProof carries it."""
        return base64.b64encode(self.to_bytes(legacy=legacy)).decode("ascii")

    @classmethod
    def from_base64(cls, text: str) -> "PlainProof":
        try:
            raw = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError) as error:
            raise Int7Error(f"plain proof: invalid base64 ({error})") from None
        return cls.from_bytes(raw)


def min_cert_version(proof: PlainProof) -> int:
    """The lowest certificate version that can carry the proof: 1 for dense, 2 for MoE."""
    return 1 if proof.moe is None else 2


class _Writer:
    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def _pack(self, fmt: str, value: int, bits: int) -> None:
        if not 0 <= value < 1 << bits:
            raise Int7Error(f"plain proof: value {value} does not fit in u{bits}")
        self._parts.append(struct.pack(fmt, value))

    def u8(self, value: int) -> None:
        self._pack("<B", value, 8)

    def u16(self, value: int) -> None:
        self._pack("<H", value, 16)

    def u32(self, value: int) -> None:
        self._pack("<I", value, 32)

    def u64(self, value: int) -> None:
        self._pack("<Q", value, 64)

    def raw(self, data: bytes) -> None:
        self._parts.append(bytes(data))

    def vec(self, items, write_item) -> None:
        self.u64(len(items))
        for item in items:
            write_item(item)

    def getvalue(self) -> bytes:
        return b"".join(self._parts)


def _write_hash(w: _Writer, value: bytes) -> None:
    if len(value) != HASH_SIZE:
        raise Int7Error(f"plain proof: a hash must be {HASH_SIZE} bytes, got {len(value)}")
    w.raw(value)


def _write_leaf(w: _Writer, leaf: bytes) -> None:
    if len(leaf) != LEAF_SIZE:
        raise Int7Error(f"plain proof: leaf data must be {LEAF_SIZE} bytes, got {len(leaf)}")
    w.u64(LEAF_SIZE)
    w.raw(leaf)


def _write_merkle(w: _Writer, proof: MerkleOpening) -> None:
    w.vec(proof.leaves, lambda leaf: _write_leaf(w, leaf))
    w.vec(proof.leaf_indices, w.u64)
    w.u64(proof.total_leaves)
    _write_hash(w, proof.root)
    w.vec(proof.siblings, lambda s: _write_hash(w, s))


def _write_matrix(w: _Writer, opening: MatrixOpening) -> None:
    _write_merkle(w, opening.proof)
    w.vec(opening.row_indices, w.u64)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def take(self, size: int, what: str) -> bytes:
        if self._pos + size > len(self._data):
            raise Int7Error(f"plain proof: truncated while reading {what}")
        chunk = self._data[self._pos:self._pos + size]
        self._pos += size
        return chunk

    def u8(self, what: str) -> int:
        return self.take(1, what)[0]

    def u16(self, what: str) -> int:
        return struct.unpack("<H", self.take(2, what))[0]

    def u32(self, what: str) -> int:
        return struct.unpack("<I", self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack("<Q", self.take(8, what))[0]

    def count(self, what: str, item_size: int) -> int:
        """A Vec length, refused when the remaining bytes cannot hold that many items."""
        count = self.u64(f"{what} count")
        if count * item_size > len(self._data) - self._pos:
            raise Int7Error(f"plain proof: {what} count {count} exceeds the remaining bytes")
        return count

    def finish(self) -> None:
        if self._pos != len(self._data):
            raise Int7Error(f"plain proof: {len(self._data) - self._pos} trailing bytes")


def _read_merkle(r: _Reader, name: str) -> MerkleOpening:
    leaves = []
    for _ in range(r.count(f"{name} leaves", 8)):
        size = r.u64(f"{name} leaf length")
        if size != LEAF_SIZE:
            raise Int7Error(f"plain proof: {name} leaf data must be {LEAF_SIZE} bytes, got {size}")
        leaves.append(r.take(LEAF_SIZE, f"{name} leaf"))
    indices = tuple(r.u64(f"{name} leaf index") for _ in range(r.count(f"{name} leaf indices", 8)))
    total = r.u64(f"{name} total_leaves")
    root = r.take(HASH_SIZE, f"{name} root")
    siblings = tuple(r.take(HASH_SIZE, f"{name} sibling")
                     for _ in range(r.count(f"{name} siblings", HASH_SIZE)))
    return MerkleOpening(tuple(leaves), indices, total, root, siblings)


def _read_matrix(r: _Reader, name: str) -> MatrixOpening:
    proof = _read_merkle(r, name)
    rows = tuple(r.u64(f"{name} row index") for _ in range(r.count(f"{name} row indices", 8)))
    return MatrixOpening(proof, rows)


def _read_plain_proof(data: bytes) -> PlainProof:
    r = _Reader(data)
    m, n, k, rank = (r.u64(name) for name in ("m", "n", "k", "noise_rank"))
    a = _read_matrix(r, "A")
    bt = _read_matrix(r, "Bt")
    tag = r.u8("moe option tag")
    moe = None
    if tag == 1:
        experts = r.u64("e")
        top_k = r.u64("top_k")
        expert_idx = r.u16("expert_idx")
        offsets = tuple(r.u32("routing offset") for _ in range(r.count("routing offsets", 4)))
        inner = tuple(r.u64("inner A row") for _ in range(r.count("inner A rows", 8)))
        routing = _read_merkle(r, "routing")
        moe = MoEOpening(experts, top_k, expert_idx, offsets, inner, routing)
    elif tag != 0:
        raise Int7Error(f"plain proof: invalid Option tag {tag}")
    r.finish()
    return PlainProof(m, n, k, rank, a, bt, moe)
