"""CPU tests of the grouped GEMM's host side: configs and their keys, the selector, routings,
the torch reference against a literal row-by-row loop, argument errors and the output variants;
and sm_90a compile checks (SASS) of the int8 -> scaled bf16 and fp8 -> raw fp32 variants (the
primary variants are compiled by tests/test_kernels_compile.py)."""
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from kernels import grouped_gemm as grouped_gemm_module
from kernels.grouped_gemm import (GroupedGemmError, grouped_gemm, launch_variant, output_dtype, persistent_ctas,
                                 precision_of, shared_config)
from kernels.grouped_gemm_config import (
    GroupedGemmConfig,
    Output,
    Precision,
    Regime,
    TunedEntry,
    candidates,
    default_config,
    is_scaled,
    load_tuned,
    output_for,
    primary_output,
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
    (dict(x=torch.zeros(4, 72, dtype=torch.bfloat16)[:, :64]), "CUDA device"),  # rows with room: read in place
    (dict(x=torch.zeros(4, 68, dtype=torch.bfloat16)[:, :64]), "16-byte aligned row strides"),
    (dict(w=torch.zeros(2, 32, 64, dtype=torch.bfloat16).transpose(1, 2).contiguous().transpose(1, 2)),
     "K innermost"),
    (dict(offsets=torch.tensor([0, 4], dtype=torch.int32)), "offsets"),
    (dict(offsets=torch.tensor([0, 2, 4], dtype=torch.int64)), "offsets"),
    (dict(), "CUDA device"),
])
def test_bad_arguments_raise_clear_errors(over, match) -> None:
    with pytest.raises(GroupedGemmError, match=match):
        grouped_gemm(**_args(**over))


@pytest.mark.parametrize("max_sms", [0, -4])
def test_max_sms_must_be_a_positive_count(max_sms) -> None:
    with pytest.raises(GroupedGemmError, match="max_sms must be a positive SM count"):
        grouped_gemm(**_args(), max_sms=max_sms)


@pytest.mark.parametrize("side_smem", [-1024, 1000, 129 * 1024])
def test_side_smem_must_be_whole_kib_within_the_limit(side_smem) -> None:
    with pytest.raises(GroupedGemmError, match="side_smem must be a multiple of 1024 bytes"):
        grouped_gemm(**_args(), side_smem=side_smem)


def test_a_shared_sm_launch_runs_a_pingpong_config_as_its_cooperative_twin() -> None:
    pingpong = GroupedGemmConfig.from_key("64x128x128_c1x1_pp")
    cooperative = GroupedGemmConfig.from_key("64x128x128_c1x1_coop")
    assert shared_config(pingpong, 64 * 1024) == cooperative
    assert shared_config(pingpong, 0) == pingpong and shared_config(cooperative, 64 * 1024) == cooperative


@pytest.mark.parametrize("counter", [torch.zeros(1, dtype=torch.int64), torch.zeros(2, dtype=torch.int32),
                                     torch.zeros((1, 1), dtype=torch.int32)])
def test_a_bad_tile_counter_is_refused_before_the_launch(counter) -> None:
    """Both mining GEMMs (FP8 fold, INT7 transcript) hand their dynamic scheduler's counter to
    launch_variant, which checks it once for them; the kernel is never called."""
    def never(*args):
        raise AssertionError("launched with a bad tile counter")
    x = torch.zeros((8, 128), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="tile_counter must be int32"):
        launch_variant(never, x, None, None, None, default_config(Precision.BF16, Regime.DECODE), None,
                       tile_counter=counter)


def _eight_bit(dtype: torch.dtype) -> dict:
    return dict(x=torch.zeros(4, 64, dtype=dtype), w=torch.zeros(2, 32, 64, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.int8])
def test_scales_come_together_and_are_checked(dtype) -> None:
    with pytest.raises(GroupedGemmError, match="x_scale given alone"):
        grouped_gemm(**_args(**_eight_bit(dtype)), x_scale=torch.ones(4))
    with pytest.raises(GroupedGemmError, match="w_scale given alone"):
        grouped_gemm(**_args(**_eight_bit(dtype)), w_scale=torch.ones(2, 32))
    with pytest.raises(GroupedGemmError, match="w_scale must be"):
        grouped_gemm(**_args(**_eight_bit(dtype)), x_scale=torch.ones(4), w_scale=torch.ones(32))
    with pytest.raises(GroupedGemmError, match="x_scale must be"):
        grouped_gemm(**_args(**_eight_bit(dtype)), x_scale=torch.ones(4, dtype=torch.float64),
                     w_scale=torch.ones(2, 32))


def test_bf16_refuses_scales() -> None:
    with pytest.raises(GroupedGemmError, match="fp8 and int8 only"):
        grouped_gemm(**_args(), x_scale=torch.ones(4), w_scale=torch.ones(2, 32))


