"""CPU-mined proofs verify (dense V1–V3, MoE V2–V3); every single corruption is rejected with a
specific reason (int-protocol.md §7–8.2)."""
import dataclasses
import re

import numpy as np
import pytest

from proof.int7 import (Int7Error, MiningConfig, PlainProof, PublicData, build_proof, commit_instance,
                        instance_tickets, instance_transcripts, mine_cpu, noise_a_rows, noise_b_cols, noised,
                        penalized_bound, public_data, ticket_value, transcript_words, unpenalized_bound,
                        verify_plain_proof)

HEADER = bytes(4) + bytes([1]) * 32 + bytes([2]) * 32 + bytes.fromhex("66666666") + bytes.fromhex("ffff7f20")
BITS = 0x1E010000  # regtest PowLimitBits: about one tile in 256 wins
ROWS = [0, 8, 64, 72]
COLS = [0, 1, 8, 9, 32, 33, 40, 41]
DENSE = MiningConfig(2048, 128, ROWS, COLS)
DENSE_V1 = MiningConfig(1024, 64, ROWS, COLS)
MOE = MiningConfig(2048, 128, [0, 1, 2, 3], list(range(8)), experts=4, top_k=2)

CASES = {
    "dense-v1": (DENSE_V1, 1, dict(m=128, n=64)),
    "dense-v2": (DENSE, 2, dict(m=128, n=128)),
    "dense-v3": (DENSE, 3, dict(m=128, n=128)),
    "moe-v2": (MOE, 2, dict(m=32, n=16)),
    "moe-v3": (MOE, 3, dict(m=32, n=16)),
}


@pytest.fixture(scope="module")
def mined():
    return {name: mine_cpu(HEADER, cfg, bits=BITS, cert_version=cv, seed=7, **dims)
            for name, (cfg, cv, dims) in CASES.items()}


@pytest.mark.parametrize("name", CASES)
def test_mined_proof_verifies(mined, name):
    config, cert_version, _ = CASES[name]
    proof = mined[name]
    assert verify_plain_proof(HEADER, proof, bits=BITS, cert_version=cert_version) == (True, "ok")
    assert PlainProof.from_bytes(proof.to_bytes()) == proof
    data = PublicData.from_bytes(public_data(HEADER, proof, cert_version=cert_version))
    assert data.config == config and (data.m, data.n) == (proof.m, proof.n)
    assert ticket_value(data.hash_jackpot) <= unpenalized_bound(BITS, config)
    if cert_version >= 2:
        assert ticket_value(data.hash_jackpot) <= penalized_bound(BITS, config)
    if config.is_moe:
        assert data.outer_indices == proof.a.row_indices and data.t_rows == proof.moe.inner_a_rows[0]
        assert len(public_data(HEADER, proof, cert_version=cert_version)) == 199 + 4 * 4 + 4 * config.h
    else:
        assert len(public_data(HEADER, proof, cert_version=cert_version)) == 164


def test_v1_proof_verifies_from_legacy_bytes_and_at_v3(mined):
    proof = PlainProof.from_bytes(mined["dense-v1"].to_bytes(legacy=True))
    assert verify_plain_proof(HEADER, proof, bits=BITS, cert_version=1) == (True, "ok")
    assert verify_plain_proof(HEADER, proof, bits=0x207FFFFF, cert_version=3) == (True, "ok")


def replace_opening(proof, field, **changes):
    opening = getattr(proof, field)
    return dataclasses.replace(proof, **{field: dataclasses.replace(
        opening, proof=dataclasses.replace(opening.proof, **changes))})


def flip(data: bytes, index: int) -> bytes:
    return data[:index] + bytes([data[index] ^ 1]) + data[index + 1:]


def with_rows(proof, rows):
    return dataclasses.replace(proof, a=dataclasses.replace(proof.a, row_indices=tuple(rows)))


