"""GPU correctness of kernels.grouped_gemm (skipped without a GPU): every autotune candidate on
random routings (uniform, +-50%, Zipf with empty experts, one hot expert, unaligned sizes) against
the float64 torch reference, bf16/fp8/scaled-int8 outputs within rounding, int8 -> int32 exact;
the fp8 raw accumulator bit-exact against the Hopper model `proof.fp8.fp8_matmul`; every output
row written; a CUDA graph replayed after the routing changes in place.
"""
import zlib

import numpy as np
import pytest
import torch

from kernels.grouped_gemm import grouped_gemm, output_dtype, precision_of
from kernels.grouped_gemm_config import Precision, Regime, candidates, default_config, schedule_variants
from kernels.reference import grouped_gemm_reference
from kernels.routing import Routing, group_sizes, offsets_from_sizes
from proof.fp8 import fp8_matmul
from proof.fp8.e4m3 import is_nan_code

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# bf16 output rounding alone is ~2^-9 relative; 8-bit operands are exact, so the bound holds for
# bf16, fp8 and scaled int8 alike.
BF16_OUT_REL_TOL = 1e-2


def make_problem(precision: Precision, routing: Routing, experts: int, m: int, k: int, n: int,
                 seed: int, scaled: bool | None = None):
    """Random operands; scales (x_scale (total_M,), w_scale (E, N)) when `scaled`, by default
    for fp8 only (the pre-existing variants)."""
    scaled = precision is Precision.FP8 if scaled is None else scaled
    gen = torch.Generator(device="cuda").manual_seed(seed)
    sizes = group_sizes(routing, experts, m, seed)
    offsets = torch.from_numpy(offsets_from_sizes(sizes)).cuda()
    total = sum(sizes)
    if precision is Precision.INT8:
        x = torch.randint(-128, 128, (total, k), device="cuda", generator=gen, dtype=torch.int8)
        w = torch.randint(-128, 128, (experts, n, k), device="cuda", generator=gen, dtype=torch.int8)
    else:
        x = torch.randn(total, k, device="cuda", generator=gen)
        w = torch.randn(experts, n, k, device="cuda", generator=gen)
        dtype = torch.bfloat16 if precision is Precision.BF16 else torch.float8_e4m3fn
        x, w = x.to(dtype), w.to(dtype)
    if not scaled:
        return x, w, offsets, None, None
    xs = torch.rand(total, device="cuda", generator=gen) + 0.5
    ws = torch.rand(experts, n, device="cuda", generator=gen) + 0.5
    return x, w, offsets, xs, ws


def check(out: torch.Tensor, x, w, offsets, xs, ws) -> None:
    if out.dtype == torch.int32:
        assert torch.equal(out, grouped_gemm_reference(x, w, offsets))
        return
    if x.dtype == torch.int8:  # int8 widens exactly: the exact integer product, then the scales
        x, w = x.double(), w.double()
    ref = grouped_gemm_reference(x, w, offsets, xs, ws)
    assert not out.isnan().any(), "unwritten (poisoned) output rows"
    err = float((out.double() - ref).norm() / ref.norm())
    assert err < BF16_OUT_REL_TOL, err


def poisoned_out(x, w, scaled: bool) -> torch.Tensor:
    dtype = output_dtype(precision_of(x), scaled)
    fill = -2**31 if dtype == torch.int32 else float("nan")
    return torch.full((x.shape[0], w.shape[1]), fill, dtype=dtype, device="cuda")


def run_and_check(x, w, offsets, xs, ws, config=None) -> None:
    out = poisoned_out(x, w, xs is not None)
    assert grouped_gemm(x, w, offsets, x_scale=xs, w_scale=ws, out=out, config=config) is out
    check(out, x, w, offsets, xs, ws)


CONFIGS = [(p, c) for p in Precision for r in Regime
           for c in candidates(p, r) + schedule_variants(candidates(p, r)[0])]


@pytest.mark.parametrize("precision,config", CONFIGS, ids=[f"{p.value}-{c.key}" for p, c in CONFIGS])
@pytest.mark.parametrize("routing", list(Routing), ids=[r.value for r in Routing])
def test_every_candidate_matches_reference(precision, config, routing) -> None:
    run_and_check(*make_problem(precision, routing, experts=8, m=72, k=656, n=384,
                                seed=zlib.crc32(f"{config.key}{routing.value}".encode()) % 1000),
                  config=config)


@pytest.mark.parametrize("regime", list(Regime), ids=[r.value for r in Regime])
@pytest.mark.parametrize("routing", list(Routing), ids=[r.value for r in Routing])
def test_int8_scaled_bf16_matches_reference(regime, routing) -> None:
    """int8 with scales -> bf16 on the int8 configs (the output changes only the epilogue)."""
    config = default_config(Precision.INT8, regime)
    problem = make_problem(Precision.INT8, routing, experts=8, m=72, k=656, n=384,
                           seed=zlib.crc32(f"int8s{config.key}{routing.value}".encode()) % 1000,
                           scaled=True)
    run_and_check(*problem, config=config)


@pytest.mark.parametrize("precision,scaled", [(Precision.BF16, False), (Precision.FP8, True),
                                              (Precision.INT8, False), (Precision.INT8, True)],
                         ids=["bf16", "fp8", "int8", "int8s"])
@pytest.mark.parametrize("m", [16, 300])
def test_selector_path_on_model_sized_shape(precision, scaled, m) -> None:
    x, w, offsets, xs, ws = make_problem(precision, Routing.ZIPF, experts=16, m=m, k=2048, n=1536,
                                         seed=m, scaled=scaled)
    out = grouped_gemm(x, w, offsets, x_scale=xs, w_scale=ws)
    assert out.dtype == output_dtype(precision, scaled)
    check(out, x, w, offsets, xs, ws)


