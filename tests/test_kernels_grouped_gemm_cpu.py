"""CPU tests of the grouped GEMM's host side: configs and their keys, the selector, routings,
the torch reference against a literal row-by-row loop, and argument errors."""
import numpy as np
import pytest
import torch

from kernels.grouped_gemm import GroupedGemmError, grouped_gemm
from kernels.grouped_gemm_config import (
    GroupedGemmConfig,
    Precision,
    Regime,
    TunedEntry,
    candidates,
    default_config,
    load_tuned,
    regime_for,
    save_tuned,
    schedule_variants,
    select_config,
)
from kernels.reference import grouped_gemm_reference
from kernels.routing import Routing, group_sizes, offsets_from_sizes


def test_config_key_round_trips_for_every_candidate_and_schedule() -> None:
    for p in Precision:
        for r in Regime:
            for c in candidates(p, r):
                for v in [c] + schedule_variants(c):
                    assert GroupedGemmConfig.from_key(v.key) == v
    assert GroupedGemmConfig(64, 128, 64, swizzle=4, raster_along_m=True).key == "64x128x64_c1x1_coop_s4_rm"


def test_schedule_variants_keep_the_tile() -> None:
    base = GroupedGemmConfig(128, 256, 64, 2, 1)
    variants = schedule_variants(base)
    assert {(v.tile_m, v.tile_n, v.cluster_m) for v in variants} == {(128, 256, 2)}
    assert len({(v.swizzle, v.raster_along_m) for v in variants}) == len(variants)
    assert base not in variants


@pytest.mark.parametrize("bad", ["64x128_c1x1_coop", "64x128x64_1x1_coop", "64x128x64_c1x1_x",
                                 "64x128x64_c1x1_pp_rm_s4", "64x128x64_c1x1_pp_q"])
def test_malformed_key_is_rejected(bad: str) -> None:
    with pytest.raises(ValueError, match="malformed"):
        GroupedGemmConfig.from_key(bad)


@pytest.mark.parametrize("kwargs", [dict(tile_m=96), dict(tile_n=40), dict(tile_k=32),
                                    dict(cluster_m=3), dict(tile_m=256, pingpong=True),
                                    dict(swizzle=3)])
def test_invalid_config_is_rejected(kwargs) -> None:
    base = dict(tile_m=64, tile_n=128, tile_k=64)
    with pytest.raises(ValueError):
        GroupedGemmConfig(**{**base, **kwargs})


def test_eight_bit_candidates_use_one_promotion_window_per_stage() -> None:
    for p in (Precision.FP8, Precision.INT8):
        for r in Regime:
            assert {c.tile_k for c in candidates(p, r)} == {128}


def test_regime_boundary() -> None:
    assert regime_for(32 * 128, 32) is Regime.DECODE
    assert regime_for(32 * 128 + 1, 32) is Regime.PREFILL
    assert default_config(Precision.BF16, Regime.DECODE).tile_m == 64


def test_selector_prefers_nearest_recorded_winner() -> None:
    a = GroupedGemmConfig(64, 256, 64)
    b = GroupedGemmConfig(128, 256, 64, 2, 1)
    c = GroupedGemmConfig(256, 128, 64, 2, 1)
    tuned = [TunedEntry(Precision.BF16, Regime.DECODE, 16, 4096, 6144, a, 380.0),
             TunedEntry(Precision.BF16, Regime.PREFILL, 256, 4096, 6144, b, 600.0),
             TunedEntry(Precision.BF16, Regime.PREFILL, 2048, 4096, 6144, c, 4000.0)]
    assert select_config(Precision.BF16, 32 * 16, 32, 4096, 7168, tuned) == a
    assert select_config(Precision.BF16, 32 * 300, 32, 4096, 6144, tuned) == b
    assert select_config(Precision.BF16, 32 * 1800, 32, 3072, 6144, tuned) == c
    # nothing recorded for fp8: the regime default
    assert select_config(Precision.FP8, 512, 32, 4096, 6144, tuned) == default_config(
        Precision.FP8, Regime.DECODE)


def test_tuned_entries_round_trip_through_json(tmp_path) -> None:
    entries = [TunedEntry(Precision.FP8, Regime.DECODE, 16, 4096, 6144,
                          GroupedGemmConfig(64, 128, 128, 1, 2, True), 201.5)]
    path = tmp_path / "tuned.json"
    save_tuned(entries, path, "test device")
    assert load_tuned(path) == entries
    assert load_tuned(tmp_path / "missing.json") == []