DENSE_CORRUPTIONS = {
    "header byte": (lambda p: (flip(HEADER, 40), p, 3), "A opening: leaves and siblings do not hash"),
    "row index (not periodic)": (lambda p: (HEADER, with_rows(p, [0, 9, 64, 72]), 3), "A rows: pattern"),
    "row index (other tile)": (lambda p: (HEADER, with_rows(p, [r + 1 for r in p.a.row_indices]), 3),
                               "A opening: leaf \\d+ \\(byte \\d+\\) is not opened"),
    "row index (out of range)": (lambda p: (HEADER, with_rows(p, [0, 8, 64, 128]), 3),
                                 "A row index 128 out of range"),
    "leaf byte": (lambda p: (HEADER, replace_opening(p, "a", leaves=(flip(p.a.proof.leaves[0], 5),)
                                                     + p.a.proof.leaves[1:]), 3),
                  "A opening: leaves and siblings do not hash"),
    "sibling": (lambda p: (HEADER, replace_opening(p, "bt", siblings=(flip(p.bt.proof.siblings[0], 0),)
                                                   + p.bt.proof.siblings[1:]), 3),
                "Bt opening: leaves and siblings do not hash"),
    "missing sibling": (lambda p: (HEADER, replace_opening(p, "bt", siblings=p.bt.proof.siblings[1:]), 3),
                        "Bt opening: leaves and siblings do not hash"),
    "root": (lambda p: (HEADER, replace_opening(p, "a", root=bytes(32)), 3),
             "A opening: leaves and siblings do not hash"),
    "config field (rank)": (lambda p: (HEADER, dataclasses.replace(p, rank=64), 3),
                            "A opening: leaves and siblings do not hash"),
    "config field (k)": (lambda p: (HEADER, dataclasses.replace(p, k=4096), 3), "A opening: total_leaves"),
    "config field (bad rank)": (lambda p: (HEADER, dataclasses.replace(p, rank=96), 3), "power of two"),
    "total_leaves": (lambda p: (HEADER, replace_opening(p, "bt", total_leaves=p.bt.proof.total_leaves + 1), 3),
                     "Bt opening: total_leaves"),
    "m (salted shape)": (lambda p: (HEADER, dataclasses.replace(p, m=p.m - 1), 3), "A opening: total_leaves"),
    "seed derivation (V3 proof as V2)": (lambda p: (HEADER, p, 2), "exceeds the target bound"),
    "cert version 4": (lambda p: (HEADER, p, 4), "not an INT version"),
    "header length": (lambda p: (HEADER[:75], p, 3), "header must be 76 bytes"),
}


@pytest.mark.parametrize("corruption", DENSE_CORRUPTIONS)
def test_dense_corruption_is_rejected(mined, corruption):
    make, reason = DENSE_CORRUPTIONS[corruption]
    header, proof, cert_version = make(mined["dense-v3"])
    ok, why = verify_plain_proof(header, proof, bits=BITS, cert_version=cert_version)
    assert not ok
    assert re.search(reason, why), why


def with_moe(proof, **changes):
    return dataclasses.replace(proof, moe=dataclasses.replace(proof.moe, **changes))


def routing_leaf_flip(proof):
    routing = proof.moe.routing_proof
    return with_moe(proof, routing_proof=dataclasses.replace(routing, leaves=(flip(routing.leaves[0], 0),)))


MOE_CORRUPTIONS = {
    "routing table": (lambda p: (p, 3), "routing opening: leaves and siblings do not hash"),
    "routing offsets": (lambda p: (with_moe(p, routing_end_offsets=p.moe.routing_end_offsets[:-1] + (63,)), 3),
                        "last routing offset 63 != m·top_k = 64"),
    "expert index": (lambda p: (with_moe(p, expert_idx=4), 3), "expert_idx 4 >= e = 4"),
    "outer index": (lambda p: (with_rows(p, (p.a.row_indices[0] ^ 1,) + p.a.row_indices[1:]), 3),
                    "MoE: routing\\[\\d+\\]\\[\\d+\\] = \\d+ but the opened A row is"),
    "B column outside the expert": (
        lambda p: (dataclasses.replace(p, bt=dataclasses.replace(p.bt, row_indices=tuple(
            c + 16 for c in p.bt.row_indices))), 3), "outside expert"),
    "MoE at cert V1": (lambda p: (p, 1), "MoE proof needs certificate version >= 2"),
    "seed derivation (V3 proof as V2)": (lambda p: (p, 2), "exceeds the target bound"),
}


@pytest.mark.parametrize("corruption", MOE_CORRUPTIONS)
def test_moe_corruption_is_rejected(mined, corruption):
    make, reason = MOE_CORRUPTIONS[corruption]
    proof = mined["moe-v3"]
    if corruption == "routing table":
        proof = routing_leaf_flip(proof)
    proof, cert_version = make(proof)
    ok, why = verify_plain_proof(HEADER, proof, bits=BITS, cert_version=cert_version)
    assert not ok
    assert re.search(reason, why), why


def test_moe_routing_value_mismatch(mined):
    """Opening the right leaves for other inner rows: the routing entries no longer match the tokens."""
    proof = mined["moe-v2"]
    shifted = tuple(i + 4 for i in proof.moe.inner_a_rows)
    start = 0 if proof.moe.expert_idx == 0 else proof.moe.routing_end_offsets[proof.moe.expert_idx - 1]
    if start + shifted[-1] >= proof.moe.routing_end_offsets[proof.moe.expert_idx]:
        shifted = tuple(i - 4 for i in proof.moe.inner_a_rows)
    ok, why = verify_plain_proof(HEADER, with_moe(proof, inner_a_rows=shifted), bits=BITS, cert_version=2)
    assert not ok and "routing[" in why and "but the opened A row is" in why, why


