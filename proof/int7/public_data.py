"""Public data: the certificate's statement (164 bytes dense, plus the MoE tail), int-protocol.md §8.5.

config 52 | hash_a 32 | hash_b 32 | hash_jackpot 32 | m u32 | n u32 | t_rows u32 | t_cols u32, then
for MoE: expert_idx u16 | e × routing end offset u32 | hash_routing 32 | outer_count u8 |
outer_count × u32 outer indices. All little-endian; t_rows/t_cols are expert-local for MoE.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from .config import CONFIG_SIZE, MAX_EXPERTS, MiningConfig
from .errors import Int7Error

PUBLIC_DATA_SIZE = 164
MIN_MOE_PUBLIC_DATA_SIZE = 199
MAX_OUTER_INDICES = 128
MAX_PUBLIC_DATA_SIZE = MIN_MOE_PUBLIC_DATA_SIZE + MAX_OUTER_INDICES * 4 + MAX_EXPERTS * 4
JACKPOT_OFFSET = CONFIG_SIZE + 64


@dataclass(frozen=True)
class PublicData:
    """The public statement of a proof; the MoE fields are empty for a dense proof."""

    config: MiningConfig
    hash_a: bytes
    hash_b: bytes
    hash_jackpot: bytes
    m: int
    n: int
    t_rows: int
    t_cols: int
    expert_idx: int = 0
    routing_offsets: tuple[int, ...] = ()
    hash_routing: bytes = b""
    outer_indices: tuple[int, ...] = ()

    @property
    def is_moe(self) -> bool:
        return self.config.is_moe

    def to_bytes(self) -> bytes:
        for name in ("hash_a", "hash_b", "hash_jackpot"):
            if len(getattr(self, name)) != 32:
                raise Int7Error(f"public data: {name} must be 32 bytes")
        for name in ("m", "n", "t_rows", "t_cols"):
            if not 0 <= getattr(self, name) < 1 << 32:
                raise Int7Error(f"public data: {name} does not fit in u32")
        out = (self.config.to_bytes() + self.hash_a + self.hash_b + self.hash_jackpot
               + struct.pack("<4I", self.m, self.n, self.t_rows, self.t_cols))
        if not self.is_moe:
            if self.routing_offsets or self.outer_indices or self.hash_routing:
                raise Int7Error("public data: a dense configuration cannot carry MoE fields")
            return out
        if len(self.routing_offsets) != self.config.experts:
            raise Int7Error(f"public data: {len(self.routing_offsets)} routing offsets for "
                            f"{self.config.experts} experts")
        if len(self.outer_indices) > MAX_OUTER_INDICES:
            raise Int7Error(f"public data: more than {MAX_OUTER_INDICES} outer indices")
        if len(self.hash_routing) != 32:
            raise Int7Error("public data: hash_routing must be 32 bytes")
        try:
            tail = (struct.pack("<H", self.expert_idx)
                    + struct.pack(f"<{len(self.routing_offsets)}I", *self.routing_offsets)
                    + self.hash_routing + bytes((len(self.outer_indices),))
                    + struct.pack(f"<{len(self.outer_indices)}I", *self.outer_indices))
        except struct.error as error:
            raise Int7Error(f"public data: MoE field out of range ({error})") from None
        return out + tail

    @classmethod
    def from_bytes(cls, data: bytes) -> "PublicData":
        """Parse and validate (lengths, offsets, canonical round trip), as Pearl's from_wire_bytes."""
        data = bytes(data)
        if len(data) < PUBLIC_DATA_SIZE:
            raise Int7Error(f"public data: {len(data)} bytes, need at least {PUBLIC_DATA_SIZE}")
        config, jackpot = config_and_jackpot(data)
        m, n, t_rows, t_cols = struct.unpack_from("<4I", data, 148)
        fields = dict(config=config, hash_a=data[52:84], hash_b=data[84:116], hash_jackpot=jackpot,
                      m=m, n=n, t_rows=t_rows, t_cols=t_cols)
        if len(data) == PUBLIC_DATA_SIZE:
            if config.is_moe:
                raise Int7Error("public data: the configuration is MoE but there is no MoE tail")
        else:
            if not config.is_moe:
                raise Int7Error("public data: an MoE tail but the configuration is dense")
            fields.update(_parse_moe_tail(data, config.experts))
        if not config.rows_pattern.offset_is_valid(t_rows) or t_rows >= m:
            raise Int7Error(f"public data: t_rows {t_rows} is not a valid row tile offset below m")
        if not config.cols_pattern.offset_is_valid(t_cols) or t_cols >= n:
            raise Int7Error(f"public data: t_cols {t_cols} is not a valid column tile offset below n")
        parsed = cls(**fields)
        if parsed.to_bytes() != data:
            raise Int7Error("public data: encoding does not round-trip")
        return parsed


def _parse_moe_tail(data: bytes, experts: int) -> dict:
    if experts > MAX_EXPERTS:
        raise Int7Error(f"public data: {experts} experts exceed the maximum {MAX_EXPERTS}")
    if len(data) < MIN_MOE_PUBLIC_DATA_SIZE + 4 * experts:
        raise Int7Error("public data: MoE tail truncated")
    pos = PUBLIC_DATA_SIZE
    (expert_idx,) = struct.unpack_from("<H", data, pos)
    offsets = struct.unpack_from(f"<{experts}I", data, pos + 2)
    pos += 2 + 4 * experts
    hash_routing = data[pos:pos + 32]
    count = data[pos + 32]
    pos += 33
    if count > MAX_OUTER_INDICES:
        raise Int7Error(f"public data: {count} outer indices exceed the maximum {MAX_OUTER_INDICES}")
    if len(data) != pos + 4 * count:
        raise Int7Error(f"public data: MoE length {len(data)} does not match {count} outer indices")
    return dict(expert_idx=expert_idx, routing_offsets=tuple(offsets), hash_routing=hash_routing,
                outer_indices=struct.unpack_from(f"<{count}I", data, pos))


def config_and_jackpot(data: bytes) -> tuple[MiningConfig, bytes]:
    """Only the shared prefix (config, jackpot), as the node's rank-penalty check reads it."""
    if len(data) < PUBLIC_DATA_SIZE:
        raise Int7Error(f"public data: {len(data)} bytes, need at least {PUBLIC_DATA_SIZE}")
    return MiningConfig.from_bytes(data[:CONFIG_SIZE]), bytes(data[JACKPOT_OFFSET:JACKPOT_OFFSET + 32])
