"""GPU correctness of kernels.grouped_gemm against the float64 torch reference (skipped without
a GPU): every autotune candidate on random routings (uniform, +-50%, Zipf with empty experts,
one hot expert, unaligned sizes); bf16/fp8 within rounding, int8 exact; every output row
written; a CUDA graph replayed after the routing changes in place.
"""
import zlib

import pytest
import torch

from kernels.grouped_gemm import grouped_gemm
from kernels.grouped_gemm_config import Precision, Regime, candidates, schedule_variants
from kernels.reference import grouped_gemm_reference
from kernels.routing import Routing, group_sizes, offsets_from_sizes

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# bf16 output rounding alone is ~2^-9 relative; fp8 operands are exact, so the same bound holds.
REL_TOL = {Precision.BF16: 1e-2, Precision.FP8: 1e-2}


def make_problem(precision: Precision, routing: Routing, experts: int, m: int, k: int, n: int,
                 seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    sizes = group_sizes(routing, experts, m, seed)
    offsets = torch.from_numpy(offsets_from_sizes(sizes)).cuda()
    total = sum(sizes)
    if precision is Precision.INT8:
        x = torch.randint(-128, 128, (total, k), device="cuda", generator=gen, dtype=torch.int8)
        w = torch.randint(-128, 128, (experts, n, k), device="cuda", generator=gen, dtype=torch.int8)
        return x, w, offsets, None, None
    x = torch.randn(total, k, device="cuda", generator=gen)
    w = torch.randn(experts, n, k, device="cuda", generator=gen)
    if precision is Precision.BF16:
        return x.bfloat16(), w.bfloat16(), offsets, None, None
    xs = torch.rand(total, device="cuda", generator=gen) + 0.5
    ws = torch.rand(experts, n, device="cuda", generator=gen) + 0.5
    return x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn), offsets, xs, ws


def check(out: torch.Tensor, x, w, offsets, xs, ws) -> None:
    ref = grouped_gemm_reference(x, w, offsets, xs, ws)
    if x.dtype == torch.int8:
        assert torch.equal(out, ref)
        return
    assert not out.isnan().any(), "unwritten (poisoned) output rows"
    err = float((out.double() - ref).norm() / ref.norm())
    assert err < REL_TOL[Precision.BF16 if x.dtype == torch.bfloat16 else Precision.FP8], err


def poisoned_out(x, w) -> torch.Tensor:
    if x.dtype == torch.int8:
        return torch.full((x.shape[0], w.shape[1]), -2**31, dtype=torch.int32, device="cuda")
    return torch.full((x.shape[0], w.shape[1]), float("nan"), dtype=torch.bfloat16, device="cuda")


CONFIGS = [(p, c) for p in Precision for r in Regime
           for c in candidates(p, r) + schedule_variants(candidates(p, r)[0])]


@pytest.mark.parametrize("precision,config", CONFIGS, ids=[f"{p.value}-{c.key}" for p, c in CONFIGS])
@pytest.mark.parametrize("routing", list(Routing), ids=[r.value for r in Routing])
def test_every_candidate_matches_reference(precision, config, routing) -> None:
    x, w, offsets, xs, ws = make_problem(precision, routing, experts=8, m=72, k=656, n=384,
                                         seed=zlib.crc32(f"{config.key}{routing.value}".encode()) % 1000)
    out = poisoned_out(x, w)
    grouped_gemm(x, w, offsets, x_scale=xs, w_scale=ws, out=out, config=config)
    check(out, x, w, offsets, xs, ws)


@pytest.mark.parametrize("precision", list(Precision), ids=[p.value for p in Precision])
@pytest.mark.parametrize("m", [16, 300])
def test_selector_path_on_model_sized_shape(precision, m) -> None:
    x, w, offsets, xs, ws = make_problem(precision, Routing.ZIPF, experts=16, m=m, k=2048, n=1536,
                                         seed=m)
    out = grouped_gemm(x, w, offsets, x_scale=xs, w_scale=ws)
    check(out, x, w, offsets, xs, ws)


@pytest.mark.parametrize("precision", [Precision.BF16, Precision.FP8], ids=["bf16", "fp8"])
def test_cuda_graph_replays_a_new_routing(precision) -> None:
    x, w, offsets, xs, ws = make_problem(precision, Routing.UNIFORM, 8, 48, 512, 256, seed=7)
    out = poisoned_out(x, w)
    grouped_gemm(x, w, offsets, x_scale=xs, w_scale=ws, out=out)  # compile outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grouped_gemm(x, w, offsets, x_scale=xs, w_scale=ws, out=out)
    new = offsets_from_sizes(group_sizes(Routing.ZIPF, 8, 48, seed=3))
    offsets.copy_(torch.from_numpy(new))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    check(out, x, w, offsets, xs, ws)


def test_empty_batch_returns_empty_output() -> None:
    w = torch.randn(4, 128, 256, device="cuda").bfloat16()
    x = torch.empty(0, 256, device="cuda", dtype=torch.bfloat16)
    offsets = torch.zeros(5, dtype=torch.int32, device="cuda")
    assert grouped_gemm(x, w, offsets).shape == (0, 128)
