"""Planted winners end to end on the CPU backend: the mined pass (dense V4 and MoE) latches the
planted tile, and the PlainProofV4 built from its record verifies with proof.fp8's verifier,
jackpot policy included. Slow: the Triton interpreter hashes the planes' trees."""
import pytest
import torch

from kernels.fp8mine.gpu_check import synthetic_chain
from kernels.fp8mine.pipeline import MinedGemm, PipelineError
from kernels.fp8mine.proofs import take_winner
from proof.fp8 import lottery
from proof.fp8.params import TILE_4X64
from proof.fp8.verify import evaluate_plain_proof, verify_plain_proof

K = 1024
BITS = 0x1D00FFFF


def _tickets(result, pow_key: bytes) -> dict:
    acc = result.acc.numpy()
    starts = result.table.starts().tolist()
    ends = result.table.offsets.tolist()
    out = {}
    for expert, (start, end) in enumerate(zip(starts, ends)):
        for local in range((end - start) // 4):
            for col in range(acc.shape[1] // 64):
                cell = acc[start + 4 * local:start + 4 * local + 4, 64 * col:64 * col + 64]
                message = lottery.fold_message(cell, TILE_4X64.row_pattern, TILE_4X64.col_pattern)
                out[(expert, local, col)] = lottery.ticket_with_key(pow_key, message)
    return out


def _plant_and_prove(weights: torch.Tensor, x: torch.Tensor, topk: torch.Tensor | None, top_k: int):
    header, ancestors = synthetic_chain(BITS)
    gemm = MinedGemm(weights, m=x.shape[0], top_k=top_k, layer_id=2)
    gemm.set_job(header, ancestors[1:], 0)  # prepares σ_d = the grandparent
    gemm.set_job(header, ancestors, 0)  # the same state stays usable: σ_d is now at depth 2
    assert gemm.ancestor_chain == [ancestors[0]]
    first = gemm.forward(x, topk)
    gemm.latch.publish()
    assert gemm.latch.poll() is None  # target 0: nothing wins
    tickets = _tickets(first, bytes(first.a.pow_key.view(torch.uint8).view(-1).tolist()))
    planted, ticket = min(tickets.items(), key=lambda kv: int.from_bytes(kv[1], "little"))
    target = -(-int.from_bytes(ticket, "little") // (4 * 64 * K))
    gemm.set_job(header, ancestors, target)
    second = gemm.forward(x, topk)
    assert torch.equal(second.acc.view(torch.int32), first.acc.view(torch.int32))
    winner = take_winner(gemm)
    record = winner.record
    assert (record.group_id, record.tile_row, record.tile_column) == planted
    assert record.ticket == ticket
    assert verify_plain_proof(header, winner.proof, target=target) == (True, "ok")
    assert evaluate_plain_proof(header, winner.proof).jackpot == ticket
    return gemm, second


def _relative_error(out: torch.Tensor, reference: torch.Tensor) -> float:
    return float((out.float() - reference).norm() / reference.norm())


@pytest.mark.slow
def test_planted_winner_dense():
    torch.manual_seed(1)
    weights = (torch.randn(1, 64, K) * 0.05).to(torch.bfloat16)
    x = torch.randn(8, K).to(torch.bfloat16)
    _, result = _plant_and_prove(weights, x, None, 1)
    reference = x.float() @ weights[0].float().T
    assert _relative_error(result.out, reference) < 0.1


@pytest.mark.slow
def test_planted_winner_moe(monkeypatch):
    """... and A′ written straight into expert order (the default) serves and mines exactly what
    the token-order codes gathered into that order do."""
    from kernels.fp8mine import pipeline
    torch.manual_seed(2)
    experts, top_k, m = 3, 2, 12
    weights = (torch.randn(experts, 64, K) * 0.05).to(torch.bfloat16)
    x = torch.randn(m, K).to(torch.bfloat16)
    topk = torch.stack([torch.randperm(experts)[:top_k] for _ in range(m)])
    gemm, result = _plant_and_prove(weights, x, topk, top_k)
    assert result.a.side.positions is not None
    monkeypatch.setattr(pipeline, "A_IN_EXPERT_ORDER", False)
    gathered = gemm.forward(x, topk)
    assert gathered.a.side.positions is None
    assert torch.equal(gathered.acc.view(torch.int32), result.acc.view(torch.int32))
    assert torch.equal(gathered.out.view(torch.int16), result.out.view(torch.int16))
    rows = result.table.rflat.long()
    expert_of_row = torch.searchsorted(result.table.offsets.long(), torch.arange(rows.numel()), right=True)
    reference = torch.einsum("rk,rnk->rn", x.float()[rows], weights.float()[expert_of_row])
    assert _relative_error(result.out, reference) < 0.1


def test_forward_needs_a_job_and_routing():
    gemm = MinedGemm((torch.randn(2, 16, 64) * 0.05).to(torch.bfloat16), m=4, top_k=1)
    with pytest.raises(PipelineError, match="set_job"):
        gemm.forward(torch.zeros(4, 64, dtype=torch.bfloat16))
    with pytest.raises(PipelineError, match="76 bytes"):
        gemm.set_job(b"short", [bytes(108)], 1)
    with pytest.raises(PipelineError, match="weights"):
        MinedGemm(torch.zeros(16, 64), m=4)


def test_b_state_is_reused_across_the_window_and_prefetched(monkeypatch):
    """A B state serves depths 1..4; at depth 4 the parent's is prepared into the other slot and
    the next template switches to it at depth 2, so B is prepared once every 3 blocks."""
    from kernels.fp8mine.pipeline import BSide, BState
    side = BSide(torch.zeros(1, 16, 64, dtype=torch.bfloat16))  # small: states are faked
    built = []

    def fake_build(header):
        built.append(header[0])
        return BState(header, None, None, None, None, None, None, None, None)

    monkeypatch.setattr(side, "_build", fake_build)
    chain = [bytes([height]) * 108 for height in range(20)]
    chosen = [side.select(chain[:tip][::-1]) for tip in range(5, 14)]
    assert [(state.ancestor_header[0], depth) for state, depth in chosen] == [
        (4, 1), (4, 2), (4, 3), (4, 4), (7, 2), (7, 3), (7, 4), (10, 2), (10, 3)]
    assert built == [4, 7, 10]
    reorg = side.select([bytes([99]) * 108])
    assert reorg[0].ancestor_header[0] == 99 and reorg[1] == 1