@pytest.mark.parametrize("dtype,scaled,expected", [
    (torch.bfloat16, False, torch.bfloat16),
    (torch.float8_e4m3fn, True, torch.bfloat16),
    (torch.float8_e4m3fn, False, torch.float32),  # the raw accumulator (FP8 mining)
    (torch.int8, True, torch.bfloat16),
    (torch.int8, False, torch.int32),
])
def test_scales_select_the_output_dtype(dtype, scaled, expected) -> None:
    x, w = torch.zeros(4, 64, dtype=dtype), torch.zeros(2, 32, 64, dtype=dtype)
    scales = dict(x_scale=torch.ones(4), w_scale=torch.ones(2, 32)) if scaled else {}
    assert output_dtype(precision_of(x), scaled) == expected
    # the right out passes every check but the device one; any other dtype names the right one
    with pytest.raises(GroupedGemmError, match="CUDA device"):
        grouped_gemm(**_args(x=x, w=w), **scales, out=torch.empty(4, 32, dtype=expected))
    wrong = torch.float16
    with pytest.raises(GroupedGemmError, match=f"out must be {expected}"):
        grouped_gemm(**_args(x=x, w=w), **scales, out=torch.empty(4, 32, dtype=wrong))


def test_output_variants_and_their_scaling() -> None:
    assert {(p, s): output_for(p, s) for p in Precision for s in (False, True)
            if (p, s) != (Precision.BF16, True)} == {
        (Precision.BF16, False): Output.BF16, (Precision.FP8, True): Output.BF16,
        (Precision.FP8, False): Output.FP32, (Precision.INT8, True): Output.BF16,
        (Precision.INT8, False): Output.INT32}
    with pytest.raises(ValueError, match="bf16 takes no scales"):
        output_for(Precision.BF16, True)
    for (p, s), o in [((Precision.BF16, False), Output.BF16), ((Precision.FP8, True), Output.BF16),
                      ((Precision.FP8, False), Output.FP32), ((Precision.INT8, True), Output.BF16),
                      ((Precision.INT8, False), Output.INT32)]:
        assert is_scaled(p, o) == s
    # the primary variants (what the sweep times) are the pre-existing ones
    assert {p: primary_output(p) for p in Precision} == {
        Precision.BF16: Output.BF16, Precision.FP8: Output.BF16, Precision.INT8: Output.INT32}


def test_row_alignment_follows_the_output_dtype() -> None:
    # N = 4: 16-byte fp32 rows (fp8 raw accumulator) are TMA-aligned, 8-byte bf16 rows are not
    x, w = torch.zeros(4, 64, dtype=torch.float8_e4m3fn), torch.zeros(2, 4, 64, dtype=torch.float8_e4m3fn)
    with pytest.raises(GroupedGemmError, match="CUDA device"):
        grouped_gemm(**_args(x=x, w=w))
    with pytest.raises(GroupedGemmError, match="N=4"):
        grouped_gemm(**_args(x=x, w=w), x_scale=torch.ones(4), w_scale=torch.ones(2, 4))


def test_empty_k_is_rejected() -> None:
    with pytest.raises(GroupedGemmError, match="K must be positive"):
        grouped_gemm(**_args(x=torch.zeros(4, 0, dtype=torch.int8),
                             w=torch.zeros(2, 32, 0, dtype=torch.int8)))


# --- sm_90a compile checks of the added output variants (cpu-compile-check.md) ---------------
# A decode and a prefill config each. They compile in a child process: the DSL reads
# CUTE_DSL_KEEP (needed for SASS) once, when cutlass is first imported, which in this process
# may already have happened without it.
VARIANT_CASES = [(p, o, default_config(p, r)) for p, o in [(Precision.INT8, Output.BF16),
                                                          (Precision.FP8, Output.FP32)]
                 for r in Regime]
_COMPILE_SCRIPT = """
import json, os, sys
import kernels  # sets CUTE_DSL_ARCH=sm_90a before cutlass is imported
from kernels.grouped_gemm_config import GroupedGemmConfig, Output, Precision
from kernels.grouped_gemm_sm90 import compile_grouped_gemm
out_dir, cases = sys.argv[1], json.loads(sys.argv[2])
for i, (precision, output, key, side_smem) in enumerate(cases):
    fn = compile_grouped_gemm(Precision(precision), GroupedGemmConfig.from_key(key), Output(output), side_smem)
    with open(os.path.join(out_dir, f"{i}.sass"), "w") as f:
        f.write(fn.__sass__ or "")
"""
# the lagged FP8 decode GEMM that shares its SMs with the side stream (kernels.grouped_gemm_sm90.sharing)
SHARED_CASE = GroupedGemmConfig.from_key("64x128x128_c1x1_coop")
_MMA_SASS = {Precision.INT8: r"IGMMA\.64x(\d+)x32\.S8\.S8",
             Precision.FP8: r"QGMMA\.64x(\d+)x32\.F32\.E4M3\.E4M3"}


