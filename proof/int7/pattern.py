"""PeriodicPattern: the canonical 6-byte encoding of a lottery tile's row or column offsets.

int-protocol.md §1.1. The verifier re-derives the pattern from the opened indices with
`from_list`, so a committed pattern must be the canonical one this module builds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .errors import Int7Error

NUM_DIMS = 3
ENCODED_SIZE = 2 * NUM_DIMS
MAX_PERIOD = 1 << 24


@dataclass(frozen=True)
class PeriodicPattern:
    """Three (stride, length) dimensions; the index set is {Σ a_i·stride_i : a_i < length_i}."""

    shape: tuple[tuple[int, int], ...]

    @classmethod
    def from_list(cls, indices: Sequence[int]) -> "PeriodicPattern":
        """The canonical pattern of a sorted index list starting at 0 (smallest period first)."""
        values = [int(v) for v in indices]
        if not values:
            raise Int7Error("pattern: empty index list")
        if any(b <= a for a, b in zip(values, values[1:])):
            raise Int7Error("pattern: indices must be strictly increasing")
        if values[0] != 0:
            raise Int7Error("pattern: indices must start at 0")
        dims: list[tuple[int, int]] = []
        while len(values) > 1:
            for period in range(1, len(values)):
                if len(values) % period:
                    continue
                step = values[period]
                if all(values[i] + step == values[i + period] for i in range(len(values) - period)):
                    dims.append((step, len(values) // period))
                    values = values[:period]
                    break
            else:
                raise Int7Error("pattern: index list is not periodic")
        dims.reverse()
        if len(dims) > NUM_DIMS:
            raise Int7Error(f"pattern: needs {len(dims)} dimensions, at most {NUM_DIMS} are allowed")
        last_period = dims[-1][0] * dims[-1][1] if dims else 1
        dims += [(last_period, 1)] * (NUM_DIMS - len(dims))
        pattern = cls(tuple(dims))
        if cls.from_bytes(pattern.to_bytes()) != pattern:
            raise Int7Error("pattern: not representable canonically")
        return pattern

    @classmethod
    def from_bytes(cls, data: bytes) -> "PeriodicPattern":
        """Decode 6 bytes, enforcing the canonical-form rules and the 2^24 period limit."""
        if len(data) != ENCODED_SIZE:
            raise Int7Error(f"pattern: expected {ENCODED_SIZE} bytes, got {len(data)}")
        dims: list[tuple[int, int]] = []
        prev_period = 1
        done = False
        for i in range(NUM_DIMS):
            factor = data[2 * i] + 1
            length = data[2 * i + 1] + 1
            if length == 1 or done:
                if factor != 1 or length != 1:
                    raise Int7Error("pattern: non-canonical encoding after a length-1 dimension")
                done = True
            elif factor == 1 and prev_period != 1:
                raise Int7Error("pattern: a single stride must not be split across dimensions")
            if prev_period * factor * length > MAX_PERIOD:
                raise Int7Error("pattern: period exceeds 2^24")
            stride = factor * prev_period
            dims.append((stride, length))
            prev_period = stride * length
        pattern = cls(tuple(dims))
        if pattern.to_bytes() != bytes(data):
            raise Int7Error("pattern: encoding does not round-trip")
        return pattern

    def to_bytes(self) -> bytes:
        out = bytearray()
        prev_period = 1
        for stride, length in self.shape:
            if stride % prev_period or not 1 <= stride // prev_period <= 256 or not 1 <= length <= 256:
                raise Int7Error(f"pattern: dimension ({stride}, {length}) is not encodable")
            out += bytes((stride // prev_period - 1, length - 1))
            prev_period = stride * length
        return bytes(out)

    def to_list(self) -> list[int]:
        """Indices in nested order (dimension 0 fastest), which is ascending."""
        values = [0]
        for stride, length in self.shape:
            values = [v + a * stride for a in range(length) for v in values]
        return values

    @property
    def size(self) -> int:
        size = 1
        for _, length in self.shape:
            size *= length
        return size

    @property
    def period(self) -> int:
        stride, length = self.shape[-1]
        return stride * length

    @property
    def max(self) -> int:
        return sum(stride * (length - 1) for stride, length in self.shape)

    def offset_is_valid(self, offset: int) -> bool:
        """True when `offset` starts a tile: the valid offsets tile the axis exactly once."""
        for stride, length in reversed(self.shape):
            offset %= stride * length
            if offset >= stride:
                return False
        return True

    def valid_offsets(self, extent: int) -> list[int]:
        """Every valid tile offset t with t + max < extent, ascending."""
        return [t for t in range(max(extent - self.max, 0)) if self.offset_is_valid(t)]


def list_to_pattern(indices: Sequence[int]) -> tuple[PeriodicPattern, int]:
    """Split opened indices into (canonical pattern, first index), as the verifier does."""
    values = [int(v) for v in indices]
    if not values:
        raise Int7Error("pattern: empty index list")
    if any(b <= a for a, b in zip(values, values[1:])):
        raise Int7Error("pattern: indices must be strictly increasing")
    offset = values[0]
    pattern = PeriodicPattern.from_list([v - offset for v in values])
    if not pattern.offset_is_valid(offset):
        raise Int7Error(f"pattern: offset {offset} is not a valid tile offset")
    return pattern, offset
