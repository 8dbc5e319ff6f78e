"""The prefill (bandwidth) paths of kernels.fp8mine on the CPU backend: each is checked against
the reference or the formula, and where a stage has a decode and a prefill path, the two are
bit-identical on the same input (small shapes; the thresholds that pick a path are patched)."""
import numpy as np
import pytest
import torch

from kernels.fp8mine import peel
from kernels.fp8mine import routing as dev_routing
from proof.fp8.miner import routing_from_topk


def _peel_inputs(g: torch.Generator, counts: list[int], n_e: int):
    """A routed launch with `counts` rows per expert (one token per row, top-1)."""
    experts, tokens = len(counts), sum(counts)
    ids = torch.cat([torch.full((c,), w) for w, c in enumerate(counts)])[torch.randperm(tokens, generator=g)]
    table = dev_routing.routing_table(ids.view(-1, 1), experts)
    acc = torch.randn(tokens, n_e, generator=g) * 100
    a_rows = torch.randn(tokens, 64, generator=g).to(torch.bfloat16)
    alpha_a = (torch.rand(tokens, generator=g) + 0.5).to(torch.bfloat16)
    b_rows = torch.randn(experts, n_e, 64, generator=g).to(torch.bfloat16)
    alpha_b = (torch.rand(experts, n_e, generator=g) + 0.5).to(torch.bfloat16)
    return acc, a_rows, alpha_a, b_rows, alpha_b, table


def test_peel_prefill_columns_loop_matches_one_step_and_the_formula(monkeypatch):
    """64-row tiles walking 2 column steps per program (the last program half past n) give the
    same bits as one step per program, and the formula; experts of 110/90/0/70 rows leave partial
    tiles, an empty expert and rows past an expert's end inside the launch."""
    g = torch.Generator().manual_seed(31)
    args = _peel_inputs(g, [110, 90, 0, 70], 320)
    acc, a_rows, alpha_a, b_rows, alpha_b, table = args
    assert peel._peel_rows(acc.shape[0], table.experts) == 64
    monkeypatch.setattr(peel, "_PEEL_MIN_PROGRAMS", 1)
    assert peel.peel_steps(64, 8, 320) == 2
    looped = peel.peel_and_unscale(*args)
    monkeypatch.setattr(peel, "_PEEL_MAX_STEPS", 1)
    assert peel.peel_steps(64, 8, 320) == 1
    single = peel.peel_and_unscale(*args)
    assert torch.equal(looped.view(torch.int16), single.view(torch.int16))
    rows = table.rflat.long()
    expert = torch.searchsorted(table.offsets.long(), torch.arange(rows.shape[0]), right=True)
    correction = torch.einsum("rj,rcj->rc", a_rows[rows].float(), b_rows[expert].float())
    want = (acc + correction) / alpha_a[rows].float()[:, None] / alpha_b[expert].float()
    assert torch.allclose(looped.float(), want, rtol=1e-2, atol=1e-3)


def test_peel_steps_keep_decode_at_one_and_fill_the_gpu_at_prefill():
    assert peel.peel_steps(16, 64, 4096) == 1  # decode: 16-row tiles
    assert peel.peel_steps(64, 1056, 4096) == peel._PEEL_MAX_STEPS  # GLM-5 prefill: 1056 row tiles
    few = peel.peel_steps(64, 40, 4096)  # few row tiles: spans shrink to keep the SMs busy
    assert 40 * (4096 // (few * 128)) >= peel._PEEL_MIN_PROGRAMS > 40 * (4096 // (2 * few * 128))


@pytest.mark.parametrize("tokens, top_k, experts", [(600, 8, 1024), (513, 3, 7), (1000, 4, 64)])
def test_chunked_routing_table_matches_reference(tokens, top_k, experts, monkeypatch):
    """The prefill routing path (chunk counts, one scan program, scatter): chunk and scan tiles
    with a ragged last chunk, e up to 1024 (expert-block loops) and non-power-of-two e (the dead
    tail counted under id e), against the reference."""
    monkeypatch.setattr(dev_routing, "_SCAN_CELLS", 2048)  # several scan steps at these sizes
    rng = np.random.default_rng(tokens)
    topk = np.stack([rng.permutation(experts)[:top_k] for _ in range(tokens)])
    ids = torch.from_numpy(topk)
    chunked = dev_routing._chunked_table(ids, experts)
    rflat, offsets = routing_from_topk(topk, experts)
    assert chunked.rflat.tolist() == rflat and chunked.bounds.tolist() == [0] + offsets
