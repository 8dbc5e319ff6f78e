"""Verify-time benchmark: `python -m proof.int7.bench [--k 4096] [--repeats 5]`.

Mines a dense V3 proof at an easy target (default configuration: rank 128, 4 × 8 tiles) and times
verify_plain_proof, which must stay under one second at k = 4096 on one CPU core.
"""
from __future__ import annotations

import argparse
import statistics
import time

from .config import MiningConfig
from .miner import mine_cpu
from .plain_proof import PlainProof
from .verifier import verify_plain_proof

HEADER = bytes(4) + bytes([1]) * 32 + bytes([2]) * 32 + bytes.fromhex("66666666") + bytes.fromhex("ffff7f20")
EASY_BITS = 0x207FFFFF
BUDGET_S = 1.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=4096, help="common dimension")
    parser.add_argument("--rank", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    config = MiningConfig(args.k, args.rank, [0, 8, 64, 72], [0, 1, 8, 9, 32, 33, 40, 41])
    started = time.perf_counter()
    proof = mine_cpu(HEADER, config, m=128, n=64, bits=EASY_BITS, cert_version=3)
    mined_s = time.perf_counter() - started
    wire = proof.to_bytes()
    times = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        ok, reason = verify_plain_proof(HEADER, PlainProof.from_bytes(wire), bits=EASY_BITS, cert_version=3)
        times.append(time.perf_counter() - started)
        if not ok:
            print(f"verification failed: {reason}")
            return 1
    median = statistics.median(times)
    print(f"k={args.k} rank={args.rank} proof={len(wire)} bytes mine={mined_s:.2f}s "
          f"verify median={median * 1e3:.1f} ms max={max(times) * 1e3:.1f} ms "
          f"({'within' if median < BUDGET_S else 'OVER'} the {BUDGET_S:.0f} s budget)")
    return 0 if median < BUDGET_S else 1


if __name__ == "__main__":
    raise SystemExit(main())
