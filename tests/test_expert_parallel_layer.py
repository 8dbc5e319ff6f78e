"""The expert-parallel MoE block on 2 and 4 gloo ranks equals the single-process block.

Same weights, and the ranks' tokens concatenated in rank order are the single-process batch.
The EP layer reorders no float sum: rows reach each expert in global token order (the same
matrix, so the same GEMM), the routing weight is applied before FC2 and the slots are summed in
slot order, as in ``MoEBlock``; the mined path quantises per row and per output column.

The GEMMs that see a different matrix are the replicated ones each rank runs on its own tokens:
the router's and the shared experts'. A CPU BLAS result depends on M (blocking) in the last bit,
so the equality is checked twice: exactly (torch.equal) with tokens and gate weights on a dyadic
grid, where every router dot product is exact whatever the blocking, and the shared experts
left out; and within 1e-5 with Gaussian data and the shared experts in. The reference runs on
one thread, as every rank does: on an AMD EPYC machine MKL's last bit depended on the thread count.
"""
from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from miner.accounting import MiningStats
from miner.expert_parallel.moe import ExpertParallelMoE
from miner.expert_parallel.plan import ExpertPlan
from miner.expert_parallel.runtime import local_config
from miner.layer import MinedLayer
from miner.model import preset
from miner.model.moe import MoEBlock
from miner.modes import Mode
from miner.worker import cpu_backend
from test_expert_parallel_support import EPContext, fp8_job, job, load_all, run_ranks, save

# (name, style, hidden size, experts, mining mode or None)
CASES = [
    ("qwen3", "qwen3_moe", 256, 8, None),
    ("qwen3-uneven", "qwen3_moe", 256, 6, None),
    ("deepseek", "deepseek_v3", 256, 8, None),
    ("int7-moe", "qwen3_moe", 2048, 8, Mode.INT7_MOE),
    ("int7-dense", "qwen3_moe", 2048, 8, Mode.INT7_DENSE),
]
SPLITS = {2: [7, 12], 4: [5, 0, 9, 3]}


def variants() -> list[tuple[tuple, bool]]:
    """Every case on dyadic data; the reference-op cases on Gaussian data too (the mined ones
    quantise the same rows either way)."""
    return [(case, dyadic) for case, dyadic in itertools.product(CASES, (True, False))
            if dyadic or case[4] is None]


def block_and_tokens(style: str, hidden: int, experts: int, total: int,
                     dyadic: bool) -> tuple[MoEBlock, torch.Tensor]:
    """The block and the tokens; ``dyadic``: tokens in 1/8 steps and gate weights in 1/64 steps,
    so every router logit is an exact float32 sum, and no shared experts."""
    cfg = preset(style, hidden_size=hidden, num_experts=experts, expert_intermediate=64)
    torch.manual_seed(0)
    block = MoEBlock(cfg, layer_id=0)
    tokens = torch.randn(total, hidden, generator=torch.Generator().manual_seed(1))
    if dyadic:
        tokens = (tokens * 8).round().clamp(-16, 16) / 8
        with torch.no_grad():
            block.router.gate.weight.copy_((block.router.gate.weight * 64).round().clamp(-64, 64) / 64)
        block.shared_up = block.shared_down = None
    return block, tokens


def mined(layer_owner: MoEBlock | ExpertParallelMoE, mode: Mode, experts_cfg) -> None:
    """Install a prepared CPU backend as the block's launcher (every launch with a token mines)."""
    layer = MinedLayer(0, MiningStats(), lambda: True, lambda backend, record: None, lambda exc: None, 1)
    layer.backend = cpu_backend(mode, 0, experts_cfg)
    layer.backend.prepare_job(job(), layer_owner.w13)
    layer_owner.launcher = layer


def _rank_body(ctx: EPContext, out_dir: Path, splits: list[int]) -> None:
    start = sum(splits[:ctx.rank])
    outputs = {}
    for (name, style, hidden, experts, mode), dyadic in variants():
        block, tokens = block_and_tokens(style, hidden, experts, sum(splits), dyadic)
        plan = ExpertPlan(experts, ctx.world_size)
        shard = ExpertParallelMoE(block, plan, ctx.rank)
        if mode is not None:
            mined(shard, mode, local_config(block.cfg, plan.local_count(ctx.rank)))
        with torch.no_grad():
            outputs[name, dyadic] = shard(tokens[start:start + splits[ctx.rank]])
    save(out_dir, ctx.rank, outputs)


@pytest.mark.parametrize("world", [2, 4])
def test_expert_parallel_block_equals_single_process(tmp_path: Path, world: int) -> None:
    splits = SPLITS[world]
    run_ranks(world, _rank_body, tmp_path, splits)
    per_rank = load_all(tmp_path, world)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the ranks run: MKL's last bit may depend on its thread count
    try:
        expected_by_variant = {}
        for (name, style, hidden, experts, mode), dyadic in variants():
            block, tokens = block_and_tokens(style, hidden, experts, sum(splits), dyadic)
            if mode is not None:
                mined(block, mode, block.cfg)
            with torch.no_grad():
                expected_by_variant[name, dyadic] = block(tokens)
    finally:
        torch.set_num_threads(threads)
    for (name, style, hidden, experts, mode), dyadic in variants():
        expected = expected_by_variant[name, dyadic]
        got = torch.cat([outputs[name, dyadic] for outputs in per_rank])
        assert got.shape == expected.shape, name
        diff = (got - expected).abs().max().item()
        if dyadic:
            assert torch.equal(got, expected), f"{name}: max |diff| {diff}"
        else:
            assert diff <= 1e-5, f"{name}: max |diff| {diff}"


def test_mined_path_differs_from_unmined() -> None:
    """The mined comparison above is not vacuous: int7 quantisation changes the output."""
    block, tokens = block_and_tokens("qwen3_moe", 2048, 8, 19, dyadic=True)
    with torch.no_grad():
        plain = block(tokens)
        mined(block, Mode.INT7_MOE, block.cfg)
        quantised = block(tokens)
    assert not torch.equal(plain, quantised)
    assert torch.allclose(plain, quantised, rtol=0.1, atol=0.05)


def test_rank_local_fp8_backend_serves_the_rows_the_whole_layer_serves() -> None:
    """V4 mining on one rank's experts (top-k 1 rows) gives the whole-layer backend's output for
    those rows, and its winner's proof passes proof.fp8's verifier (mine_cpu checks it)."""
    cfg = preset("qwen3_moe", hidden_size=1024, num_experts=4, expert_intermediate=32)
    w13 = torch.randn(4, 64, 1024, generator=torch.Generator().manual_seed(2))
    tokens = torch.randn(9, 1024, generator=torch.Generator().manual_seed(3))
    ids = torch.randn(9, 4, generator=torch.Generator().manual_seed(4)).topk(2).indices
    v4 = fp8_job()
    whole = cpu_backend(Mode.FP8_MOE, 0, cfg)
    whole.prepare_job(v4, w13)
    plan = ExpertPlan(4, 2)
    local = cpu_backend(Mode.FP8_MOE, 0, local_config(cfg, plan.local_count(1)))
    local.prepare_job(v4, w13[plan.local_slice(1)])
    tok, slot = torch.nonzero(ids >= plan.first(1), as_tuple=True)
    result = local.mine_launch(tokens[tok], (ids[tok, slot] - plan.first(1))[:, None])
    assert torch.equal(result.output[:, 0], whole.mine_launch(tokens, ids).output[tok, slot])
    assert result.winners and result.tickets > 0
