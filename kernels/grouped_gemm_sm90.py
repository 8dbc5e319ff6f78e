"""Device side of the grouped GEMM: the sm_90a kernel classes and their compilation.

The kernels are quack's `GemmSm90` (TMA + WGMMA, warp-specialised producer/consumers, persistent
tile scheduler, varlen-M over experts through `cu_seqlens_m` read on the device) with:

- an epilogue that *multiplies* the fp32 accumulator by the per-channel (row vector, (E, N)) and
  per-token (column vector, (total_M,)) scales, where quack's default epilogue adds them;
- fp8: quack's promoted ("slow") accumulation with tile_k = 128, i.e. each pipeline stage's
  WGMMAs start from a zeroed window accumulator and the window is added into the fp32 total
  (`acc_slow += acc`) before the next stage: exactly 128-k promotion windows;
- int8: IGMMA s8 x s8 -> s32 with an s32 accumulator and s32 output (see `_int_accumulator_shim`).

Compilation uses fake tensors only, so it runs on a CPU-only machine with CUTE_DSL_ARCH=sm_90a.
This module imports cutlass and quack at import time; the host op (kernels.grouped_gemm) imports
it lazily.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import cutlass
import cutlass.cute as cute
import quack.sm90_utils as quack_sm90_utils
from cutlass import BFloat16, Float32, Float8E4M3FN, Int8, Int32, const_expr
from quack.compile_utils import make_fake_tensor
from quack.gemm_default_epi import GemmDefaultEpiMixin
from quack.gemm_sm90 import GemmSm90
from quack.gemm_tvm_ffi_utils import (
    compile_gemm_kernel,
    make_fake_gemm_tensors,
    make_fake_varlen_args,
)
from quack.tile_scheduler import RasterOrderOption, TileSchedulerOptions

from kernels.grouped_gemm_config import GroupedGemmConfig, Precision

SM90 = (9, 0)

# (A/B dtype, D dtype, has scales) per precision.
DTYPES = {
    Precision.BF16: (BFloat16, BFloat16, False),
    Precision.FP8: (Float8E4M3FN, BFloat16, True),
    Precision.INT8: (Int8, Int32, False),
}


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


class GroupedGemmInt8Sm90(ScaledEpilogueMixin, GemmSm90):
    """int8 grouped GEMM: s32 accumulation and s32 output, exact."""

    def __init__(self, acc_dtype, *args, **kwargs):
        super().__init__(Int32, *args, **kwargs)


def kernel_class(precision: Precision) -> type:
    return GroupedGemmInt8Sm90 if precision is Precision.INT8 else GroupedGemmSm90


def compile_key(config: GroupedGemmConfig) -> GroupedGemmConfig:
    """The config with launch-only fields (swizzle) normalised: variants share one compile."""
    return dataclasses.replace(config, swizzle=8)


def compile_grouped_gemm(precision: Precision, config: GroupedGemmConfig) -> Callable:
    """`_compile` for the config's compile-time fields (swizzle is passed at launch)."""
    return _compile(precision, compile_key(config))


@functools.lru_cache(maxsize=None)
def _compile(precision: Precision, config: GroupedGemmConfig) -> Callable:
    """Trace, lower and assemble one variant for sm_90a; shapes stay symbolic.

    The returned TVM-FFI function takes (A, B, D, C, epilogue args, scheduler args, varlen args,
    SFA, SFB) with A (total_M, K), B (E, N, K), D (total_M, N), C None, SFA/SFB None.
    """
    ab_dtype, d_dtype, scaled = DTYPES[precision]
    cls = kernel_class(precision)
    mA, mB, mD, mC, m, n, _k, num_experts = make_fake_gemm_tensors(
        ab_dtype, ab_dtype, d_dtype, None, "k", "k", "n", None, varlen_m=True)
    epi_args = cls.EpilogueArguments(
        mRowVecBroadcast=(make_fake_tensor(Float32, (num_experts, n), leading_dim=1, divisibility=4)
                          if scaled else None),
        mColVecBroadcast=(make_fake_tensor(Float32, (m,), leading_dim=0, divisibility=4)
                          if scaled else None),
    )
    scheduler_args = TileSchedulerOptions(
        max_active_clusters=Int32(1), max_swizzle_size=Int32(8),
        raster_order=RasterOrderOption.AlongM if config.raster_along_m else RasterOrderOption.Heuristic)
    varlen_args = make_fake_varlen_args(True, False, False, None)
    return compile_gemm_kernel(
        cls, ab_dtype, (config.tile_m, config.tile_n, config.tile_k),
        (config.cluster_m, config.cluster_n, 1), config.pingpong, True, False, False, SM90,
        mA, mB, mD, mC, epi_args, scheduler_args, varlen_args)
