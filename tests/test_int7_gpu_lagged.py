"""The lagged mined pass (MinedPass(lagged=True)): launch t serves x_t bit-exactly like the
same-launch pass and mines the noised rows of launch t−1; the first launch mines nothing; a planted
winner on launch t−1's rows is recorded at launch t and its proof verifies with proof.int7
(dense V3 salted). Interpreted on CPU, compiled on a GPU."""
import dataclasses
import struct

import numpy as np
import pytest
import torch

from kernels.int7.a_side import ASideError, side_chain_split
from kernels.int7.pipeline import MinedPass, PipelineError, bound_words, prepare_job
from proof.int7 import MiningConfig, commit_instance, instance_tickets, ticket_value, verify_plain_proof

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BITS = 0x207FFFFF  # an easy target: every ticket meets T0·h·w·D
HEADER = struct.pack("<I", 0) + b"\x01" * 32 + b"\x02" * 32 + struct.pack("<II", 0x66666666, BITS)
EXPERTS, K, RANK, M, N = 2, 1024, 64, 16, 32
EVERY_TICKET = (1 << 256) - 1  # a bound every eligible tile meets


def _config(experts=0, top_k=0):
    return MiningConfig(K, RANK, list(range(2)), list(range(16)), experts, top_k)


def _best_tile(config, weights, acts):
    """(instance, smallest winning tile, H_A of that instance) of the dense V3 instances A_e·B_e
    by proof.int7."""
    refs = [commit_instance(HEADER, config, acts[e], weights[e], cert_version=3) for e in range(EXPERTS)]
    expert, best = min(((e, w) for e, ref in enumerate(refs) for w in instance_tickets(ref)),
                       key=lambda item: ticket_value(item[1].ticket))
    return expert, best, refs[expert].hash_a


@pytest.fixture(scope="module")
def job_and_weights():
    rng = np.random.default_rng(31)
    weights = rng.integers(-64, 65, (EXPERTS, N, K), dtype=np.int8)
    scale_b = torch.from_numpy(rng.uniform(1e-3, 2e-2, (EXPERTS, N)).astype(np.float32)).to(DEVICE)
    job = prepare_job(torch.from_numpy(weights).to(DEVICE), scale_b, header76=HEADER, config=_config(),
                      cert_version=3, bound=0, moe=False)
    return job, weights


def _launches(seed, count):
    """(int7 codes, row scales) of `count` launches."""
    rng = np.random.default_rng(seed)
    return [(rng.integers(-64, 65, (EXPERTS, M, K), dtype=np.int8),
             torch.from_numpy(rng.uniform(1e-3, 2e-2, (EXPERTS, M)).astype(np.float32)).to(DEVICE))
            for _ in range(count)]


def _plant_previous(job, weights, previous):
    """Bound = the smallest ticket of the previous launch's rows; (instance, tile, hash_A) of it."""
    expert, best, hash_a = _best_tile(job.config, weights, previous)
    job.bound.copy_(bound_words(ticket_value(best.ticket), DEVICE))
    return expert, best, hash_a


def _run(mined, acts, scale):
    """One launch, completed (the record and the doorbell reach the host asynchronously)."""
    out = mined.run_quantized(torch.from_numpy(acts).to(DEVICE), scale)
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    return out


def _check_winner(mined, expert, best, hash_a):
    assert mined.winner_record() == {"instance": expert, "t_rows": best.t_rows, "t_cols": best.t_cols,
                                     "ticket": best.ticket}
    proof = mined.take_proof()
    assert proof.a.proof.root == hash_a  # the opening is A_{t−1}, retained at launch t
    assert verify_plain_proof(HEADER, proof, bits=BITS, cert_version=3) == (True, "ok")


def _exact(weights, acts):
    return np.einsum("emk,enk->emn", acts.astype(np.int64), weights.astype(np.int64))


@pytest.mark.slow  # ~50 s interpreted: four mined launches, each hashing its rows
def test_lagged_pass_serves_now_and_mines_the_previous_launch(job_and_weights):
    """Fused A side (decode): launch 1 mines nothing even under a bound every tile meets; launches
    2 and 3 record the planted tile of launches 1 and 2; outputs are those of the same-launch pass."""
    job, weights = job_and_weights
    launches = _launches(32, 3)
    lagged = MinedPass(job, M, lagged=True, write_i32=True)
    assert lagged.fused_a
    assert lagged.side_split == side_chain_split(EXPERTS) > 1  # the side chain's in-kernel hand-off
    for t, (acts, scale) in enumerate(launches):
        if t == 0:  # nothing is ready: every row count is 0, so not even this bound can win
            job.bound.copy_(bound_words(EVERY_TICKET, DEVICE))
        else:
            planted = _plant_previous(job, weights, launches[t - 1][0])
        out = _run(lagged, acts, scale)
        assert np.array_equal(lagged.out_i32.cpu().numpy(), _exact(weights, acts)), f"launch {t + 1}"
        # the phase word flipped: the next launch's READY set is the one this launch's chain wrote
        assert int(lagged._lag.lag.phase) == (t + 1) % 2
        assert np.array_equal(lagged._lag.states[(t + 1) % 2].q.cpu().numpy(), acts)
        assert not lagged._side_sync.any()  # every launch leaves its hand-off words zero
        if t == 1:  # bf16 as the same-launch pass on the same rows (ready rows are A_1 ≠ A_2 here)
            same_launch = MinedPass(job, M, fused_a=False)
            assert torch.equal(out, _run(same_launch, acts, scale))
        if t == 0:
            assert lagged.winner_record() is None
        else:
            _check_winner(lagged, *planted)


def test_lagged_pass_with_the_staged_a_side(job_and_weights):
    """The staged A side (row counts the fused one does not take) under the same lag: PENDING
    written by a device-indexed copy under the phase word."""
    job, weights = job_and_weights
    (first, first_scale), (second, second_scale) = _launches(33, 2)
    lagged = MinedPass(job, M, lagged=True, fused_a=False)
    job.bound.copy_(bound_words(0, DEVICE))
    _run(lagged, first, first_scale)
    assert lagged.winner_record() is None
    planted = _plant_previous(job, weights, first)
    _run(lagged, second, second_scale)
    _check_winner(lagged, *planted)


def test_lagged_moe_is_refused(job_and_weights):
    job = dataclasses.replace(job_and_weights[0], moe=True, config=_config(EXPERTS, 1))
    with pytest.raises(PipelineError, match="lagged mining is dense only"):
        MinedPass(job, M, tokens=EXPERTS * M, lagged=True)


@pytest.mark.parametrize("options, message", [({"side_warps": 3}, "warps"), ({"side_split": 0}, "split must be")])
def test_a_bad_side_chain_shape_is_refused_when_the_pass_is_built(job_and_weights, options, message):
    with pytest.raises(ASideError, match=message):
        MinedPass(job_and_weights[0], M, lagged=True, **options)


@pytest.mark.parametrize("options, message", [({"lagged": False}, "needs lagged=True"),
                                              ({"lagged": True}, "lagged CuTe pass needs CUDA, rank 128")])
def test_the_lagged_cute_pass_is_refused_where_it_cannot_run(job_and_weights, options, message):
    """cute_lag=True asks for the CuTe GEMM: this job's rank 64 and 2 × 16 tiles (and, here, the CPU)
    do not fit it, and a same-launch pass has no lag; left to None the Triton lagged pass runs."""
    with pytest.raises(PipelineError, match=message):
        MinedPass(job_and_weights[0], M, cute_lag=True, **options)
    assert MinedPass(job_and_weights[0], M, lagged=True)._cute_lag is None
