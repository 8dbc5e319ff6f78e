"""The FP8 lottery: tiles, lanes, the fold extractor, the ticket and the threshold (§9).

A lottery tile is h rows of A × w rows of B of the pre-peel accumulator A'·B'ᵀ. Its 16 lanes each
fold one subtile's raw fp32 bit patterns into a u32; the 16 lanes are one 64-byte BLAKE3 block,
hashed under the jackpot key. A tile wins iff LE256(J) <= min(target·h·w·k, 2^256 − 1).
"""
from __future__ import annotations

from functools import lru_cache

import blake3
import numpy as np

from proof.fp8.params import JACKPOT_LANES, AxisPattern, ParamsError
from proof.fp8.transcript import jackpot_key

FOLD_MULTIPLIER = 0x9E3779B1
FOLD_ROTATION = 13
MESSAGE_SIZE = 64
MAX_U256 = (1 << 256) - 1


def tile_indices(pattern: AxisPattern, base: int) -> list[int]:
    """The rows one axis of a tile opens: base + the pattern's sorted tile offsets."""
    if not pattern.offset_is_valid(base):
        raise ParamsError(f"{base} is not a valid tile base for {pattern!r}")
    return [base + o for o in pattern.tile_offsets()]


def tile_bases(pattern: AxisPattern, num_rows: int) -> list[int]:
    """Every valid tile base whose whole tile lies in [0, num_rows), ascending."""
    lattice = pattern.valid_offsets()
    out = []
    for period_start in range(0, num_rows, pattern.total):
        for point in lattice:
            base = period_start + point
            if base + pattern.tile_max < num_rows:
                out.append(base)
    return out


def tile_base(pattern: AxisPattern, index: int) -> int:
    """The base of tile number `index` along one axis (a GPU hit record's TILE_ROW / TILE_COLUMN).

    Tiles are numbered in ascending base order: lattice point index % |lattice| of period
    index // |lattice|. For the official patterns (no Null dims) this is index · tile size.
    """
    if index < 0:
        raise ParamsError(f"tile index {index} must be non-negative")
    lattice = pattern.valid_offsets()
    return index // len(lattice) * pattern.total + lattice[index % len(lattice)]


def parse_tile_base(indices: list[int], pattern: AxisPattern) -> int:
    """Inverse of tile_indices: the base of an opened index list, or ParamsError if it is no tile."""
    if not indices:
        raise ParamsError("no opened indices")
    if any(x >= y for x, y in zip(indices, indices[1:])):
        raise ParamsError("opened indices are not strictly increasing")
    base = indices[0]
    if not pattern.offset_is_valid(base):
        raise ParamsError(f"offset {base} is not a valid tile base for the committed pattern")
    if list(indices) != [base + o for o in pattern.tile_offsets()]:
        raise ParamsError(f"opened indices do not form the committed tile at base {base}")
    return base


@lru_cache(maxsize=64)
def _lanes(rows: AxisPattern, cols: AxisPattern) -> np.ndarray:
    def subtiles(axis: AxisPattern) -> list[list[int]]:
        position = {o: i for i, o in enumerate(axis.tile_offsets())}
        return [[position[f + b] for f in axis.fold_offsets()] for b in axis.blake_offsets()]

    w = cols.tile_size
    lanes = [[r * w + c for r in row_sub for c in col_sub]
             for row_sub in subtiles(rows) for col_sub in subtiles(cols)]
    return np.array(lanes, dtype=np.int64)


def lane_assignment(rows: AxisPattern, cols: AxisPattern) -> list[list[int]]:
    """For each of the 16 lanes, its flat h×w tile cells in fold order.

    Lane = rank(blake_row)·|blake_cols| + rank(blake_col); its cells are the subtile's rows ×
    columns, row-major over the sorted fold offsets.
    """
    if rows.blake_size * cols.blake_size != JACKPOT_LANES:
        raise ParamsError(f"the patterns select {rows.blake_size * cols.blake_size} lanes, not 16")
    return _lanes(rows, cols).tolist()


def fold_message(tile_fp32: np.ndarray, rows: AxisPattern, cols: AxisPattern) -> bytes:
    """The 64-byte lottery message of one tile.

    `tile_fp32` is h×w float32 in the tile's sorted offset order. Each lane starts at 0 and absorbs
    the raw fp32 bit patterns (so +0 and −0 differ): lane = rotl32(lane·0x9E3779B1 + word, 13).
    """
    tile = np.ascontiguousarray(tile_fp32, dtype=np.float32)
    if tile.shape != (rows.tile_size, cols.tile_size):
        raise ParamsError(f"tile shape {tile.shape} does not match the layout "
                          f"{(rows.tile_size, cols.tile_size)}")
    lane_assignment(rows, cols)  # validates the lane count
    words = tile.view(np.uint32).ravel()[_lanes(rows, cols)].astype(np.uint64)
    lanes = np.zeros(JACKPOT_LANES, dtype=np.uint64)
    mask = np.uint64(0xFFFFFFFF)
    for column in words.T:
        x = (lanes * np.uint64(FOLD_MULTIPLIER) + column) & mask
        lanes = ((x << np.uint64(FOLD_ROTATION)) | (x >> np.uint64(32 - FOLD_ROTATION))) & mask
    return lanes.astype("<u4").tobytes()


def ticket(seed_a: bytes, message: bytes) -> bytes:
    """J = BLAKE3(msg64; key = Subkey("jackpot", seedA))."""
    if len(message) != MESSAGE_SIZE:
        raise ValueError(f"a lottery message is {MESSAGE_SIZE} bytes, got {len(message)}")
    return ticket_with_key(jackpot_key(seed_a), message)


def ticket_with_key(pow_key: bytes, message: bytes) -> bytes:
    """The ticket under an already derived jackpot key (one keyed compression)."""
    return blake3.blake3(bytes(message), key=bytes(pow_key)).digest()


def threshold(target: int, h: int, w: int, k: int) -> int:
    """min(target·h·w·k, 2^256 − 1): the difficulty target scaled by the tile's work."""
    if target < 0:
        raise ValueError("target must be non-negative")
    return min(target * h * w * k, MAX_U256)


def is_winner(ticket_: bytes, threshold_: int) -> bool:
    """A ticket wins iff it read as a little-endian 256-bit integer is <= the threshold."""
    return int.from_bytes(ticket_, "little") <= threshold_


def threshold_bytes(threshold_: int) -> bytes:
    """The threshold as the 32-byte little-endian value the GPU compares against."""
    return threshold_.to_bytes(32, "little")


def credited_work(m: int, n: int, k: int) -> int:
    """Difficulty-normalized work of one dense launch (the tile area cancels out)."""
    return m * n * k


def credited_work_moe(expert_rows: list[int], n_e: int, k: int, tile_rows: int) -> int:
    """MoE credit: whole tiles per expert × n_e × k (an expert's partial tail tile is never mined)."""
    return sum(rows // tile_rows * tile_rows for rows in expert_rows) * n_e * k
