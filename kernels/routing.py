"""Expert group sizes for tests and benchmarks: the routings grouped-gemm-anchors.md §6 names.

All routings of one call carry the same total number of tokens (num_experts * tokens_per_expert),
so timings across routings compare like with like.
"""
from __future__ import annotations

from enum import Enum

import numpy as np

class Routing(str, Enum):
    UNIFORM = "uniform"  # every expert the same count
    PM50 = "pm50"  # uniform +-50% at random, unaligned
    ZIPF = "zipf"  # Zipf-like: hottest expert 4-8x the mean, ~10% of experts empty
    HOT = "hot"  # one expert takes every token, the others are empty
    UNALIGNED = "unaligned"  # small odd counts (1, 3, 17, ...) around the mean


def group_sizes(routing: Routing | str, num_experts: int, tokens_per_expert: int,
                seed: int = 0) -> list[int]:
    """Per-expert token counts summing to num_experts * tokens_per_expert."""
    routing = Routing(routing)
    if num_experts <= 0 or tokens_per_expert < 0:
        raise ValueError(f"need num_experts > 0 and tokens_per_expert >= 0, got "
                         f"{num_experts}, {tokens_per_expert}")
    total = num_experts * tokens_per_expert
    rng = np.random.default_rng(seed)
    if routing is Routing.UNIFORM:
        return [tokens_per_expert] * num_experts
    if routing is Routing.HOT:
        sizes = [0] * num_experts
        sizes[int(rng.integers(num_experts))] = total
        return sizes
    if routing is Routing.PM50:
        weights = rng.uniform(0.5, 1.5, num_experts)
    elif routing is Routing.ZIPF:
        weights = 1.0 / np.arange(1, num_experts + 1) ** 1.1
        weights[-max(1, num_experts // 10):] = 0.0
        cap = 6.0 * weights.sum() / num_experts  # the hottest at ~6x the mean
        weights = np.minimum(weights, cap)
        rng.shuffle(weights)
    else:  # UNALIGNED
        weights = rng.uniform(0.2, 1.8, num_experts)
    return _apportion(weights, total, odd=routing is Routing.UNALIGNED)


def _apportion(weights: np.ndarray, total: int, odd: bool) -> list[int]:
    """Integer counts proportional to weights with an exact sum (largest remainders)."""
    ideal = weights / weights.sum() * total
    sizes = np.floor(ideal).astype(np.int64)
    order = np.argsort(-(ideal - sizes), kind="stable")
    sizes[order[: total - int(sizes.sum())]] += 1
    if odd:  # move one token between neighbours so counts are odd where possible
        for i in range(0, len(sizes) - 1, 2):
            if sizes[i] % 2 == 0 and sizes[i + 1] > 0:
                sizes[i] += 1
                sizes[i + 1] -= 1
    return [int(s) for s in sizes]


def offsets_from_sizes(sizes: list[int]) -> np.ndarray:
    """(E+1,) int32 row offsets: offsets[e] is expert e's first row."""
    if any(s < 0 for s in sizes):
        raise ValueError("group sizes must be non-negative")
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
