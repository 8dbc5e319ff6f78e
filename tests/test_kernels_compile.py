"""CPU compile checks: every grouped GEMM config the selector can pick builds for sm_90a and its
SASS holds the Hopper warpgroup MMA (HGMMA bf16, QGMMA fp8, IGMMA int8).

No GPU needed (cpu-compile-check.md): fake tensors, CUTE_DSL_ARCH=sm_90a, SASS through the
nvdisasm wheel. One compile per (precision, config), about 1.5 s each.
"""
import atexit
import os
import re
import shutil
import tempfile

import pytest

import kernels  # noqa: E402,F401  (sets CUTE_DSL_ARCH=sm_90a before cutlass is imported)

os.environ["CUTE_DSL_KEEP"] = "sass"
# The DSL writes each kernel's cubin/SASS under one truncated file name per kernel class and
# reads it back: concurrent test runs sharing a dump folder overwrite each other's files.
os.environ["CUTE_DSL_DUMP_DIR"] = tempfile.mkdtemp(prefix="pearl_cute_dump_")
atexit.register(shutil.rmtree, os.environ["CUTE_DSL_DUMP_DIR"], True)

pytest.importorskip("cutlass")
pytest.importorskip("quack")

from kernels.grouped_gemm_config import (  # noqa: E402
    GroupedGemmConfig,
    Output,
    Precision,
    Regime,
    candidates,
    default_config,
    schedule_variants,
    selectable_configs,
)

from kernels.int7.gpu_check import EXTRA_PREFILL_TILES  # noqa: E402

MMA_SASS = {Precision.BF16: r"HGMMA\.64x(\d+)x16\.F32\.BF16",
            Precision.FP8: r"QGMMA\.64x(\d+)x32\.F32\.E4M3\.E4M3",
            Precision.INT8: r"IGMMA\.64x(\d+)x32\.S8\.S8"}

# Every config the selector can return, every autotune tile (a future winner), and the
# along-M raster of each default (the one compile-time schedule variant; swizzle is launch-only).
def _dsl_setting(name: str):
    from cutlass.cutlass_dsl import CuTeDSL
    return getattr(CuTeDSL._get_dsl().envar, name)


def test_dsl_targets_sm90a() -> None:
    # cutlass reads its environment once; a module that imported it before `kernels` with
    # another CUTE_DSL_ARCH would make every compile below target the wrong architecture.
    assert _dsl_setting("arch") == "sm_90a"


CASES = list(dict.fromkeys(
    [(p, c) for p, cfgs in selectable_configs().items() for c in cfgs]
    + [(p, c) for p in Precision for r in Regime for c in candidates(p, r)]
    + [(p, v) for p in Precision for r in Regime for v in schedule_variants(default_config(p, r))
       if v.raster_along_m]))