def test_harder_target_rejects(mined):
    ok, why = verify_plain_proof(HEADER, mined["dense-v2"], bits=0x1B00FFFF, cert_version=2)
    assert not ok and "exceeds the target bound" in why


def test_out_of_range_values_are_rejected():
    rng = np.random.default_rng(3)
    a = rng.integers(-64, 65, size=(128, 2048), dtype=np.int8)
    bt = rng.integers(-64, 65, size=(64, 2048), dtype=np.int8)
    instance = commit_instance(HEADER, DENSE, a, bt, cert_version=2)
    win = next(instance_tickets(instance))
    bad_a = a.copy()
    bad_a[win.t_rows, 0] = 100
    proof = build_proof(dataclasses.replace(instance, a=bad_a), win)
    ok, why = verify_plain_proof(HEADER, proof, bits=0x207FFFFF, cert_version=2)
    assert not ok and "A values must lie in [-64, 64]" in why
    with pytest.raises(Int7Error, match="\\[-64, 64\\]"):
        commit_instance(HEADER, DENSE, bad_a, bt, cert_version=2)


def test_mine_cpu_argument_errors():
    with pytest.raises(Int7Error, match="MoE configuration needs certificate version >= 2"):
        mine_cpu(HEADER, MOE, m=32, n=16, bits=BITS, cert_version=1)
    with pytest.raises(Int7Error, match="16·r"):
        mine_cpu(HEADER, MiningConfig(1024, 128, ROWS, COLS), m=128, n=64, bits=BITS, cert_version=2)
    with pytest.raises(Int7Error, match="holds no row tile"):
        mine_cpu(HEADER, DENSE, m=64, n=64, bits=BITS, cert_version=2)
    with pytest.raises(Int7Error, match="fewer than n opened columns"):
        mine_cpu(HEADER, MOE, m=32, n=8, bits=BITS, cert_version=2)
    with pytest.raises(Int7Error, match="no winning tile"):
        mine_cpu(HEADER, DENSE, m=128, n=64, bits=0x1B00FFFF, cert_version=2, max_attempts=1)


def test_given_routing_is_used_and_checked():
    routing = [list(range(0, 16)), list(range(16, 32)), list(range(0, 16)), list(range(16, 32))]
    proof = mine_cpu(HEADER, MOE, m=32, n=16, bits=0x207FFFFF, cert_version=3, routing=routing)
    assert proof.moe.routing_end_offsets == (16, 32, 48, 64)
    assert set(proof.a.row_indices) <= set(routing[proof.moe.expert_idx])
    with pytest.raises(Int7Error, match="exactly top_k"):
        mine_cpu(HEADER, MOE, m=32, n=16, bits=BITS, cert_version=3, routing=[list(range(32))] + [[]] * 3)


def test_random_byte_corruptions_give_reasons_not_tracebacks(mined):
    rng = np.random.default_rng(11)
    for name in ("dense-v3", "moe-v3"):
        wire = mined[name].to_bytes()
        for _ in range(60):
            data = bytearray(wire)
            position = int(rng.integers(len(data)))
            data[position] ^= int(rng.integers(1, 256))
            try:
                proof = PlainProof.from_bytes(bytes(data))
            except Int7Error as error:
                assert str(error).startswith("plain proof:")
                continue
            ok, why = verify_plain_proof(HEADER, proof, bits=BITS, cert_version=3)
            assert not ok and why, position


def test_benchmark_verifies_k4096_within_budget(capsys):
    from proof.int7.bench import main
    assert main(["--repeats", "1"]) == 0
    assert "within the 1 s budget" in capsys.readouterr().out


def test_instance_transcripts_match_single_tile_and_verifier_noise():
    rng = np.random.default_rng(5)
    a = rng.integers(-64, 65, size=(128, 2048), dtype=np.int8)
    bt = rng.integers(-64, 65, size=(64, 2048), dtype=np.int8)
    instance = commit_instance(HEADER, DENSE, a, bt, cert_version=3)
    assert np.array_equal(instance.a_noised[:3], noised(a[:3], noise_a_rows(instance.s_a, 2048, 128, [0, 1, 2])))
    e_b = noise_b_cols(instance.s_b, 2048, 128, [60, 61, 62, 63])
    assert np.array_equal(instance.bt_noised[60:], noised(bt[60:], e_b))
    (_, row_offsets, col_offsets, words), = list(instance_transcripts(instance))
    i, j = 5, 3
    rows = [row_offsets[i] + p for p in ROWS]
    cols = [col_offsets[j] + q for q in COLS]
    assert np.array_equal(words[i, j], transcript_words(instance.a_noised[rows], instance.bt_noised[cols], 128))
