"""The FP8 lagged decode pass as the worker builds it on a GPU (`MinedGemm(lagged=True)` with the
folding CuTe GEMM where quack is installed; skipped without a GPU), in a CUDA graph: replays 1 and
2 publish nothing, replay 3 publishes the planted tile of replay 2's hashed rows and its proof
verifies, and the replayed launch equals the eager one bit for bit (`gpu_check`'s lagged graph
check, run under pytest so that a GPU test session builds this pass too: session 27 left a
missing import on a line only this build reaches).
"""
import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_the_lagged_pass_replays_in_a_graph_and_its_planted_winner_verifies():
    from kernels.fp8mine.gpu_check import _check_graph_lagged

    report = _check_graph_lagged()
    assert report["replay 1 mines nothing"] and report["replay 2 publishes nothing"], report
    winner = report["replay 3 winner"]
    assert winner["record"] == winner["planted"], winner
    assert winner["ticket matches"] and winner["verify"][0] and winner["verifier jackpot matches"], winner
    assert report["acc bitwise equal"] and report["out bitwise equal"], report


def _routings(tokens: int, top_k: int, experts: int, seed: int) -> list[torch.Tensor]:
    """Three launches' routings: uniform; random distinct experts per token, some experts empty;
    every token on expert 0 (its 64 clean rows plus the READY ones span two 64-row tiles)."""
    gen = torch.Generator().manual_seed(seed)
    uniform = (torch.arange(tokens)[:, None] * top_k + torch.arange(top_k)[None, :]) % experts
    spread = torch.stack([torch.randperm(experts - 4, generator=gen)[:top_k] for _ in range(tokens)])
    hot = torch.cat([torch.zeros((tokens, 1), dtype=torch.int64), spread[:, 1:] % (experts - 1) + 1], dim=1)
    return [r.cuda() for r in (uniform, spread, hot, uniform.roll(5, 0))]


def test_the_serving_gemm_serves_as_the_serving_peel_and_mines_the_same_lanes():
    """The lagged pass whose GEMM serves its clean rows (`LAGGED_SERVE_IN_GEMM`) against the
    same pass with the serving peel, launch by launch on the same inputs: the READY rows' folded
    lanes bitwise equal; MINED (lanes and READY's tail) one launch later bitwise what the
    serving peel's take copied; the served output within bf16 rounding of the peeled one (it
    peels the fp32 accumulator, the other a bf16 one) and no further from the bf16 reference."""
    from kernels.fp8mine import pipeline
    from kernels.fp8mine.gpu_check import _reference_error, synthetic_chain
    from kernels.fp8mine.pipeline import MinedGemm

    experts, n_e, k, tokens, top_k = 32, 512, 2048, 64, 8
    torch.manual_seed(3)
    weights = (torch.randn(experts, n_e, k, device="cuda") * 0.05).to(torch.bfloat16)
    header, ancestors = synthetic_chain()
    passes = {}
    for serve in (True, False):
        pipeline.LAGGED_SERVE_IN_GEMM, before = serve, pipeline.LAGGED_SERVE_IN_GEMM
        try:
            passes[serve] = MinedGemm(weights, m=tokens, top_k=top_k, layer_id=1, lagged=True)
        finally:
            pipeline.LAGGED_SERVE_IN_GEMM = before
        passes[serve].set_job(header, ancestors, 0)
        passes[serve].ready_lanes.zero_()  # lanes no tile has folded into yet compare equal too
    served, peeled = passes[True], passes[False]
    routings = _routings(tokens, top_k, experts, seed=4)
    assert served.serves(routings[0]) and not peeled.serves(routings[0])
    taken = None  # what the serving peel copied into MINED at the launch before
    for launch, ids in enumerate(routings):
        x = (torch.randn(tokens, k, device="cuda") * (1 + launch)).to(torch.bfloat16)
        got, want = served.forward(x, ids), peeled.forward(x, ids)
        torch.cuda.synchronize()
        assert got.acc is None and torch.equal(got.table.rflat, want.table.rflat)
        assert torch.equal(served.ready_lanes, peeled.ready_lanes), f"launch {launch}: folded lanes"
        if taken is not None:
            assert torch.equal(served.mined.acc, taken[0]), f"launch {launch}: MINED's lanes"
            assert torch.equal(served.mined.slot.tail(), taken[1]), f"launch {launch}: MINED's tail"
        taken = (peeled.mined.acc.clone(), peeled.mined.slot.tail().clone())
        difference = (got.out.float() - want.out.float()).norm() / want.out.float().norm()
        assert difference < 4e-3, f"launch {launch}: served vs peeled output {difference:.2e}"
        reference = _reference_error(got.out, x, weights, got.table)
        assert reference <= 1.02 * _reference_error(want.out, x, weights, want.table) + 1e-4, launch
