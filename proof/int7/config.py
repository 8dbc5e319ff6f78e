"""MiningConfig: the 52-byte INT mining configuration and its protocol limits (int-protocol.md §1)."""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Sequence

from .errors import Int7Error
from .pattern import PeriodicPattern

CONFIG_SIZE = 52
MMA_INT7_INT7_TO_INT32 = 0
MIN_RANK = 32
MAX_RANK = 1024
MIN_COMMON_DIM = 1024
MAX_COMMON_DIM = 1 << 16
MAX_EXPERTS = 1024
TILE_H = 2  # circuit constant: tile height and width must be even
TILE_D = 16  # circuit constant: rank must be a multiple of it
MIN_TILE_SIZE = 32
MAX_TILE_SIZE = 256
MAX_WORKER_INPUT = 1 << 22
DWORD_SIZE = 4
VALUE_LIMIT = 64  # committed operands lie in [-64, 64]


@dataclass(frozen=True)
class MiningConfig:
    """A mining configuration; `rows`/`cols` are the tile's offset lists (any valid tile's offsets
    minus its first), from which the canonical PeriodicPatterns are derived."""

    common_dim: int
    rank: int
    rows: Sequence[int]
    cols: Sequence[int]
    experts: int = 0
    top_k: int = 0
    rows_pattern: PeriodicPattern = field(init=False, repr=False, compare=False)
    cols_pattern: PeriodicPattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        rows = tuple(int(r) for r in self.rows)
        cols = tuple(int(c) for c in self.cols)
        object.__setattr__(self, "rows", rows)
        object.__setattr__(self, "cols", cols)
        object.__setattr__(self, "rows_pattern", PeriodicPattern.from_list(rows))
        object.__setattr__(self, "cols_pattern", PeriodicPattern.from_list(cols))
        if not 0 <= self.common_dim < 1 << 32:
            raise Int7Error(f"config: common_dim {self.common_dim} does not fit in u32")
        if not 0 <= self.rank < 1 << 16:
            raise Int7Error(f"config: rank {self.rank} does not fit in u16")
        if not 0 <= self.experts < 1 << 16 or not 0 <= self.top_k < 1 << 16:
            raise Int7Error("config: experts and top_k must fit in u16")
        if self.experts == 0 and self.top_k != 0:
            raise Int7Error("config: top_k must be 0 for a dense (experts = 0) configuration")

    @classmethod
    def from_patterns(cls, common_dim: int, rank: int, rows_pattern: PeriodicPattern,
                      cols_pattern: PeriodicPattern, experts: int = 0, top_k: int = 0) -> "MiningConfig":
        return cls(common_dim, rank, rows_pattern.to_list(), cols_pattern.to_list(), experts, top_k)

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def h(self) -> int:
        return self.rows_pattern.size

    @property
    def w(self) -> int:
        return self.cols_pattern.size

    @property
    def dot_product_length(self) -> int:
        """D = k − (k mod r): the transcript ignores the last partial rank chunk."""
        return self.common_dim - self.common_dim % self.rank if self.rank else 0

    def to_bytes(self) -> bytes:
        trailer = struct.pack("<HH", self.experts, self.top_k) + bytes(28)
        return (struct.pack("<IHH", self.common_dim, self.rank, MMA_INT7_INT7_TO_INT32)
                + self.rows_pattern.to_bytes() + self.cols_pattern.to_bytes() + trailer)

    @classmethod
    def from_bytes(cls, data: bytes) -> "MiningConfig":
        """Decode 52 bytes; rejects a non-zero mma_type, non-zero padding and non-canonical patterns."""
        if len(data) != CONFIG_SIZE:
            raise Int7Error(f"config: expected {CONFIG_SIZE} bytes, got {len(data)}")
        common_dim, rank, mma = struct.unpack_from("<IHH", data, 0)
        if mma != MMA_INT7_INT7_TO_INT32:
            raise Int7Error(f"config: mma_type {mma} is not Int7xInt7ToInt32 (0)")
        experts, top_k = struct.unpack_from("<HH", data, 20)
        if any(data[24:]):
            raise Int7Error("config: reserved trailer bytes must be zero")
        config = cls.from_patterns(common_dim, rank, PeriodicPattern.from_bytes(data[8:14]),
                                   PeriodicPattern.from_bytes(data[14:20]), experts, top_k)
        if config.to_bytes() != bytes(data):
            raise Int7Error("config: encoding does not round-trip")
        return config

    def check_limits(self) -> None:
        """Raise Int7Error naming the first protocol limit (sanity_checks.rs) this config breaks."""
        k, r, h, w = self.common_dim, self.rank, self.h, self.w
        if r & (r - 1) or not MIN_RANK <= r <= MAX_RANK:
            raise Int7Error(f"config: rank must be a power of two in [32, 1024], got {r}")
        if r % TILE_D:
            raise Int7Error(f"config: rank must be a multiple of {TILE_D}, got {r}")
        if k > MAX_COMMON_DIM or k % 64 or k < MIN_COMMON_DIM:
            raise Int7Error(f"config: common_dim must be a multiple of 64 in [1024, 65536], got {k}")
        if k > 4 * r * r or k < 16 * r:
            raise Int7Error(f"config: common_dim must satisfy 16·r <= k <= 4·r², got k={k} r={r}")
        if h % TILE_H or w % TILE_H:
            raise Int7Error(f"config: tile height and width must be even, got h={h} w={w}")
        if not MIN_TILE_SIZE <= h * w <= MAX_TILE_SIZE:
            raise Int7Error(f"config: tile size h·w must be in [32, 256], got {h * w}")
        if self.dot_product_length % DWORD_SIZE:
            raise Int7Error("config: dot product length must be a multiple of 4")
        if (h + w) * self.dot_product_length > MAX_WORKER_INPUT:
            raise Int7Error("config: (h + w)·D exceeds 4 MiB")
        if self.is_moe:
            if self.experts > MAX_EXPERTS:
                raise Int7Error(f"config: {self.experts} experts exceed the maximum {MAX_EXPERTS}")
            if not 0 < self.top_k < self.experts:
                raise Int7Error(f"config: MoE needs 0 < top_k < experts, got top_k={self.top_k}")
