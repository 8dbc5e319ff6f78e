"""Device side of the grouped GEMM: the sm_90a kernel classes and their compilation.

The kernels are quack's `GemmSm90` (TMA + WGMMA, warp-specialised producer/consumers, persistent
tile scheduler, varlen-M over experts through `cu_seqlens_m` read on the device) with:

- an epilogue that *multiplies* the fp32 accumulator by the per-channel (row vector, (E, N)) and
  per-token (column vector, (total_M,)) scales, where quack's default epilogue adds them;
- fp8: quack's promoted ("slow") accumulation with tile_k = 128, i.e. each pipeline stage's
  WGMMAs start from a zeroed window accumulator and the window is added into the fp32 total
  (`acc_slow += acc`) before the next stage: exactly 128-k promotion windows;
- int8: IGMMA s8 x s8 -> s32 with an s32 accumulator (see `_int_accumulator_shim`), written as
  s32, or converted to fp32 in the epilogue, scaled, and written as bf16;
- fp8 without scales: the window-promoted fp32 accumulator written as it is (the FP8 mining pass
  hashes exactly these values), with a zero written as +0 like the Hopper model.

Compilation uses fake tensors only, so it runs on a CPU-only machine with CUTE_DSL_ARCH=sm_90a.
This module imports cutlass and quack at import time; the host op (kernels.grouped_gemm) imports
it lazily.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Callable

import cutlass
import cutlass.cute as cute
import quack.sm90_utils as quack_sm90_utils
from cutlass import BFloat16, Float32, Float8E4M3FN, Int8, Int32, const_expr
from cutlass.cute.runtime import make_ptr
from quack.compile_utils import make_fake_tensor
from quack.epilogue.ops import ColVecLoad, RowVecLoad
from quack.gemm_default_epi import GemmDefaultEpiMixin
from quack.gemm_sm90 import GemmSm90
from quack.gemm_tvm_ffi_utils import (
    compile_gemm_kernel,
    make_fake_gemm_tensors,
    make_fake_varlen_args,
)
from quack.tile_scheduler import RasterOrderOption, TileSchedulerOptions

from kernels.grouped_gemm_config import (
    GroupedGemmConfig,
    Output,
    Precision,
    is_scaled,
    primary_output,
)

SM90 = (9, 0)

AB_DTYPES = {Precision.BF16: BFloat16, Precision.FP8: Float8E4M3FN, Precision.INT8: Int8}
D_DTYPES = {Output.BF16: BFloat16, Output.INT32: Int32, Output.FP32: Float32}


def _int_accumulator_shim() -> None:
    """Make quack's accumulator fragment take the MMA's accumulator type.

    quack 0.6.5 builds the WGMMA accumulator with a hard-coded Float32 element type
    (`sm90_utils.partition_fragment_ABC`); IGMMA needs Int32. The wrapper rebuilds the fragment
    with `thr_mma.op.acc_dtype` when that is not Float32 and is a no-op for every float MMA, so
    quack's own kernels are unaffected.
    """
    original = quack_sm90_utils.partition_fragment_ABC
    if getattr(original, "_pearl_int_acc", False):
        return

    def partition_fragment_abc(thr_mma, shape_mnk, sA, sB, swap_AB=False):
        acc, tCrA, tCrB = original(thr_mma, shape_mnk, sA, sB, swap_AB)
        acc_dtype = thr_mma.op.acc_dtype
        if const_expr(acc_dtype != Float32):
            acc = cute.make_rmem_tensor(acc.layout, acc_dtype)
        return acc, tCrA, tCrB

    partition_fragment_abc._pearl_int_acc = True
    quack_sm90_utils.partition_fragment_ABC = partition_fragment_abc


_int_accumulator_shim()


class ScaledEpilogueMixin(GemmDefaultEpiMixin):
    """D = acc * row_scale[n] * col_scale[m] (each optional), then the cast to D's type.

    Reuses quack's row/column vector loads (cp.async into shared memory, broadcast into the
    accumulator's register layout, varlen-aware offsets for the per-token column vector).
    """

    @cute.jit
    def epi_visit_subtile(self, params, epi_loop_tensors, tRS_rD: cute.Tensor, tRS_rC=None):
        row = epi_loop_tensors.get("mRowVecBroadcast")
        col = epi_loop_tensors.get("mColVecBroadcast")
        if const_expr(row is not None):
            for i in cutlass.range(cute.size(tRS_rD), unroll_full=True):
                tRS_rD[i] = tRS_rD[i] * row[i]
        if const_expr(col is not None):
            for i in cutlass.range(cute.size(tRS_rD), unroll_full=True):
                tRS_rD[i] = tRS_rD[i] * col[i]
        return ()


class GroupedGemmSm90(ScaledEpilogueMixin, GemmSm90):
    """bf16 and fp8 grouped GEMM (fp32 accumulation; fp8 with 128-k promotion windows)."""


class GroupedGemmFp32AccSm90(GemmDefaultEpiMixin, GemmSm90):
    """fp8 grouped GEMM writing the unscaled fp32 accumulator (128-k promotion windows).

    quack copies the first window into the total (`acc_slow = acc`) where the Hopper model adds
    it to +0, so an all-zero (-0) sum would keep its sign; adding +0 (IEEE: -0 + +0 = +0, every
    other value unchanged) writes it as +0, as the model does.
    """

    @cute.jit
    def epi_visit_subtile(self, params, epi_loop_tensors, tRS_rD: cute.Tensor, tRS_rC=None):
        for i in cutlass.range(cute.size(tRS_rD), unroll_full=True):
            tRS_rD[i] = tRS_rD[i] + Float32(0.0)
        return ()


class GroupedGemmInt8Sm90(ScaledEpilogueMixin, GemmSm90):
    """int8 grouped GEMM: s32 accumulation and s32 output, exact."""

    def __init__(self, acc_dtype, *args, **kwargs):
        super().__init__(Int32, *args, **kwargs)


class _Fp32AccView:
    """A GEMM seen as if its accumulator were fp32: quack's vector loads convert the fp32
    scales to `gemm.acc_dtype`, which for an int8 GEMM (s32) would truncate them to integers."""

    acc_dtype = Float32

    def __init__(self, gemm):
        self._gemm = gemm

    def __getattr__(self, name):
        return getattr(self._gemm, name)


def _fp32_vector_load(base: type) -> type:
    """quack's row or column vector load `base`, keeping the loaded vector in fp32 (plain
    Python overrides: they run inline in the caller's trace)."""

    class Fp32VectorLoad(base):
        def begin(self, gemm, param, smem_tensor, ctx):
            return base.begin(self, _Fp32AccView(gemm), param, smem_tensor, ctx)

        def begin_loop(self, gemm, state, epi_coord):
            return base.begin_loop(self, _Fp32AccView(gemm), state, epi_coord)

    Fp32VectorLoad.__name__ = f"Fp32{base.__name__}"
    return Fp32VectorLoad


