"""The INT transcript ("jackpot") and the ticket (int-protocol.md §5.2–5.3).

For a tile T, S_ij(c) = Σ_{l < (c+1)·r} A'[i][l]·B'[l][j] (exact, never reset); at each chunk c the
tile's S values are XOR-ed into X_c and J[c mod 16] ← rotl13(J[c mod 16]) ⊕ X_c. The ticket is
keyed BLAKE3 of the 16 words (LE) under s_A. Every function works on noised operands.
"""
from __future__ import annotations

import blake3
import numpy as np

from .errors import Int7Error
from .pattern import PeriodicPattern

JACKPOT_WORDS = 16
ROTATION = 13


def chunk_dot_products(a: np.ndarray, bt: np.ndarray, rank: int) -> np.ndarray:
    """Cumulative dot products S(c) for every chunk c < D/r: (chunks, rows of a, rows of bt) int64.

    `a` is m × k and `bt` n × k (Bᵀ rows). Each chunk's partial product is at most 127²·1024 < 2^24
    in magnitude, so the float64 matmul is exact; the cumulative sums are then taken in int64.
    """
    if a.ndim != 2 or bt.ndim != 2 or a.shape[1] != bt.shape[1]:
        raise Int7Error(f"transcript: operands must be m × k and n × k, got {a.shape} and {bt.shape}")
    if rank <= 0:
        raise Int7Error(f"transcript: rank must be positive, got {rank}")
    k = a.shape[1]
    chunks = k // rank
    depth = chunks * rank
    a3 = a[:, :depth].astype(np.float64).reshape(a.shape[0], chunks, rank).transpose(1, 0, 2)
    b3 = bt[:, :depth].astype(np.float64).reshape(bt.shape[0], chunks, rank).transpose(1, 2, 0)
    return np.cumsum(np.matmul(a3, b3).astype(np.int64), axis=0)


def fold_chunks(chunk_xors: np.ndarray) -> np.ndarray:
    """Fold per-chunk XORs (chunks, ...) into transcripts (..., 16) uint32 with rotl13-XOR."""
    words = np.zeros((JACKPOT_WORDS,) + chunk_xors.shape[1:], dtype=np.uint32)
    for c in range(chunk_xors.shape[0]):
        w = words[c % JACKPOT_WORDS]
        words[c % JACKPOT_WORDS] = ((w << np.uint32(ROTATION)) | (w >> np.uint32(32 - ROTATION))) ^ chunk_xors[c]
    return np.moveaxis(words, 0, -1)


def tile_transcripts(a: np.ndarray, bt: np.ndarray, rank: int, row_tiles: np.ndarray,
                     col_tiles: np.ndarray) -> np.ndarray:
    """Transcripts of every (row tile, column tile) pair: (T_r, T_c, 16) uint32.

    row_tiles is T_r × h indices into the rows of `a`, col_tiles T_c × w indices into `bt`.
    """
    sums = chunk_dot_products(a, bt, rank).astype(np.uint32)
    by_cols = np.bitwise_xor.reduce(sums[:, :, np.asarray(col_tiles)], axis=-1)  # (chunks, m, T_c)
    xors = np.bitwise_xor.reduce(by_cols[:, np.asarray(row_tiles), :], axis=2)  # (chunks, T_r, T_c)
    return fold_chunks(xors)


def transcript_words(a_tile: np.ndarray, bt_tile: np.ndarray, rank: int) -> np.ndarray:
    """The 16 transcript words of one tile given its h noised A rows and w noised Bᵀ rows."""
    rows = np.arange(a_tile.shape[0])[None, :]
    cols = np.arange(bt_tile.shape[0])[None, :]
    return tile_transcripts(a_tile, bt_tile, rank, rows, cols)[0, 0]


def tile_index_sets(pattern: PeriodicPattern, extent: int) -> tuple[list[int], np.ndarray]:
    """Valid tile offsets along an axis of length `extent` and their index sets (T × size)."""
    offsets = pattern.valid_offsets(extent)
    base = np.array(pattern.to_list(), dtype=np.int64)
    return offsets, np.array(offsets, dtype=np.int64).reshape(-1, 1) + base


def ticket(s_a: bytes, words: np.ndarray) -> bytes:
    """Keyed BLAKE3 (key s_A) of the 16 words as little-endian u32: the lottery ticket."""
    words = np.asarray(words)
    if words.shape != (JACKPOT_WORDS,):
        raise Int7Error(f"ticket: expected 16 transcript words, got shape {words.shape}")
    return blake3.blake3(words.astype("<u4").tobytes(), key=s_a).digest()
