"""Throughput of the numpy keyed chunk tree: `python -m proof.bench_tree [MiB]` prints MB/s."""
from __future__ import annotations

import argparse
import os
import time

from proof.blake3tree import LEAF_SIZES, MerkleTree


def measure(size: int, leaf_size: int, repeats: int) -> float:
    """Best-of-`repeats` MB/s (10^6 bytes per second) for building a whole MerkleTree."""
    data = os.urandom(size)
    key = os.urandom(32)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        MerkleTree(key, data, leaf_size)
        best = min(best, time.perf_counter() - start)
    return size / best / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mib", nargs="?", type=int, default=8, help="data size in MiB (default 8)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for leaf_size in LEAF_SIZES:
        rate = measure(args.mib << 20, leaf_size, args.repeats)
        print(f"leaf {leaf_size:4d}: {rate:7.1f} MB/s ({args.mib} MiB, best of {args.repeats})")


if __name__ == "__main__":
    main()
