"""The split peel (split_peel.py) on the CuTe int8 grouped GEMM: out = bf16((raw − Σ_d 256^d ·
left_d · right_dᵀ) · scale_a · scale_b), for prefill after the CuTe transcript GEMM
(transcript_gemm), in place of the Triton `peel_digits` (~870 µs at GLM-5 prefill, 64 × 128 blocks).

The digit sum is the GEMM: left (rows, D·2r) and right (E, N, D·2r) int8, digits top first, so
Horner's rule needs ×256 at each digit boundary: every 2r = 256 columns of depth is two k-tiles of
128, and after the second of each pair but the last the accumulator is shifted left by 8 bits
(`visit_k_tile`, wrapping int32 like the Triton kernel: the true A·B fits in int32, so every
intermediate is exact modulo 2^32). The raw A'·B' comes in as the GEMM's C operand (quack loads it
by TMA, subtile by subtile), and the epilogue subtracts in int32 before converting: (raw − sum) as
fp32, times scale_a[row], times scale_b[col], rounded to bf16 — the Triton kernel's order, so the
two give the same bits.

This module imports cutlass and quack at import time, like kernels.grouped_gemm_sm90.
"""
from __future__ import annotations

import functools
from typing import Callable

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, Int32

from kernels.grouped_gemm import launch_variant
from kernels.grouped_gemm_config import GroupedGemmConfig, Output, Precision, Regime, regime_for, select_config
from kernels.grouped_gemm_sm90 import GroupedGemmInt8ScaledSm90, compile_variant, fake_scale_arguments
from kernels.visited_mainloop import VisitedMainloopMixin

from .mined_gemm import check_operand

TILE_K = 128
SEGMENT = 256  # 2r columns of depth a digit (rank 128): two k-tiles


class HornerMainloopMixin(VisitedMainloopMixin):
    """acc ← acc · 256 after each digit's last k-tile but the last digit's."""

    @cute.jit
    def visit_k_tile(self, acc: cute.Tensor, k_tile: Int32, k_tile_cnt: Int32) -> None:
        if ((k_tile + 1) % (SEGMENT // TILE_K) == 0) & (k_tile + 1 < k_tile_cnt):
            for i in cutlass.range(cute.size(acc), unroll_full=True):
                acc[i] = acc[i] << 8


class Int8PeelSm90(HornerMainloopMixin, GroupedGemmInt8ScaledSm90):
    """raw (C, s32) minus the digit sum, scaled → bf16; the s32 subtile is kept beside the fp32
    fragment quack converts to bf16, so the subtraction is exact."""

    def epilog_smem_store_and_partition(self, tiled_mma, d_layout, dtype, sD, tidx):
        tiled_copy_r2s, tRS_rD, tRS_sD = super().epilog_smem_store_and_partition(tiled_mma, d_layout, dtype, sD, tidx)
        self.acc_subtile = cute.make_rmem_tensor(tRS_rD.layout, Int32)
        return tiled_copy_r2s, tRS_rD, tRS_sD

    @cute.jit
    def epi_load_acc_subtile(self, tRS_rAcc: cute.Tensor, tRS_rD: cute.Tensor, epi_coord,
                             no_release: cutlass.Constexpr[bool] = False):
        self.acc_subtile.store(tRS_rAcc[None, None, None, epi_coord].load())

    @cute.jit
    def epi_visit_subtile(self, params, epi_loop_tensors, tRS_rD: cute.Tensor, tRS_rC=None):
        per_col = epi_loop_tensors.get("mRowVecBroadcast")  # scale_b of each column
        per_row = epi_loop_tensors.get("mColVecBroadcast")  # scale_a of each row
        for i in cutlass.range(cute.size(tRS_rD), unroll_full=True):
            tRS_rD[i] = Float32(tRS_rC[i] - self.acc_subtile[i]) * per_row[i] * per_col[i]
        return ()


def fits(config: GroupedGemmConfig, depth: int) -> bool:
    """Whole digit segments of two k-tiles."""
    return config.tile_k == TILE_K and depth % SEGMENT == 0 and config.tile_m not in (192, 320)


# The prefill tile, measured on the H200 (session 11, GLM-5 FC1 prefill's peel, depth 768, same
# run): 632.8 µs at 64 × 256 ping-pong against 797.0 at the int8 selector's 128 × 128 (2 × 1
# cluster) and 727.2 at 128 × 256.
PREFILL_CONFIG = GroupedGemmConfig.from_key("64x256x128_c1x1_pp")


@functools.lru_cache(maxsize=256)
def peel_config(rows: int, experts: int, n: int, depth: int) -> GroupedGemmConfig | None:
    """PREFILL_CONFIG for prefill-sized launches, else the int8 selector's config; None where the
    choice does not `fit`."""
    prefill = regime_for(rows, experts) is Regime.PREFILL
    config = PREFILL_CONFIG if prefill else select_config(Precision.INT8, rows, experts, n, depth)
    return config if fits(config, depth) else None


@functools.lru_cache(maxsize=None)
def compile_peel_gemm(config: GroupedGemmConfig) -> Callable:
    """The digit-sum GEMM with raw as C and the scaled bf16 epilogue, for sm_90a (fake tensors)."""
    return compile_variant(Int8PeelSm90, Precision.INT8, Output.BF16, config, fake_scale_arguments(Int8PeelSm90),
                           c_dtype=Int32)


def peel_gemm(left: torch.Tensor, right: torch.Tensor, bounds: torch.Tensor, raw: torch.Tensor,
              scale_a: torch.Tensor, scale_b: torch.Tensor, out: torch.Tensor,
              config: GroupedGemmConfig | None = None) -> torch.Tensor:
    """out (rows, n) bf16 = (raw − Σ_d 256^d · left_d · right_dᵀ) · scale_a[row] · scale_b[e, col].

    left (rows, D·2r) int8 in expert order, right (e, n, D·2r) int8 (split_peel.digit_operands'
    layout, digits top first), bounds (e+1,) int32 row offsets, raw (rows, n) int32, scale_a
    (rows,) and scale_b (e, n) float32.
    """
    experts, n, depth = right.shape
    rows = left.shape[0]
    config = config or peel_config(rows, experts, n, depth)
    if config is None or not fits(config, depth):
        name = "the selector's config" if config is None else config.key
        raise ValueError(f"{name} does not fit the peel GEMM for {rows} rows × {tuple(right.shape)}")
    for name, t, shape, dtype in (("left", left, (rows, depth), torch.int8), ("raw", raw, (rows, n), torch.int32),
                                  ("scale_a", scale_a, (rows,), torch.float32),
                                  ("scale_b", scale_b, (experts, n), torch.float32),
                                  ("out", out, (rows, n), torch.bfloat16)):
        check_operand(name, t, shape, dtype)
    epi = Int8PeelSm90.EpilogueArguments(mRowVecBroadcast=scale_b, mColVecBroadcast=scale_a,
                                         add_to_output=None, rounding_mode=None)
    launch_variant(compile_peel_gemm(config), left, right, bounds, out, config, epi, c=raw)
    return out
