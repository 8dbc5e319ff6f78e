"""The fields of INT (V1–V3) public data that pearld's rank-penalty rule reads (node-consensus.md §3.2).

Only what the node reads is here: the 52-byte mining configuration at offset 0 and the jackpot at
bytes [116, 148) (a little-endian U256). The bound itself is proof.int7's ``penalized_bound``.
"""
from __future__ import annotations

from proof.int7 import Int7Error, MiningConfig, penalized_bound

PUBLIC_DATA_SIZE_DENSE = 164
PUBLIC_DATA_MAX_V2 = 4807
CONFIG_SIZE = 52
JACKPOT_OFFSET = 116
PENALTY_BASE_RANK = 128


class PublicDataError(ValueError):
    """Public data too short or malformed to read the rank-penalty fields from."""


def read_config_and_jackpot(public_data: bytes) -> tuple[MiningConfig, int]:
    """The mining configuration and the jackpot (as an integer) of INT public data."""
    size = len(public_data)
    if not PUBLIC_DATA_SIZE_DENSE <= size <= PUBLIC_DATA_MAX_V2:
        raise PublicDataError(f"invalid public_data_len {size}")
    try:
        config = MiningConfig.from_bytes(bytes(public_data[:CONFIG_SIZE]))
    except Int7Error as exc:
        raise PublicDataError(str(exc)) from exc
    jackpot = int.from_bytes(public_data[JACKPOT_OFFSET:JACKPOT_OFFSET + 32], "little")
    return config, jackpot


def rank_penalty_violation(bits: int, public_data: bytes) -> str | None:
    """None when the rank-penalty rule holds, else the error text pearld's CheckRankPenalty returns."""
    if not public_data:
        return "empty public data"
    try:
        config, jackpot = read_config_and_jackpot(public_data)
    except PublicDataError as exc:
        return f"rank penalty rule violated: {exc}"
    if config.rank < PENALTY_BASE_RANK:
        return f"rank penalty rule violated: Rank must be >= {PENALTY_BASE_RANK} || r={config.rank}"
    if config.dot_product_length == 0:
        return (
            "rank penalty rule violated: Degenerate mining configuration: "
            f"h*w={config.h * config.w} dot_product_length={config.dot_product_length}"
        )
    if jackpot > penalized_bound(bits, config):
        return (
            "rank penalty rule violated: Jackpot condition not satisfied: "
            "hash does not meet the rank-penalized difficulty target"
        )
    return None
