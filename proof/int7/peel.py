"""The peel: recover A·B from the noised product A'·B' (int-protocol.md §6).

With A' = A + U_A·P_Aᵀ and B' = B + P_B·U_Bᵀ:
    A·B = A'·B' − (A·P_B)·U_Bᵀ − U_A·(P_Aᵀ·B').
All arithmetic is int64; the factors come from noise.uniform_factor / noise.sparse_factor.
"""
from __future__ import annotations

import numpy as np

from .errors import Int7Error


def sparse_matrix(first: np.ndarray, second: np.ndarray, rank: int) -> np.ndarray:
    """The dense k × rank ±1 matrix P (row l: +1 at first[l], −1 at second[l]), int64."""
    k = len(first)
    p = np.zeros((k, rank), dtype=np.int64)
    p[np.arange(k), first] = 1
    p[np.arange(k), second] = -1
    return p


def peel(noised_product: np.ndarray, a: np.ndarray, b_noised: np.ndarray, u_a: np.ndarray,
         p_a: tuple[np.ndarray, np.ndarray], u_b: np.ndarray,
         p_b: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """A·B (int64) from A'·B' (m × n), A (m × k), B' (k × n), U_A (m × r), U_B (n × r), P_A, P_B.

    For MoE pass the expert's rows of A and U_A and its columns of B' and U_B (the gather).
    """
    m, n = noised_product.shape
    k = a.shape[1]
    rank = u_a.shape[1]
    if a.shape[0] != m or b_noised.shape != (k, n) or u_a.shape[0] != m or u_b.shape != (n, rank):
        raise Int7Error("peel: operand shapes do not agree")
    pa = sparse_matrix(*p_a, rank)
    pb = sparse_matrix(*p_b, rank)
    a_pb = a.astype(np.int64) @ pb  # m × r
    pa_b = pa.T @ b_noised.astype(np.int64)  # r × n
    return (noised_product.astype(np.int64) - a_pb @ u_b.astype(np.int64).T
            - u_a.astype(np.int64) @ pa_b)