_Fp32RowVecLoad = _fp32_vector_load(RowVecLoad)
_Fp32ColVecLoad = _fp32_vector_load(ColVecLoad)


def _fp32_vector_ops(ops: tuple) -> tuple:
    """quack's default epilogue ops with the row/column vector loads replaced by fp32 ones."""
    def replace(op):
        if isinstance(op, RowVecLoad):
            return _Fp32RowVecLoad(op.name)
        if isinstance(op, ColVecLoad):
            return _Fp32ColVecLoad(op.name)
        return op
    return tuple(replace(op) for op in ops)


class GroupedGemmInt8ScaledSm90(GroupedGemmInt8Sm90):
    """int8 grouped GEMM with scaled bf16 output: the exact s32 accumulator, converted to fp32
    subtile by subtile in the epilogue, times the scales, rounded to bf16.

    quack's epilogue fragment (tRS_rD) has the accumulator's type and is converted to D's type
    only after `epi_visit_subtile`; here it is fp32 instead, filled from the s32 accumulator.
    The scale vectors are loaded as fp32 too (quack would convert them to s32).
    """

    _epi_ops = _fp32_vector_ops(GemmDefaultEpiMixin._epi_ops)

    def epilog_smem_store_and_partition(self, tiled_mma, d_layout, dtype, sD, tidx):
        tiled_copy_r2s, tRS_rD, tRS_sD = super().epilog_smem_store_and_partition(
            tiled_mma, d_layout, dtype, sD, tidx)
        return tiled_copy_r2s, cute.make_rmem_tensor(tRS_rD.layout, Float32), tRS_sD

    @cute.jit
    def epi_load_acc_subtile(self, tRS_rAcc: cute.Tensor, tRS_rD: cute.Tensor, epi_coord,
                             no_release: cutlass.Constexpr[bool] = False):
        tRS_rD.store(tRS_rAcc[None, None, None, epi_coord].load().to(Float32))


