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
