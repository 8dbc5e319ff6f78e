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
    """Four launches' routings: uniform; random distinct experts per token, four experts empty;
    every token on expert 0 (its 64 clean rows plus the READY ones span two 64-row tiles);
    uniform again."""
    from kernels.fp8mine.gpu_check import _uniform_topk

    gen = torch.Generator().manual_seed(seed)
    uniform = _uniform_topk(tokens, top_k, experts)
    spread = torch.stack([torch.randperm(experts - 4, generator=gen)[:top_k] for _ in range(tokens)]).cuda()
    hot = torch.cat([torch.zeros((tokens, 1), dtype=torch.int64, device="cuda"), spread[:, 1:] % (experts - 1) + 1],
                    dim=1)
    return [uniform, spread, hot, uniform.roll(5, 0)]


SHAPE = (32, 512, 2048, 64, 8)  # experts, n_e, k, tokens, top_k


def _pass_pair(switch: str):
    """Two lagged passes of `SHAPE` on the same weights and job, with `pipeline.<switch>` on and
    off, their lanes zeroed (lanes no tile has folded into yet then compare equal too)."""
    from kernels.fp8mine import pipeline
    from kernels.fp8mine.gpu_check import synthetic_chain
    from kernels.fp8mine.pipeline import MinedGemm

    experts, n_e, k, tokens, top_k = SHAPE
    torch.manual_seed(3)
    weights = (torch.randn(experts, n_e, k, device="cuda") * 0.05).to(torch.bfloat16)
    header, ancestors = synthetic_chain()
    passes = {}
    for on in (True, False):
        before = getattr(pipeline, switch)
        setattr(pipeline, switch, on)
        try:
            passes[on] = MinedGemm(weights, m=tokens, top_k=top_k, layer_id=1, lagged=True)
        finally:
            setattr(pipeline, switch, before)
        passes[on].set_job(header, ancestors, 0)
        passes[on].ready_lanes.zero_()
    return passes[True], passes[False]


def _launches():
    """(launch, x, routing) of the four launches both passes of a pair run."""
    experts, _, k, tokens, top_k = SHAPE
    for launch, ids in enumerate(_routings(tokens, top_k, experts, seed=4)):
        yield launch, (torch.randn(tokens, k, device="cuda") * (1 + launch)).to(torch.bfloat16), ids


def _assert_mines_alike(got, want, launch: int) -> None:
    """The READY rows' folded lanes and MINED (lanes and tail) of two passes are equal."""
    assert torch.equal(got.ready_lanes, want.ready_lanes), f"launch {launch}: folded lanes"
    assert torch.equal(got.mined.acc, want.mined.acc), f"launch {launch}: MINED's lanes"
    assert torch.equal(got.mined.slot.tail(), want.mined.slot.tail()), f"launch {launch}: MINED's tail"


def test_the_compact_store_serves_and_folds_as_the_whole_tile_store():
    """The lagged GEMM that stores only the clean rows' accumulator, compact (`LAGGED_COMPACT_ACC`),
    against the same pass storing whole tiles, launch by launch on the same inputs: the compact
    accumulator is the clean rows of the combined one bit for bit, the READY rows' folded lanes
    and MINED are equal, and so is the served output."""
    compact, whole = _pass_pair("LAGGED_COMPACT_ACC")
    assert compact.compact_acc and not whole.compact_acc
    for launch, x, ids in _launches():
        got, want = compact.forward(x, ids), whole.forward(x, ids)
        torch.cuda.synchronize()
        ready = whole.ready.bounds.tolist()
        clean = want.table.bounds.tolist()
        rows = torch.cat([torch.arange(clean[w], clean[w + 1]) + ready[w + 1] for w in range(SHAPE[0])]).cuda()
        assert torch.equal(got.acc.view(torch.int16), want.acc[rows].view(torch.int16)), f"launch {launch}: acc"
        _assert_mines_alike(compact, whole, launch)
        assert torch.equal(got.out.view(torch.int16), want.out.view(torch.int16)), f"launch {launch}: output"


def test_the_polling_peel_serves_as_the_peel_after_the_gemm():
    """The serving peel that polls the GEMM's per-expert tile counts (`LAGGED_PEEL_POLLS`) against
    the one that waits for the whole GEMM, launch by launch on the same inputs: the compact
    accumulator, the lanes, MINED and the served output are equal bit for bit."""
    polled, waited = _pass_pair("LAGGED_PEEL_POLLS")
    assert polled.poll_tiles is not None and waited.poll_tiles is None
    for launch, x, ids in _launches():
        got, want = polled.forward(x, ids), waited.forward(x, ids)
        torch.cuda.synchronize()
        assert torch.equal(got.acc.view(torch.int16), want.acc.view(torch.int16)), f"launch {launch}: acc"
        _assert_mines_alike(polled, waited, launch)
        assert torch.equal(got.out.view(torch.int16), want.out.view(torch.int16)), f"launch {launch}: output"


def test_the_polling_peel_replays_in_a_graph_and_its_planted_winner_verifies():
    """`gpu_check`'s lagged graph check with `LAGGED_PEEL_POLLS` on."""
    from kernels.fp8mine.gpu_check import _check_graph_lagged, _switched

    with _switched("LAGGED_PEEL_POLLS", True):
        report = _check_graph_lagged()
    winner = report["replay 3 winner"]
    assert report["replay 1 mines nothing"] and report["replay 2 publishes nothing"], report
    assert winner["record"] == winner["planted"] and winner["verify"][0], winner
    assert report["acc bitwise equal"] and report["out bitwise equal"], report
