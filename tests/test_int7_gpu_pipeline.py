"""The mined pass end to end on small shapes: job preparation and the A side equal
proof.int7.commit_instance; a planted winner's record names the tile and the PlainProof built from
it verifies with proof.int7.verify_plain_proof (dense V3 salted, MoE V2)."""
import struct

import numpy as np
import pytest
import torch

from kernels.int7.blake3 import bytes_from_words
from kernels.int7.pipeline import SPLIT_PEEL_FROM_ROWS, MinedPass, PipelineError, bound_words, prepare_job
from proof.int7 import MiningConfig, commit_instance, instance_tickets, ticket_value, verify_plain_proof

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BITS = 0x207FFFFF  # an easy target: every ticket meets T0·h·w·D
HEADER = struct.pack("<I", 0) + b"\x01" * 32 + b"\x02" * 32 + struct.pack("<II", 0x66666666, BITS)
K, RANK, M, N = 1024, 64, 16, 32


def _config(experts=0, top_k=0):
    return MiningConfig(K, RANK, list(range(2)), list(range(16)), experts, top_k)


def _plant(job, wins):
    """Set the job's bound to the smallest ticket so that exactly that tile wins."""
    best = min(wins, key=lambda w: ticket_value(w[1].ticket))
    job.bound.copy_(bound_words(ticket_value(best[1].ticket), DEVICE))
    return best


# the fused decode A side, the staged kernels, and the staged kernels with the peel as its own pass
@pytest.mark.parametrize("fused_a, split_peel", [(True, False), (False, False), (False, True)])
def test_dense_v3_salted_planted_winner_verifies(fused_a, split_peel):
    experts = 2
    rng = np.random.default_rng(21)
    weights = rng.integers(-64, 65, (experts, N, K), dtype=np.int8)
    acts = rng.integers(-64, 65, (experts, M, K), dtype=np.int8)
    config = _config()
    refs = [commit_instance(HEADER, config, acts[e], weights[e], cert_version=3) for e in range(experts)]
    job = prepare_job(torch.from_numpy(weights).to(DEVICE), torch.ones(experts, N, device=DEVICE),
                      header76=HEADER, config=config, cert_version=3, bound=0, moe=False)
    for e, ref in enumerate(refs):
        assert bytes_from_words(job.b_trees.roots[e]) == ref.hash_b
        assert bytes_from_words(job.s_b[e]) == ref.s_b
        assert np.array_equal(job.bt_noised[e].cpu().numpy(), ref.bt_noised)
    expert, best = _plant(job, [(e, w) for e, ref in enumerate(refs) for w in instance_tickets(ref)])
    mined = MinedPass(job, M, write_i32=True, fused_a=fused_a, split_peel=split_peel)
    assert (mined.fused_a, mined.split_peel) == (fused_a, split_peel)
    mined.run_quantized(torch.from_numpy(acts).to(DEVICE), torch.ones(experts, M, device=DEVICE))
    expected = np.einsum("emk,enk->emn", acts.astype(np.int64), weights.astype(np.int64))
    assert np.array_equal(mined.out_i32.cpu().numpy(), expected)
    record = mined.winner_record()
    assert record == {"instance": expert, "t_rows": best.t_rows, "t_cols": best.t_cols, "ticket": best.ticket}
    proof = mined.take_proof()
    assert (proof.m, proof.n, proof.k, proof.rank, proof.moe) == (M, N, K, RANK, None)
    assert proof.a.proof.root == refs[expert].hash_a and proof.bt.proof.root == refs[expert].hash_b
    assert verify_plain_proof(HEADER, proof, bits=BITS, cert_version=3) == (True, "ok")
    assert mined.take_proof() is None  # re-armed, nothing pending


@pytest.mark.parametrize("split_peel", [False, True])
def test_moe_v2_planted_winner_verifies(split_peel):
    experts, top_k = 4, 2
    tokens = experts * M // top_k
    rng = np.random.default_rng(22)
    weights = rng.integers(-64, 65, (experts, N, K), dtype=np.int8)
    acts = rng.integers(-64, 65, (tokens, K), dtype=np.int8)
    routing = [[t for t in range(tokens) if t % 2 == e % 2] for e in range(experts)]
    config = _config(experts, top_k)
    ref = commit_instance(HEADER, config, acts, weights.reshape(experts * N, K), cert_version=2,
                          routing=routing)
    job = prepare_job(torch.from_numpy(weights).to(DEVICE), torch.ones(experts, N, device=DEVICE),
                      header76=HEADER, config=config, cert_version=2, bound=0, moe=True)
    assert bytes_from_words(job.b_trees.roots[0]) == ref.hash_b
    assert bytes_from_words(job.s_b[0]) == ref.s_b
    best = _plant(job, [(w.expert, w) for w in instance_tickets(ref)])[1]
    mined = MinedPass(job, M, tokens=tokens, write_i32=True, split_peel=split_peel)
    mined.run_quantized(torch.from_numpy(acts).to(DEVICE), torch.ones(tokens, device=DEVICE),
                        torch.tensor(routing, dtype=torch.int32, device=DEVICE))
    expected = np.einsum("emk,enk->emn", acts[np.array(routing)].astype(np.int64), weights.astype(np.int64))
    assert np.array_equal(mined.out_i32.cpu().numpy(), expected)  # the peel: each expert's A·B
    record = mined.winner_record()
    assert record == {"instance": best.expert, "t_rows": best.t_rows, "t_cols": best.t_cols,
                      "ticket": best.ticket}
    proof = mined.take_proof()
    assert proof.moe is not None and proof.moe.expert_idx == best.expert
    assert verify_plain_proof(HEADER, proof, bits=BITS, cert_version=2) == (True, "ok")


def test_no_winner_below_a_zero_bound_and_bad_arguments():
    weights = torch.zeros((1, N, K), dtype=torch.int8, device=DEVICE)
    job = prepare_job(weights, torch.ones(1, N, device=DEVICE), header76=HEADER, config=_config(),
                      cert_version=1, bound=0, moe=False)
    mined = MinedPass(job, M)
    out = mined.run(torch.randn(1, M, K, device=DEVICE))
    assert out.shape == (1, M, N) and mined.take_proof() is None
    with pytest.raises(PipelineError, match="contiguous lottery tiles"):
        prepare_job(weights, torch.ones(1, N, device=DEVICE), header76=HEADER,
                    config=MiningConfig(K, RANK, [0, 8, 64, 72], list(range(8))), cert_version=1,
                    bound=0, moe=False)
    with pytest.raises(PipelineError, match="fused A side needs"):
        MinedPass(job, 48, fused_a=True)
    with pytest.raises(PipelineError, match="split peel needs"):
        MinedPass(job, M, fused_a=True, split_peel=True)
    with pytest.raises(PipelineError, match="split peel needs"):
        MinedPass(job, M, lagged=True, split_peel=True)
    with pytest.raises(PipelineError, match="CuTe split pass needs"):  # rank 64, 32-wide tiles
        MinedPass(job, SPLIT_PEEL_FROM_ROWS, cute_split=True)
    # prefill row counts peel in their own pass by default, decode ones stack the peel in the GEMM
    assert MinedPass(job, SPLIT_PEEL_FROM_ROWS).split_peel and not MinedPass(job, M).split_peel
    with pytest.raises(PipelineError, match="dense pass needs activations"):
        mined.run_quantized(torch.zeros((1, M + 2, K), dtype=torch.int8, device=DEVICE),
                            torch.ones(1, M + 2, device=DEVICE))