@pytest.mark.parametrize("routing", list(Routing))
@pytest.mark.parametrize("experts,m", [(32, 16), (7, 300), (48, 1)])
def test_routings_keep_the_total_and_shape(routing, experts, m) -> None:
    sizes = group_sizes(routing, experts, m, seed=5)
    assert len(sizes) == experts and sum(sizes) == experts * m and min(sizes) >= 0
    offs = offsets_from_sizes(sizes)
    assert offs.dtype == np.int32 and offs[0] == 0 and offs[-1] == experts * m
    assert np.all(np.diff(offs) >= 0)


def test_routing_shapes_match_their_names() -> None:
    zipf = group_sizes(Routing.ZIPF, 32, 16, seed=1)
    assert zipf.count(0) >= 3 and 4 * 16 <= max(zipf) <= 8 * 16
    hot = group_sizes(Routing.HOT, 32, 16, seed=1)
    assert sorted(hot)[-1] == 512 and hot.count(0) == 31
    pm50 = group_sizes(Routing.PM50, 32, 16, seed=1)
    assert 8 <= min(pm50) and max(pm50) <= 24 and len(set(pm50)) > 4


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn, torch.int8])
def test_reference_matches_a_literal_row_loop(dtype) -> None:
    gen = torch.Generator().manual_seed(3)
    sizes = [3, 0, 5, 1]
    offsets = torch.from_numpy(offsets_from_sizes(sizes))
    x = torch.randn(9, 32, generator=gen) * 4
    w = torch.randn(4, 16, 32, generator=gen) * 4
    x, w = x.to(dtype), w.to(dtype)
    scaled = dtype == torch.float8_e4m3fn
    xs = torch.rand(9, generator=gen) if scaled else None
    ws = torch.rand(4, 16, generator=gen) if scaled else None
    got = grouped_gemm_reference(x, w, offsets, xs, ws)
    expert_of_row = [e for e, s in enumerate(sizes) for _ in range(s)]
    for row, e in enumerate(expert_of_row):
        for col in range(16):
            v = sum(float(x[row, i].float()) * float(w[e, col, i].float()) for i in range(32))
            if scaled:
                v *= float(xs[row]) * float(ws[e, col])
            assert float(got[row, col]) == pytest.approx(v, rel=1e-12, abs=1e-9)


def _args(**over):
    base = dict(x=torch.zeros(4, 64, dtype=torch.bfloat16), w=torch.zeros(2, 32, 64, dtype=torch.bfloat16),
                offsets=torch.tensor([0, 2, 4], dtype=torch.int32))
    base.update(over)
    return base


@pytest.mark.parametrize("over,match", [
    (dict(x=torch.zeros(4, 64)), "x.dtype"),
    (dict(w=torch.zeros(2, 32, 64, dtype=torch.float16)), "w.dtype"),
    (dict(w=torch.zeros(2, 32, 48, dtype=torch.bfloat16)), "K="),
    (dict(x=torch.zeros(4, 36, dtype=torch.bfloat16), w=torch.zeros(2, 32, 36, dtype=torch.bfloat16)),
     "multiples of 16 bytes"),
    (dict(offsets=torch.tensor([0, 4], dtype=torch.int32)), "offsets"),
    (dict(offsets=torch.tensor([0, 2, 4], dtype=torch.int64)), "offsets"),
    (dict(), "CUDA device"),
])
def test_bad_arguments_raise_clear_errors(over, match) -> None:
    with pytest.raises(GroupedGemmError, match=match):
        grouped_gemm(**_args(**over))


def test_fp8_needs_its_scales_and_bf16_refuses_them() -> None:
    x8 = torch.zeros(4, 64, dtype=torch.float8_e4m3fn)
    w8 = torch.zeros(2, 32, 64, dtype=torch.float8_e4m3fn)
    with pytest.raises(GroupedGemmError, match="x_scale"):
        grouped_gemm(**_args(x=x8, w=w8))
    with pytest.raises(GroupedGemmError, match="w_scale must be"):
        grouped_gemm(**_args(x=x8, w=w8), x_scale=torch.ones(4), w_scale=torch.ones(32))
    with pytest.raises(GroupedGemmError, match="fp8 only"):
        grouped_gemm(**_args(), x_scale=torch.ones(4))


def test_host_modules_import_without_cutlass_or_cuda() -> None:
    """`import kernels...` must work on a CPU-only machine: the device module (cutlass, quack)
    loads on the first launch, and nothing initialises CUDA at import."""
    import subprocess
    import sys

    code = ("import sys, torch\n"
            "import kernels, kernels.grouped_gemm, kernels.grouped_gemm_config, kernels.routing, "
            "kernels.reference, kernels.timing, kernels.bench\n"
            "print(sorted(m for m in ('cutlass', 'quack', 'triton') if m in sys.modules), "
            "torch.cuda.is_initialized())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[] False"