@pytest.fixture(scope="module")
def variant_sass(tmp_path_factory) -> list[str]:
    if any(importlib.util.find_spec(m) is None for m in ("cutlass", "quack")):
        pytest.skip("needs nvidia-cutlass-dsl and quack-kernels")
    out_dir = tmp_path_factory.mktemp("variant_sass")
    repo = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "CUTE_DSL_ARCH": "sm_90a", "CUTE_DSL_KEEP": "sass",
           "CUTE_DSL_DUMP_DIR": str(out_dir),
           "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))}
    cases = json.dumps([(p.value, o.value, c.key, 0) for p, o, c in VARIANT_CASES]
                       + [(Precision.FP8.value, Output.FP32.value, SHARED_CASE.key, 64 * 1024)])
    run = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT, str(out_dir), cases], env=env,
                         capture_output=True, text=True, timeout=600)
    if run.returncode:
        pytest.fail(f"compiling the output variants failed:\n{run.stderr[-4000:]}")
    return [(out_dir / f"{i}.sass").read_text() for i in range(len(VARIANT_CASES) + 1)]


@pytest.mark.parametrize("index", range(len(VARIANT_CASES)),
                         ids=[f"{p.value}-{o.value}-{c.key}" for p, o, c in VARIANT_CASES])
def test_output_variant_compiles_to_warpgroup_mma_and_its_epilogue(variant_sass, index) -> None:
    precision, output, config = VARIANT_CASES[index]
    sass = variant_sass[index]
    assert sass, "no SASS kept"
    assert {int(n) for n in re.findall(_MMA_SASS[precision], sass)} == {config.tile_n}
    assert "UTMALDG" in sass and "UTMASTG" in sass  # TMA loads and TMA stores of D
    assert not re.search(r"\b(LDL|STL)\b", sass), "registers spilled to local memory"
    # Both configs give each warpgroup 64 rows (64-row pingpong, 128-row cooperative), so a
    # thread holds 64 * tile_n / 128 accumulator values.
    assert config.tile_m == (64 if config.pingpong else 128)
    acc_values = config.tile_n // 2
    if output is Output.BF16:  # int8: s32 -> fp32, two scale multiplies, packed to bf16
        assert len(re.findall(r"\bI2FP\.F32\.S32\b", sass)) >= acc_values
        # quack converts its vector loads to the accumulator type (s32): F2I.TRUNC would mean
        # the scales were truncated to integers (F2I...U32 is the scheduler's index math).
        assert not re.search(r"\bF2I(?:\.FTZ)?\.TRUNC\.NTZ\b", sass), "scales converted to s32"
        assert len(re.findall(r"\bFMUL\b", sass)) >= 2 * acc_values
        assert len(re.findall(r"\bF2FP\.BF16\.F32\.PACK_AB\b", sass)) == acc_values // 2
    else:  # fp8 raw: fp32 written as is, after one +0 add per value (-0 -> +0)
        assert "F2FP" not in sass
        assert len(re.findall(r"\bFADD R\d+, (?:RZ, R\d+|R\d+, RZ)", sass)) == acc_values


def test_shared_sm_variant_hands_registers_between_its_warpgroups(variant_sass) -> None:
    """Launched at 128 registers a thread (2 CTAs an SM), the producer gives 88 back and the
    consumer takes them (0x28 / 0xd8), with no spills and the decode tile's QGMMA."""
    sass = variant_sass[len(VARIANT_CASES)]
    assert re.findall(r"SETMAXREG\.\w+\.CTAPOOL (?:UP0, )?(0x[0-9a-f]+)", sass) == ["0x28", "0xd8"]
    assert not re.search(r"\b(LDL|STL)\b", sass), "registers spilled to local memory"
    assert {int(n) for n in re.findall(_MMA_SASS[Precision.FP8], sass)} == {SHARED_CASE.tile_n}


def test_persistent_ctas_counts_whole_clusters_under_the_sm_cap(monkeypatch):
    """The grid launch_variant starts, which the L2 prefetch's first wave is sized from."""
    monkeypatch.setattr(grouped_gemm_module, "_max_active_clusters", lambda size, device: 132 // size)
    pair = GroupedGemmConfig(128, 256, 64, 2, 1)
    single = GroupedGemmConfig(128, 256, 64, 1, 1)
    assert persistent_ctas(pair, 0) == 132
    assert persistent_ctas(single, 0) == 132
    assert persistent_ctas(pair, 0, max_sms=125) == 124  # whole clusters only
    assert persistent_ctas(single, 0, max_sms=125) == 125
    assert persistent_ctas(pair, 0, max_sms=1) == 2  # never fewer than one cluster