_KERNEL_CLASSES = {
    (Precision.BF16, Output.BF16): GroupedGemmSm90,
    (Precision.FP8, Output.BF16): GroupedGemmSm90,
    (Precision.FP8, Output.FP32): GroupedGemmFp32AccSm90,
    (Precision.INT8, Output.INT32): GroupedGemmInt8Sm90,
    (Precision.INT8, Output.BF16): GroupedGemmInt8ScaledSm90,
}


def compile_key(config: GroupedGemmConfig) -> GroupedGemmConfig:
    """The config with launch-only fields (swizzle) normalised: variants share one compile."""
    return dataclasses.replace(config, swizzle=8)


def compile_grouped_gemm(precision: Precision, config: GroupedGemmConfig,
                         output: Output | None = None, side_smem: int = 0) -> Callable:
    """`_compile` for the config's compile-time fields (swizzle is passed at launch).

    output: the epilogue variant; by default the precision's primary one (`primary_output`).
    side_smem: > 0 shares each SM with other streams' kernels, leaving them this many bytes of
    shared memory (`sharing`).
    """
    output = primary_output(precision) if output is None else output
    if (precision, output) not in _KERNEL_CLASSES:
        raise ValueError(f"no {precision.value} -> {output.value} variant")
    return _compile(precision, output, compile_key(config), side_smem)


# Register split of a GEMM that shares its SMs (one consumer warpgroup): launched at 128 a
# thread (the launch bound of 2 CTAs an SM), the producer gives back 88 a thread and the
# consumer takes them.
_SHARED_REGS_LOAD, _SHARED_REGS_MMA = 40, 216


@functools.lru_cache(maxsize=None)
def sharing(cls: type, side_smem: int) -> type:
    """`cls` built to share each SM with kernels of other streams: at most 128 registers a
    thread at launch, so a CTA of up to 32K registers fits beside each persistent CTA, and
    pipeline stages sized to leave `side_smem` bytes of shared memory. At decode the GEMM is
    memory-bound and waits on its loads; latency-bound side work (hashing, small
    quantizations) can use those SMs' idle issue slots. Cooperative configs only (one
    consumer warpgroup: 256 threads)."""

    class Sharing(cls):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if self.pingpong or self.mma_warp_groups != 1:
                raise ValueError("a shared-SM GEMM needs a cooperative config with one consumer warpgroup")
            self.occupancy = 2  # the launch bound only: stages come from `_compute_stages` below
            self.num_regs_load, self.num_regs_mma = _SHARED_REGS_LOAD, _SHARED_REGS_MMA

        @classmethod
        def _compute_stages(klass, cta_tile_shape_mnk, epi_tile, a_dtype, b_dtype, d_dtype, c_dtype,
                            epilogue_args, smem_capacity, occupancy, *rest, **kwargs):
            return super()._compute_stages(cta_tile_shape_mnk, epi_tile, a_dtype, b_dtype, d_dtype, c_dtype,
                                           epilogue_args, smem_capacity - side_smem, 1, *rest, **kwargs)

    Sharing.__name__ = f"{cls.__name__}Sharing{side_smem // 1024}K"
    return Sharing


# CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR of sm_90 (228 KiB)
_SM90_SMEM_PER_SM = 233472


@contextlib.contextmanager
def _sm90_smem_without_a_driver():
    """The DSL asks the driver for the shared memory per SM when a kernel has a 2-CTA launch
    bound (`sharing`); on a CPU-only machine (compile checks) sm_90's value answers."""
    from cutlass.base_dsl.runtime import cuda as runtime

    original = runtime.get_device_attribute

    def attribute(which):
        try:
            return original(which)
        except Exception:
            if which != runtime.cuda.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR:
                raise
            return _SM90_SMEM_PER_SM

    runtime.get_device_attribute = attribute
    try:
        yield
    finally:
        runtime.get_device_attribute = original


