"""Noise factors and noised operands, bit-exact with Pearl's pearl_noise.rs (int-protocol.md §4).

E_A = U_A·P_Aᵀ (m × k) and E_B = P_B·U_Bᵀ (k × n), where U is a uniform [−32, 31] factor with
`rank` columns and P a sparse ±1 factor (one +1 and one −1 per row of length k).
"""
from __future__ import annotations

import struct
from typing import Sequence

import blake3
import numpy as np

from .errors import Int7Error

LABEL_A = b"A_tensor" + bytes(24)
LABEL_B = b"B_tensor" + bytes(24)
UNIFORM_SLOT = 0
SPARSE_SLOT = 1
RANGE_MASK = 0x3F
ZERO_POINT = 32
WORDS_PER_BLOCK = 8


def prng_block(index: int, label: bytes, key: bytes, slot: int) -> bytes:
    """G(index, label, key, slot): keyed BLAKE3 of eight i32 slots (slot `slot` = index + 1) ‖ label."""
    slots = [0] * WORDS_PER_BLOCK
    slots[slot] = index + 1
    return blake3.blake3(struct.pack("<8i", *slots) + label, key=key).digest()


def _check_rank(rank: int) -> None:
    if rank < 32 or rank & (rank - 1):
        raise Int7Error(f"noise rank must be a power of two >= 32, got {rank}")


def uniform_factor(key: bytes, label: bytes, row_indices: Sequence[int], rank: int) -> np.ndarray:
    """Rows `row_indices` of the uniform factor (len × rank, int8 in [−32, 31]).

    The factor is a flat row-major byte stream; byte f comes from block f // 32, byte f mod 32.
    """
    _check_rank(rank)
    blocks_per_row = rank // 32
    out = np.empty((len(row_indices), rank), dtype=np.int8)
    for i, row in enumerate(row_indices):
        first = int(row) * blocks_per_row
        raw = b"".join(prng_block(first + b, label, key, UNIFORM_SLOT) for b in range(blocks_per_row))
        out[i] = (np.frombuffer(raw, dtype=np.uint8) & RANGE_MASK).astype(np.int8) - ZERO_POINT
    return out


def sparse_factor(key: bytes, label: bytes, k: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """The sparse ±1 factor as two int64 arrays of length k: row l has +1 at first[l], −1 at second[l]."""
    _check_rank(rank)
    blocks = -(-k // WORDS_PER_BLOCK)
    raw = b"".join(prng_block(i, label, key, SPARSE_SLOT) for i in range(blocks))
    words = np.frombuffer(raw, dtype="<u4")[:k].astype(np.uint64)
    first = words & np.uint64(rank - 1)
    second = first ^ (np.uint64(1) + ((np.uint64(rank - 1) * words) >> np.uint64(32)))
    return first.astype(np.int64), second.astype(np.int64)


def apply_sparse(uniform: np.ndarray, first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """U·Pᵀ row by row: out[i][l] = U[i][first[l]] − U[i][second[l]] (int8, in [−63, 63])."""
    return (uniform[:, first].astype(np.int16) - uniform[:, second]).astype(np.int8)


def noise_a_rows(s_a: bytes, k: int, rank: int, rows: Sequence[int]) -> np.ndarray:
    """Rows `rows` (global token indices) of E_A, len(rows) × k int8."""
    first, second = sparse_factor(s_a, LABEL_A, k, rank)
    return apply_sparse(uniform_factor(s_a, LABEL_A, rows, rank), first, second)


def noise_b_cols(s_b: bytes, k: int, rank: int, cols: Sequence[int]) -> np.ndarray:
    """Columns `cols` (global Bᵀ rows) of E_B, returned transposed: len(cols) × k int8."""
    first, second = sparse_factor(s_b, LABEL_B, k, rank)
    return apply_sparse(uniform_factor(s_b, LABEL_B, cols, rank), first, second)


def noised(values: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """A' = A + E (int8 operands in [−64, 64] plus noise in [−63, 63] stay in [−127, 127])."""
    return (values.astype(np.int16) + noise).astype(np.int8)
