"""pearl_blake3's MerkleProof and its "variable-chunk" bincode layout (certificate V4).

Source: pearl-research-labs/pearl `pearl-blake3/src/merkle.rs` @ 36dba3887fa5c5ed9a7e78d5ce56a420441eec20
(`serialize_variable_chunk` / `deserialize_variable_chunk`), used by `zk-pow/src/v4/api/plain_proof.rs`
@ 08ec7513f20cbab1dabbe8be98a6dd807fbab702. bincode 1.x, fixint, little-endian, fields in order:

    leaf_data     Vec<Vec<u8>>   u64 count, then per leaf u64 length + bytes
    leaf_indices  Vec<usize>     u64 count, then u64 each
    total_leaves  usize          u64
    root          [u8; 32]       32 raw bytes (no length)
    siblings      Vec<[u8; 32]>  u64 count, then 32 raw bytes each

"Variable chunk" means the leaves may be 128, 256, 512 or 1024 bytes, all of one length (the
cert V1–V3 "chunk_1024" form is the same layout with 1024 only). Decoding also runs the proof's
sanity check: non-empty, one index per leaf, indices strictly increasing and below total_leaves.
The small bincode reader/writer used by the whole V4 witness lives here too.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

from proof.blake3tree import verify_opening

ALLOWED_LEAF_SIZES = (128, 256, 512, 1024)
DIGEST_SIZE = 32


class BincodeError(ValueError):
    """Bytes that are not a canonical bincode encoding of the expected type."""


class BincodeWriter:
    """bincode 1.x fixint little-endian encoder for the few types the V4 witness uses."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def uint(self, fmt: str, value: int) -> None:
        self._parts.append(struct.pack("<" + fmt, value))

    def raw(self, data: bytes) -> None:
        self._parts.append(bytes(data))

    def byte_vec(self, data: bytes) -> None:
        self.uint("Q", len(data))
        self.raw(data)

    def uint_vec(self, fmt: str, values: list[int]) -> None:
        self.uint("Q", len(values))
        self._parts.append(struct.pack(f"<{len(values)}{fmt}", *values))

    def digest_vec(self, digests: list[bytes]) -> None:
        self.uint("Q", len(digests))
        for digest in digests:
            self.raw(_digest(digest))

    def getvalue(self) -> bytes:
        return b"".join(self._parts)


class BincodeReader:
    """The matching decoder; every read checks the remaining length before allocating."""

    def __init__(self, data: bytes, what: str):
        self._data, self._pos, self.what = bytes(data), 0, what

    def raw(self, n: int) -> bytes:
        if n > len(self._data) - self._pos:
            raise BincodeError(f"truncated {self.what}")
        out = self._data[self._pos:self._pos + n]
        self._pos += n
        return out

    def uint(self, fmt: str) -> int:
        return struct.unpack("<" + fmt, self.raw(struct.calcsize(fmt)))[0]

    def _count(self, elem_size: int) -> int:
        count = self.uint("Q")
        if count * elem_size > len(self._data) - self._pos:
            raise BincodeError(f"truncated {self.what}: a vector claims {count} elements")
        return count

    def byte_vec(self) -> bytes:
        return self.raw(self._count(1))

    def uint_vec(self, fmt: str) -> list[int]:
        count = self._count(struct.calcsize(fmt))
        return list(struct.unpack(f"<{count}{fmt}", self.raw(count * struct.calcsize(fmt))))

    def digest_vec(self) -> list[bytes]:
        return [self.raw(DIGEST_SIZE) for _ in range(self._count(DIGEST_SIZE))]

    def option_tag(self) -> bool:
        tag = self.uint("B")
        if tag > 1:
            raise BincodeError(f"invalid Option tag {tag} in {self.what}")
        return tag == 1

    def finish(self) -> None:
        if self._pos != len(self._data):
            raise BincodeError(f"trailing bytes after {self.what}")