@pytest.mark.parametrize("precision,scaled", [(Precision.BF16, False), (Precision.FP8, False)],
                         ids=["bf16", "fp8raw"])
@pytest.mark.parametrize("max_sms", [1, 7, 64])
def test_a_capped_grid_gives_the_same_output(precision, scaled, max_sms) -> None:
    """The persistent grid on fewer SMs (side work beside the GEMM) computes every tile alike."""
    x, w, offsets, xs, ws = make_problem(precision, Routing.ZIPF, experts=16, m=16, k=2048, n=1536,
                                         seed=max_sms, scaled=scaled)
    full = grouped_gemm(x, w, offsets, x_scale=xs, w_scale=ws)
    capped = grouped_gemm(x, w, offsets, x_scale=xs, w_scale=ws, max_sms=max_sms)
    assert torch.equal(capped.view(torch.int32) if capped.dtype == torch.float32 else capped,
                       full.view(torch.int32) if full.dtype == torch.float32 else full)


def e4m3_operand(rng: np.random.Generator, rows: int, k: int) -> np.ndarray:
    """Random e4m3 codes, rows in random order: one row holds both NaN codes (0x7F, 0xFF; its
    outputs are NaN), one is all -0 (0x80; its outputs are zeros, +0 in the model), the others
    are random finite codes holding each of the 254 finite codes at least once."""
    finite = np.flatnonzero(~is_nan_code(np.arange(256))).astype(np.uint8)
    codes = rng.choice(finite, (rows, k))
    body = codes[2:].reshape(-1)  # a view: rows 2.. in one line
    body[rng.choice(body.size, finite.size, replace=False)] = finite
    codes[0, rng.choice(k, 2, replace=False)] = (0x7F, 0xFF)
    codes[1] = 0x80
    return codes[rng.permutation(rows)]


def hopper_model(x_codes: np.ndarray, w_codes: np.ndarray, bounds: list[int]) -> np.ndarray:
    """The grouped product per expert through the Hopper model (fp32, NaN where poisoned)."""
    out = np.zeros((x_codes.shape[0], w_codes.shape[1]), dtype=np.float32)
    for e, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
        if hi > lo:
            out[lo:hi] = fp8_matmul("hopper", x_codes[lo:hi], w_codes[e])
    return out


FP8_ACC_CASES = [  # (config, routing, K): K never a multiple of 128, some not of 32
    (default_config(Precision.FP8, Regime.DECODE), Routing.ZIPF, 336),
    (default_config(Precision.FP8, Regime.DECODE), Routing.UNALIGNED, 208),
    (default_config(Precision.FP8, Regime.PREFILL), Routing.ZIPF, 208),
    (default_config(Precision.FP8, Regime.PREFILL), Routing.HOT, 336),
    (None, Routing.PM50, 464),  # the selector's pick
]


@pytest.mark.parametrize("config,routing,k", FP8_ACC_CASES,
                         ids=[f"{c.key if c else 'selected'}-{r.value}-k{k}" for c, r, k in FP8_ACC_CASES])
def test_fp8_raw_accumulator_is_bit_exact_with_the_hopper_model(config, routing, k) -> None:
    experts, m, n = 6, 40, 128
    rng = np.random.default_rng(zlib.crc32(f"{routing.value}{k}".encode()))
    sizes = group_sizes(routing, experts, m, seed=k)
    bounds = [int(v) for v in offsets_from_sizes(sizes)]
    x_codes = e4m3_operand(rng, bounds[-1], k)
    w_codes = e4m3_operand(rng, experts * n, k).reshape(experts, n, k)
    x = torch.from_numpy(x_codes).cuda().view(torch.float8_e4m3fn)
    w = torch.from_numpy(w_codes).cuda().view(torch.float8_e4m3fn)
    offsets = torch.tensor(bounds, dtype=torch.int32, device="cuda")
    acc = torch.full((bounds[-1], n), 12345.0, dtype=torch.float32, device="cuda")  # poison

    assert grouped_gemm(x, w, offsets, out=acc, config=config) is acc
    got = acc.cpu().numpy()
    expected = hopper_model(x_codes, w_codes, bounds)
    nan = np.isnan(expected)
    assert nan.any() and not nan.all() and (expected == 0).any()
    np.testing.assert_array_equal(np.isnan(got), nan)
    mismatched = got.view(np.uint32)[~nan] != expected.view(np.uint32)[~nan]  # -0 vs +0 counts
    assert not mismatched.any(), (f"{int(mismatched.sum())} of {mismatched.size} values differ, "
                                  f"first: {got[~nan][mismatched][:4]} vs {expected[~nan][mismatched][:4]}")


@pytest.mark.parametrize("precision", [Precision.BF16, Precision.FP8], ids=["bf16", "fp8"])
def test_cuda_graph_replays_a_new_routing(precision) -> None:
    x, w, offsets, xs, ws = make_problem(precision, Routing.UNIFORM, 8, 48, 512, 256, seed=7)
    out = poisoned_out(x, w, xs is not None)
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


@pytest.mark.parametrize("dtype,expected", [(torch.bfloat16, torch.bfloat16),
                                            (torch.float8_e4m3fn, torch.float32)])
def test_empty_batch_returns_empty_output(dtype, expected) -> None:
    w = torch.randn(4, 128, 256, device="cuda").to(dtype)
    x = torch.empty(0, 256, device="cuda", dtype=dtype)
    offsets = torch.zeros(5, dtype=torch.int32, device="cuda")
    out = grouped_gemm(x, w, offsets)
    assert out.shape == (0, 128) and out.dtype == expected
