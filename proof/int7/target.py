"""Jackpot bounds from compact targets (int-protocol.md §5.4, node-consensus.md §3.2)."""
from __future__ import annotations

from ..chain import target_from_bits
from .config import MiningConfig
from .errors import Int7Error

PENALTY_BASE_RANK = 128
MAX_U256 = (1 << 256) - 1


def _scaled(bits: int, factor: int) -> int:
    return min(target_from_bits(bits) * factor, MAX_U256)


def unpenalized_bound(bits: int, config: MiningConfig) -> int:
    """T0·h·w·D saturating at 2^256 − 1: the bound the plain and ZK verifiers apply."""
    return _scaled(bits, config.h * config.w * config.dot_product_length)


def penalized_bound(bits: int, config: MiningConfig) -> int:
    """T0·h·w·⌊D/r⌋·128 saturating at 2^256 − 1: the node's rank-penalty bound (needs r >= 128)."""
    if config.rank < PENALTY_BASE_RANK:
        raise Int7Error(f"rank penalty: rank must be >= {PENALTY_BASE_RANK}, got {config.rank}")
    factor = config.h * config.w * (config.dot_product_length // config.rank) * PENALTY_BASE_RANK
    if factor == 0:
        raise Int7Error("rank penalty: degenerate configuration (h·w·⌊D/r⌋ = 0)")
    return _scaled(bits, factor)


def ticket_value(ticket: bytes) -> int:
    """The ticket as the little-endian 256-bit integer compared with a bound."""
    if len(ticket) != 32:
        raise Int7Error(f"ticket must be 32 bytes, got {len(ticket)}")
    return int.from_bytes(ticket, "little")


def meets_bound(ticket: bytes, bound: int) -> bool:
    """The lottery test: LE(ticket) <= bound (inclusive)."""
    return ticket_value(ticket) <= bound