@pytest.mark.parametrize("precision,config", CASES, ids=[f"{p.value}-{c.key}" for p, c in CASES])
def test_config_compiles_to_warpgroup_mma_without_spills(precision: Precision,
                                                         config: GroupedGemmConfig) -> None:
    from kernels.grouped_gemm_sm90 import compile_grouped_gemm

    fn = compile_grouped_gemm(precision, config)
    sass = fn.__sass__
    assert sass, "no SASS kept: CUTE_DSL_KEEP must be set before cutlass compiles"
    widths = {int(n) for n in re.findall(MMA_SASS[precision], sass)}
    # quack splits N over two warpgroups only for cooperative 192-row tiles wider than 128.
    split_n = 2 if config.tile_m == 192 and config.tile_n > 128 and not config.pingpong else 1
    assert widths == {config.tile_n // split_n}, f"MMA N widths {widths} in SASS"
    assert "UTMALDG" in sass  # operands arrive through the TMA engine
    # No local memory: spilled accumulators made 8-bit prefill 4x slower on the H200.
    assert not re.search(r"\b(LDL|STL)\b", sass), "registers spilled to local memory"


def test_bad_tile_is_rejected_at_compile_time() -> None:
    from kernels.grouped_gemm_sm90 import compile_grouped_gemm

    # 192-row tiles need tile_n % 32 == 0: passes the config's own checks, must fail the build.
    with pytest.raises(Exception):
        compile_grouped_gemm(Precision.BF16, GroupedGemmConfig(192, 240, 64))


FP8_CONFIGS = [c for p, c in CASES if p is Precision.FP8]


@pytest.mark.parametrize("output", [Output.FP32, Output.BF16])
@pytest.mark.parametrize("config", FP8_CONFIGS, ids=[c.key for c in FP8_CONFIGS])
def test_fold_epilogue_compiles_where_it_fits(config: GroupedGemmConfig, output: Output) -> None:
    """The FP8 mining GEMM that folds the lottery tiles in its epilogue
    (kernels.fp8mine.fold_epilogue), storing the accumulator as fp32 or rounded to bf16: every
    fp8 config that `fits` builds with one lane store per 64-column block a thread folds (the
    accumulator is stored only through TMA; bf16 after an RN pack) and no spills; the others
    are refused (a 160-wide tile splits a 64-column block)."""
    from kernels.fp8mine.fold_epilogue import compile_fold_gemm, fits

    if not fits(config, 4096):
        assert config.tile_n % 64
        return
    sass = compile_fold_gemm(config, output=output).__sass__
    assert set(re.findall(MMA_SASS[Precision.FP8], sass)) == {str(config.tile_n)}
    row_halves = 2 * (config.tile_m // 64 if config.pingpong else 1)
    assert len(re.findall(r"\bSTG\.E\b", sass)) == row_halves * config.tile_n // 64
    assert bool(re.search(r"\bF2FP\.BF16\.F32\.PACK_AB\b", sass)) == (output is Output.BF16)
    assert not re.search(r"\b(LDL|STL)\b", sass), "registers spilled to local memory"


@pytest.mark.parametrize("experts, rows, n, k", [(32, 32, 4096, 6144), (32, 32, 4096, 7168), (16, 32, 3072, 4096)])
def test_fold_epilogue_shares_its_sms_for_the_lagged_pass(experts, rows, n, k) -> None:
    """The FP8 lagged decode pass's GEMM (READY and clean rows: 2M an expert) folds its READY
    rows' tiles and stores a bf16 accumulator in the variant that leaves LAGGED_SIDE_SMEM and half
    the registers of every SM to the side stream: the selector's config made cooperative, one
    64-row consumer warpgroup, one lane store per 64-column block a thread folds, no spills; with
    LAGGED_DYNAMIC its scheduler warp takes each further tile with one atomic add on the counter."""
    from kernels.fp8mine.fold_epilogue import compile_fold_gemm, fold_config
    from kernels.fp8mine.pipeline import LAGGED_DYNAMIC, LAGGED_SIDE_SMEM
    from kernels.grouped_gemm import shared_config

    config = shared_config(fold_config(experts * rows, experts, n, k), LAGGED_SIDE_SMEM)
    assert config.tile_m == 64 and not config.pingpong
    sass = compile_fold_gemm(config, Output.BF16, LAGGED_SIDE_SMEM, LAGGED_DYNAMIC).__sass__
    assert set(re.findall(MMA_SASS[Precision.FP8], sass)) == {str(config.tile_n)}
    assert len(re.findall(r"\bSTG\.E\b", sass)) == 2 * config.tile_n // 64
    assert re.search(r"\bF2FP\.BF16\.F32\.PACK_AB\b", sass)
    assert len(re.findall(r"\bATOMG\.E\.ADD\b", sass)) == int(LAGGED_DYNAMIC)
    assert not re.search(r"\b(LDL|STL)\b", sass), "registers spilled to local memory"


@pytest.mark.parametrize("experts, rows, n, k", [(32, 32, 4096, 6144), (32, 32, 4096, 7168), (16, 32, 3072, 4096)])
def test_compact_fold_epilogue_compiles_for_the_lagged_pass(experts, rows, n, k) -> None:
    """The lagged pass's folding GEMM that stores only its clean rows, compact
    (`LAGGED_COMPACT_ACC`), as launched: no D, so no TMA store; one lane store per 64-column
    block a thread folds and one word store per 8-column block and row half it keeps, each word
    rounded by the hardware conversion (F2FP, as the TMA store's: a NaN stays NaN); one atomic
    tile take; no spills."""
    from kernels.fp8mine.fold_epilogue import compile_fold_gemm, fold_config
    from kernels.fp8mine.pipeline import LAGGED_DYNAMIC, LAGGED_SIDE_SMEM
    from kernels.grouped_gemm import shared_config

    config = shared_config(fold_config(experts * rows, experts, n, k), LAGGED_SIDE_SMEM)
    sass = compile_fold_gemm(config, Output.BF16, LAGGED_SIDE_SMEM, LAGGED_DYNAMIC, compact=True).__sass__
    assert set(re.findall(MMA_SASS[Precision.FP8], sass)) == {str(config.tile_n)}
    assert "UTMASTG" not in sass
    assert len(re.findall(r"\bSTG\.E\b", sass)) == 2 * config.tile_n // 64 + 2 * config.tile_n // 8
    assert len(re.findall(r"\bF2FP\.BF16\.F32\.PACK_AB\b", sass)) == 2 * config.tile_n // 8
    assert len(re.findall(r"\bATOMG\.E\.ADD\b", sass)) == int(LAGGED_DYNAMIC)
    assert not re.search(r"\b(LDL|STL)\b", sass), "registers spilled to local memory"


def test_compact_fold_epilogue_counts_its_tiles_for_a_polling_peel() -> None:
    """`LAGGED_PEEL_POLLS`: the compact-storing lagged GEMM that also counts each expert's
    finished tiles: after its stores, one gpu-scope fence and relaxed reduction a tile (one
    MEMBAR: CUTLASS's release pattern),
    and one more launch_dependents (PREEXIT) than the same kernel without counts, from its first
    tile on; the same stores, no spills. Counting is refused without the compact store and on a
    pingpong or clustered config."""
    from kernels.fp8mine.fold_epilogue import compile_fold_gemm, fold_config, launch_config, signals
    from kernels.fp8mine.pipeline import LAGGED_DYNAMIC, LAGGED_SIDE_SMEM
    from kernels.grouped_gemm import shared_config

    config = shared_config(fold_config(32 * 32, 32, 4096, 6144), LAGGED_SIDE_SMEM)
    assert launch_config(32 * 32, (32, 4096, 6144), LAGGED_SIDE_SMEM) == config and signals(config)
    plain, counting = (compile_fold_gemm(config, Output.BF16, LAGGED_SIDE_SMEM, LAGGED_DYNAMIC, compact=True,
                                         signal=signal).__sass__ for signal in (False, True))
    assert re.findall(r"\bREDG\S*", counting) == ["REDG.E.ADD.S32.STRONG.GPU"] and "REDG" not in plain
    assert counting.count("MEMBAR.ALL.GPU") == 1 and "MEMBAR.ALL.GPU" not in plain
    assert counting.index("MEMBAR.ALL.GPU") < counting.index("REDG.E.ADD")
    assert counting.count("PREEXIT") == plain.count("PREEXIT") + 1
    assert len(re.findall(r"\bSTG\.E\b", counting)) == len(re.findall(r"\bSTG\.E\b", plain))
    assert not re.search(r"\b(LDL|STL)\b", counting), "registers spilled to local memory"
    with pytest.raises(ValueError, match="tile counts"):
        compile_fold_gemm(config, Output.BF16, LAGGED_SIDE_SMEM, signal=True)
    for other in (GroupedGemmConfig(64, 128, 128, pingpong=True), GroupedGemmConfig(128, 128, 128, cluster_m=2)):
        assert not signals(other)
        with pytest.raises(ValueError, match="tile counts"):
            compile_fold_gemm(other, Output.BF16, compact=True, signal=True)


def test_fold_epilogue_refuses_other_outputs() -> None:
    """Only an fp32 or a bf16 accumulator is stored (compact: bf16 only): an int32 output or out
    tensor is refused before anything compiles or launches."""
    import torch

    from kernels.fp8mine.fold_epilogue import compile_fold_gemm, fold_config, folded_grouped_gemm

    config = fold_config(256, 2, 128, 256)
    with pytest.raises(ValueError, match="fp32 or bf16"):
        compile_fold_gemm(config, output=Output.INT32)
    a = torch.zeros(256, 256, dtype=torch.float8_e4m3fn)
    b = torch.zeros(2, 128, 256, dtype=torch.float8_e4m3fn)
    bounds = torch.tensor([0, 128, 256], dtype=torch.int32)
    lanes = torch.zeros(64, 2, 16, dtype=torch.int32)
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        folded_grouped_gemm(a, b, bounds, torch.zeros(256, 128, dtype=torch.int32), lanes)
    with pytest.raises(ValueError, match="compact: bf16"):
        compile_fold_gemm(config, Output.FP32, compact=True)
    with pytest.raises(ValueError, match="with lottery_bounds"):
        folded_grouped_gemm(a, b, bounds, torch.zeros(8, 128, dtype=torch.bfloat16), lanes, compact_bounds=bounds)
    with pytest.raises(ValueError, match="compact out"):
        folded_grouped_gemm(a, b, bounds, torch.zeros(8, 128, dtype=torch.float32), lanes, lottery_bounds=bounds,
                            compact_bounds=bounds)


# and the INT7 transcript and peel GEMMs' own prefill tiles (measured faster there than the
# selector's) and the others gpu_check's cute_tiles section times
INT8_CONFIGS = list(dict.fromkeys([c for p, c in CASES if p is Precision.INT8] + [
    GroupedGemmConfig.from_key(key) for key in ("128x256x128_c1x1_coop", "64x256x128_c1x1_pp", *EXTRA_PREFILL_TILES)]))


@pytest.mark.parametrize("config", INT8_CONFIGS, ids=[c.key for c in INT8_CONFIGS])
def test_int7_transcript_gemm_compiles_where_it_fits(config: GroupedGemmConfig) -> None:
    """The INT7 mined GEMM that folds the transcript in its main loop
    (kernels.int7.transcript_gemm): every int8 config that `fits` builds with IGMMA, three
    butterfly shuffles per lottery tile a thread holds (one chunk's XOR: one fold site in the
    k loop), two word stores per tile, and no spills; 160- and 192-wide tiles are refused."""
    from kernels.int7.transcript_gemm import compile_transcript_gemm, fits

    if not fits(config, 4096, 6144):
        assert config.tile_n % 128
        return
    tiles = 2 * (config.tile_m // 64 if config.pingpong else max(1, config.tile_m // 128)) * config.tile_n // 128
    # without and (MoE: A′ rows read through the routing, cluster_n = 1) with a gather
    for gather in (False, True) if config.cluster_n == 1 else (False,):
        sass = compile_transcript_gemm(config, gather).__sass__
        assert set(re.findall(MMA_SASS[Precision.INT8], sass)) == {str(config.tile_n)}
        assert len(re.findall(r"\bSHFL\.BFLY\b", sass)) == 3 * tiles
        assert len(re.findall(r"\bSTG\.E\b", sass)) == 2 * tiles
        assert bool(re.search(r"\bLDGSTS\b", sass)) == gather
        assert not re.search(r"\b(LDL|STL)\b", sass), "registers spilled to local memory"


@pytest.mark.parametrize("experts, rows, n, k", [(32, 32, 4096, 6144), (16, 32, 3072, 4096), (32, 128, 7168, 2048)])
def test_int7_transcript_gemm_shares_its_sms_for_the_lagged_pass(experts, rows, n, k) -> None:
    """The lagged decode pass's transcript GEMM (READY and served rows: 2M an expert) in the
    variant that leaves LAGGED_SIDE_SMEM and half the registers of every SM to the side chain:
    a cooperative 64-row config, IGMMA, the transcript's shuffles, no spills; with its tiles
    taken from a counter (`pipeline.CUTE_LAGGED_DYNAMIC`), one global atomic add."""
    from kernels.int7.pipeline import LAGGED_SIDE_SMEM
    from kernels.int7.transcript_gemm import compile_transcript_gemm, sharing_config

    config = sharing_config(experts * rows, experts, n, k)
    assert config is not None and config.tile_m == 64 and not config.pingpong
    for dynamic in (False, True):
        sass = compile_transcript_gemm(config, False, LAGGED_SIDE_SMEM, dynamic).__sass__
        assert set(re.findall(MMA_SASS[Precision.INT8], sass)) == {str(config.tile_n)}
        assert len(re.findall(r"\bSHFL\.BFLY\b", sass)) == 3 * 2 * config.tile_n // 128
        assert len(re.findall(r"\bATOMG\.E\.ADD\b", sass)) == int(dynamic)
        assert not re.search(r"\b(LDL|STL)\b", sass), "registers spilled to local memory"


@pytest.mark.parametrize("experts, rows, n, k", [(32, 2048, 4096, 6144), (16, 2048, 3072, 4096),
                                                   (32, 16, 4096, 6144), (32, 16, 7168, 2048)])
def test_int7_transcript_and_peel_configs(experts, rows, n, k) -> None:
    """Prefill launches take the transcript and peel GEMMs' measured prefill tiles; smaller ones
    the int8 selector's where the transcript GEMM runs it, else (e.g. 128 × 192 tiles) the first
    fitting sweep candidate of the regime; gathering (MoE) needs cluster_n = 1; every choice is
    one the compile checks here build."""
    from kernels.grouped_gemm_config import regime_for, select_config
    from kernels.int7.transcript_gemm import PREFILL_CONFIG, fits, transcript_config

    from kernels.int7.peel_gemm import PREFILL_CONFIG as PEEL_PREFILL, peel_config

    selected = select_config(Precision.INT8, experts * rows, experts, n, k)
    prefill = regime_for(experts * rows, experts) is Regime.PREFILL
    for gather in (False, True):
        config = transcript_config(experts * rows, experts, n, k, gather)
        assert config is not None and fits(config, n, k) and (config.cluster_n == 1 or not gather)
        assert config in INT8_CONFIGS
        if prefill:
            assert config == PREFILL_CONFIG
        elif fits(selected, n, k) and (selected.cluster_n == 1 or not gather):
            assert config == selected
        else:
            assert config in candidates(Precision.INT8, regime_for(experts * rows, experts))
    assert peel_config(experts * rows, experts, n, 768) in INT8_CONFIGS
    assert (peel_config(experts * rows, experts, n, 768) == PEEL_PREFILL) == prefill


@pytest.mark.parametrize("config", FP8_CONFIGS, ids=[c.key for c in FP8_CONFIGS])
def test_fp8_peel_epilogue_compiles_where_it_fits(config: GroupedGemmConfig) -> None:
    """The FP8 mining GEMM that also peels and unscales in its epilogue
    (kernels.fp8mine.peel_epilogue): every config that `peel_fits` adds one bf16 K = 64 WGMMA
    chain (4 k16 HGMMAs a warpgroup's MMA atom) to the e4m3 QGMMAs of the folding GEMM, reading
    the ring's last stage, without spills."""
    from kernels.fp8mine.fold_epilogue import compile_fold_gemm, fits
    from kernels.fp8mine.peel_epilogue import compile_peel_gemm, peel_fits

    if not peel_fits(config, 4096, 6144):
        assert not fits(config, 4096)
        return
    sass = compile_peel_gemm(config).__sass__
    fold = compile_fold_gemm(config, Output.BF16).__sass__
    atoms_m = 1 if config.pingpong else max(1, config.tile_m // 128)
    assert len(re.findall(r"\bHGMMA\.64x\d+x16\.F32\.BF16\b", sass)) == 4 * atoms_m
    assert len(re.findall(r"\bQGMMA\.", sass)) == len(re.findall(r"\bQGMMA\.", fold))
    assert not re.search(r"\b(LDL|STL)\b", sass), "registers spilled to local memory"


GATHER_CONFIGS = [c for c in FP8_CONFIGS if c.cluster_n == 1]


@pytest.mark.parametrize("config", GATHER_CONFIGS, ids=[c.key for c in GATHER_CONFIGS])
def test_fp8_peel_epilogue_compiles_with_gathered_rows(config: GroupedGemmConfig) -> None:
    """The peeling GEMM reading its A rows, tails included, through Rflat (`GATHER_IN_GEMM` at
    prefill: A′ written once in token order, not once per expert copy): cp.async row copies for
    A beside B's TMA, the same bf16 peel chain as the TMA form, without spills."""
    from kernels.fp8mine.peel_epilogue import compile_peel_gemm, peel_fits

    if not peel_fits(config, 4096, 6144):
        return
    sass = compile_peel_gemm(config, True).__sass__
    atoms_m = 1 if config.pingpong else max(1, config.tile_m // 128)
    assert re.search(r"\bLDGSTS\b", sass) and "UTMALDG" in sass
    assert len(re.findall(r"\bHGMMA\.64x\d+x16\.F32\.BF16\b", sass)) == 4 * atoms_m
    assert not re.search(r"\b(LDL|STL)\b", sass), "registers spilled to local memory"


@pytest.mark.parametrize("config", INT8_CONFIGS, ids=[c.key for c in INT8_CONFIGS])
def test_int7_peel_gemm_compiles(config: GroupedGemmConfig) -> None:
    """The INT7 split peel on the CuTe GEMM (kernels.int7.peel_gemm): Horner's ×256 between
    digits in the main loop, the raw A'·B' read as C through TMA beside A and B, the exact int32
    subtraction converted once (I2F) in the epilogue, and no spills."""
    from kernels.int7.peel_gemm import compile_peel_gemm, fits

    if not fits(config, 768):
        assert config.tile_m == 192
        return
    sass = compile_peel_gemm(config).__sass__
    assert set(re.findall(MMA_SASS[Precision.INT8], sass)) == {str(config.tile_n)}
    assert len(re.findall(r"\bUTMALDG\b", sass)) >= 3 and re.search(r"\bI2F", sass)
    assert not re.search(r"\b(LDL|STL)\b", sass), "registers spilled to local memory"