@functools.lru_cache(maxsize=None)
def _compile(precision: Precision, output: Output, config: GroupedGemmConfig, side_smem: int = 0) -> Callable:
    """Trace, lower and assemble one variant for sm_90a; shapes stay symbolic.

    The returned TVM-FFI function takes (A, B, D, C, epilogue args, scheduler args, varlen args,
    SFA, SFB) with A (total_M, K), B (E, N, K), D (total_M, N), C None, SFA/SFB None.
    """
    cls = _KERNEL_CLASSES[(precision, output)]
    cls = sharing(cls, side_smem) if side_smem else cls
    return compile_variant(cls, precision, output, config, fake_scale_arguments(cls, is_scaled(precision, output)),
                           side_smem)


def fake_scale_arguments(cls: type, scaled: bool = True) -> Callable:
    """`compile_variant`'s epilogue builder for quack's default arguments: the per-channel (E, N)
    and per-row (total_M,) fp32 scales as symbolic fakes, or none."""
    def scales(m, n, num_experts):
        return cls.EpilogueArguments(
            mRowVecBroadcast=(make_fake_tensor(Float32, (num_experts, n), leading_dim=1, divisibility=4)
                              if scaled else None),
            mColVecBroadcast=(make_fake_tensor(Float32, (m,), leading_dim=0, divisibility=4)
                              if scaled else None),
        )
    return scales


def compile_variant(cls: type, precision: Precision, output: Output, config: GroupedGemmConfig,
                    epilogue: Callable, side_smem: int = 0, gather: bool = False,
                    c_dtype: type | None = None, dynamic: bool = False, store_d: bool = True) -> Callable:
    """Compile kernel class `cls` (a GemmSm90 with its epilogue) for one config;
    `epilogue(total_M, N, E)` builds its fake epilogue arguments from the GEMM's symbolic sizes.
    gather: A's rows are read through an index (quack's gather_A: output row r reads A row
    A_idx[r] by cp.async, so A needs no copy into expert order); needs cluster_n = 1.
    c_dtype: the kernel also reads a C operand of this type (total_M, N), row-major, which its
    epilogue sees subtile by subtile (quack's TMA-loaded C).
    dynamic: the persistent CTAs take each tile after their first from an int32 tile counter
    (quack's dynamic scheduler; `launch_variant(tile_counter=)`), so a CTA slowed by kernels
    sharing its SM takes fewer tiles than one running alone.
    store_d = False: no D operand at all (the epilogue writes what it produces itself; the
    launch passes None for D)."""
    if gather and config.cluster_n != 1:
        raise ValueError(f"a gathering GEMM needs cluster_n = 1 (A is not multicast), got {config.key}")
    ab_dtype, d_dtype = AB_DTYPES[precision], D_DTYPES[output] if store_d else None
    mA, mB, mD, mC, m, n, _k, num_experts = make_fake_gemm_tensors(
        ab_dtype, ab_dtype, d_dtype, c_dtype, "k", "k", "n", "n" if c_dtype else None, varlen_m=True,
        gather_A=gather)
    scheduler_args = TileSchedulerOptions(
        max_active_clusters=Int32(1), max_swizzle_size=Int32(8),
        raster_order=RasterOrderOption.AlongM if config.raster_along_m else RasterOrderOption.Heuristic,
        tile_count_semaphore=make_ptr(Int32, 0, cute.AddressSpace.gmem, assumed_align=4) if dynamic else None)
    varlen_args = make_fake_varlen_args(True, False, gather, m)
    with _sm90_smem_without_a_driver() if side_smem else contextlib.nullcontext():
        return compile_gemm_kernel(
            cls, ab_dtype, (config.tile_m, config.tile_n, config.tile_k),
            (config.cluster_m, config.cluster_n, 1), config.pingpong, True, gather, dynamic, SM90,
            mA, mB, mD, mC, epilogue(m, n, num_experts), scheduler_args, varlen_args)
