"""The GPU pass's lottery tiles (2 rows × the GEMM's 128-column block) are valid protocol
configurations: canonical pattern encodings, the limits, and CPU-mined / planted proofs with that
config verify with proof.int7 (dense V3 and MoE V2)."""
import struct

import numpy as np
import pytest

from kernels.int7.mined_gemm import TILE_H, lottery_tile
from proof.int7 import (Int7Error, MiningConfig, PeriodicPattern, build_proof, commit_instance,
                        instance_tickets, mine_cpu, ticket_value, verify_plain_proof)

EASY_BITS = 0x207FFFFF  # every ticket meets T0·h·w·D
HEADER = struct.pack("<I", 0) + b"\x01" * 32 + b"\x02" * 32 + struct.pack("<II", 0x66666666, EASY_BITS)


def test_tile_patterns_are_canonical_and_round_trip():
    rows = PeriodicPattern.from_list(list(range(TILE_H)))
    cols = PeriodicPattern.from_list(list(range(128)))
    assert rows.shape == ((1, 2), (2, 1), (2, 1)) and rows.to_bytes().hex() == "000100000000"
    assert cols.shape == ((1, 128), (128, 1), (128, 1)) and cols.to_bytes().hex() == "007f00000000"
    assert all(rows.offset_is_valid(t) == (t % 2 == 0) for t in range(8))
    assert all(cols.offset_is_valid(t) == (t % 128 == 0) for t in range(512))
    config = MiningConfig(6144, 128, list(range(2)), list(range(128)))
    assert (config.h, config.w) == (2, 128) and MiningConfig.from_bytes(config.to_bytes()) == config
    config.check_limits()


@pytest.mark.parametrize("k", [6144, 7168, 4096, 32256])
def test_bench_tiles_keep_the_protocol_limits(k):
    h, w = lottery_tile(4096, k, 128)
    assert (h, w) == (2, 128)
    MiningConfig(k, 128, list(range(h)), list(range(w))).check_limits()


def test_past_the_input_limit_the_width_halves():
    h, w = lottery_tile(4096, 32768, 128)  # (2 + 128) · 32768 > 2^22
    assert (h, w) == (2, 64)
    MiningConfig(32768, 128, list(range(h)), list(range(w))).check_limits()
    with pytest.raises(Int7Error, match="4 MiB"):
        MiningConfig(32768, 128, list(range(2)), list(range(128))).check_limits()


def test_cpu_mined_dense_v3_proof_with_gpu_tiles_verifies():
    config = MiningConfig(2048, 128, list(range(2)), list(range(128)))
    proof = mine_cpu(HEADER, config, m=4, n=256, bits=EASY_BITS, cert_version=3, seed=5)
    assert len(proof.bt.row_indices) == 128 and len(proof.a.row_indices) == 2
    assert verify_plain_proof(HEADER, proof, bits=EASY_BITS, cert_version=3) == (True, "ok")


def test_planted_tiles_with_gpu_geometry_verify():
    """Dense V3: the best tile of an instance (its last column block); MoE V2: w = 64 < N = 128."""
    rng = np.random.default_rng(9)
    dense = MiningConfig(2048, 128, list(range(2)), list(range(128)))
    a = rng.integers(-64, 65, (4, 2048), dtype=np.int8)
    bt = rng.integers(-64, 65, (256, 2048), dtype=np.int8)
    instance = commit_instance(HEADER, dense, a, bt, cert_version=3)
    wins = list(instance_tickets(instance))
    assert sorted((w.t_rows, w.t_cols) for w in wins) == [(0, 0), (0, 128), (2, 0), (2, 128)]
    for win in (min(wins, key=lambda w: ticket_value(w.ticket)), wins[-1]):
        proof = build_proof(instance, win)
        assert verify_plain_proof(HEADER, proof, bits=EASY_BITS, cert_version=3) == (True, "ok")

    h, w = lottery_tile(128, 2048, 128, moe=True)
    moe = MiningConfig(2048, 128, list(range(h)), list(range(w)), experts=4, top_k=2)
    tokens = 8
    routing = [[t for t in range(tokens) if t % 2 == e % 2] for e in range(4)]
    instance = commit_instance(HEADER, moe, rng.integers(-64, 65, (tokens, 2048), dtype=np.int8),
                               rng.integers(-64, 65, (4 * 128, 2048), dtype=np.int8), cert_version=2,
                               routing=routing)
    win = min(instance_tickets(instance), key=lambda t: ticket_value(t.ticket))
    assert verify_plain_proof(HEADER, build_proof(instance, win), bits=EASY_BITS, cert_version=2) == (True, "ok")