@dataclass
class MerkleProof:
    """A multi-leaf keyed-BLAKE3 Merkle proof (full zero-padded leaves of one allowed size)."""

    leaf_data: list[bytes]
    leaf_indices: list[int]
    total_leaves: int
    root: bytes
    siblings: list[bytes] = field(default_factory=list)

    @property
    def leaf_size(self) -> int:
        return len(self.leaf_data[0]) if self.leaf_data else 1024

    def sanity_check(self) -> None:
        """The structural rules pearl_blake3 enforces before any hashing; raises BincodeError."""
        if not self.leaf_indices:
            raise BincodeError("Merkle proof opens no leaves")
        if len(self.leaf_indices) != len(self.leaf_data):
            raise BincodeError("Merkle proof has a different number of leaves and leaf indices")
        if any(x >= y for x, y in zip(self.leaf_indices, self.leaf_indices[1:])):
            raise BincodeError("Merkle proof leaf indices are not sorted and unique")
        if self.leaf_indices[-1] >= self.total_leaves:
            raise BincodeError(f"Merkle proof leaf index {self.leaf_indices[-1]} is out of range "
                               f"for {self.total_leaves} leaves")
        check_leaf_sizes(self.leaf_data)

    def verify(self, key: bytes) -> bool:
        """True iff the leaves and siblings rebuild `root` under `key`."""
        try:
            self.sanity_check()
        except BincodeError:
            return False
        return verify_opening(key, self.leaf_size, self.total_leaves, self.leaf_indices,
                              self.leaf_data, self.siblings, self.root)

    def extract_bytes(self, start: int, length: int) -> bytes:
        """Bytes [start, start + length) of the committed image; they must lie in opened leaves."""
        size = self.leaf_size
        position = {index: i for i, index in enumerate(self.leaf_indices)}
        out = bytearray()
        offset = start
        while offset < start + length:
            leaf = position.get(offset // size)
            if leaf is None:
                raise BincodeError(f"byte {offset} is not covered by an opened leaf")
            inner = offset % size
            take = min(size - inner, start + length - offset)
            out += self.leaf_data[leaf][inner:inner + take]
            offset += take
        return bytes(out)

    def encode(self, writer: BincodeWriter) -> None:
        """Write the variable-chunk layout."""
        check_leaf_sizes(self.leaf_data)
        writer.uint("Q", len(self.leaf_data))
        for leaf in self.leaf_data:
            writer.byte_vec(leaf)
        writer.uint_vec("Q", list(self.leaf_indices))
        writer.uint("Q", self.total_leaves)
        writer.raw(_digest(self.root))
        writer.digest_vec(list(self.siblings))

    @classmethod
    def decode(cls, reader: BincodeReader) -> "MerkleProof":
        """Read the variable-chunk layout and run the sanity check, as pearl_blake3 does."""
        count = reader.uint("Q")
        leaf_data = []
        for _ in range(count):
            leaf_data.append(reader.byte_vec())
        proof = cls(leaf_data, reader.uint_vec("Q"), reader.uint("Q"), reader.raw(DIGEST_SIZE),
                    reader.digest_vec())
        proof.sanity_check()
        return proof

    def to_bytes(self) -> bytes:
        writer = BincodeWriter()
        self.encode(writer)
        return writer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> "MerkleProof":
        reader = BincodeReader(data, "MerkleProof")
        proof = cls.decode(reader)
        reader.finish()
        return proof


def check_leaf_sizes(leaf_data: list[bytes]) -> None:
    """Every leaf has one length, and that length is an allowed leaf size."""
    if not leaf_data:
        return
    size = len(leaf_data[0])
    if size not in ALLOWED_LEAF_SIZES:
        raise BincodeError(f"leaf length {size} is not one of {ALLOWED_LEAF_SIZES}")
    if any(len(leaf) != size for leaf in leaf_data):
        raise BincodeError("all leaves of a Merkle proof must have the same length")


def _digest(value: bytes) -> bytes:
    value = bytes(value)
    if len(value) != DIGEST_SIZE:
        raise BincodeError(f"a digest must be {DIGEST_SIZE} bytes, got {len(value)}")
    return value
