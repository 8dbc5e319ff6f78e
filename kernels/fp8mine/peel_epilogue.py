"""The peel and unscale (§10) inside the mined GEMM's epilogue, after the lottery fold (off by
default, `matmul.PEEL_IN_EPILOGUE`: within two bf16 steps of the peel pass on the H200, but the
pass is slower with it, 5333 against 4240 µs at GLM-5 prefill in session 11).

out = (acc + A_peel[token] · B_peel[w]ᵀ) · (1/α_A[token]) · (1/α_B[w, col]) in bf16, as
peel.peel_and_unscale computes it from the written accumulator, but from registers: the 1 GB
fp32 accumulator of a GLM-5 prefill launch is never written and the 630 µs peel pass goes.

Why mma.sync fits: per warp, Hopper's WGMMA accumulator of an 8-column block is exactly the C
fragment of an m16n8k16 warp MMA (c0, c1 at row g = lane/4, columns 2q, 2q + 1 with q = lane % 4;
c2, c3 at row g + 8), so the rank-64 correction is 4 bf16 MMAs per 8 columns chained onto the
accumulator. A fragments come from the A peel rows of the thread's two tokens (Rflat gathers
them), B fragments from the B peel rows of the block's columns (int32 pairs of bf16). The scales
are quack's per-row and per-column vector loads, applied column scale first as peel.py does.
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, Int32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T
from quack.gemm_default_epi import GemmDefaultEpiMixin
from quack.gemm_sm90 import GemmSm90

from kernels.grouped_gemm import launch_variant
from kernels.grouped_gemm_config import GroupedGemmConfig, Output, Precision
from kernels.grouped_gemm_sm90 import compile_variant
from kernels.mining_epilogue import MiningParamsMixin, fake_peel_arguments, mining_arguments

from .fold_epilogue import FoldEpilogueMixin, checked_config, fits

_MAX_TILE_N = 128  # 192-wide tiles spill registers with the peel (sm_90a SASS: 8-10 local accesses)
_K_STEPS = 4  # 64 peel columns = 4 MMAs of k = 16
_MMA = ("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};")


def _mma(c: list, a: list, b: list) -> list:
    """d = a · b + c for one m16n8k16 bf16 warp MMA: a 4, b 2 packed bf16-pair words, c 4 fp32."""
    out = llvm.inline_asm(
        llvm.StructType.get_literal([T.f32()] * 4), [x.ir_value() for x in a + b + c], _MMA,
        "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", has_side_effects=False, is_align_stack=False)
    return [Float32(llvm.extractvalue(T.f32(), out, [i])) for i in range(4)]


class PeelEpilogueMixin(FoldEpilogueMixin):
    """epi_visit_acc: the lottery fold of the pre-peel accumulator, then the peel correction in
    place; epi_visit_subtile: the unscale (quack writes bf16 after it)."""

    @cute.jit
    def epi_visit_acc(self, params, acc: cute.Tensor, tiled_mma, tile_coord_mnkl, tidx: Int32) -> None:
        self.fold_tiles(params, acc, tiled_mma, tile_coord_mnkl, tidx)
        self.add_correction(params, acc, tiled_mma, tile_coord_mnkl, tidx)

    @cute.jit
    def add_correction(self, params, acc: cute.Tensor, tiled_mma, tile_coord_mnkl, tidx: Int32) -> None:
        tile_m, tile_n = self.cta_tile_shape_mnk[0], self.cta_tile_shape_mnk[1]
        ident = tiled_mma.get_slice(tidx).partition_C(cute.make_identity_tensor((tile_m, tile_n)))
        expert = tile_coord_mnkl[3]
        start = params.lottery_bounds[expert]
        rows = params.lottery_bounds[expert + 1] - start
        n_e = cute.size(params.lottery_lanes, mode=[1]) * 64
        q = tidx % 4
        g = (tidx % 32) // 4
        for mm in cutlass.range_constexpr(cute.size(acc, mode=[1])):
            for mn in cutlass.range_constexpr(cute.size(acc, mode=[2])):
                a = [[Int32(0)] * 4 for _ in range(_K_STEPS)]
                for h in cutlass.range_constexpr(2):  # rows g and g + 8 of the warp's slab
                    m, _ = ident[(0, h, 0), mm, mn]
                    row = tile_coord_mnkl[0] * tile_m + m
                    token = params.peel_rflat[start + cutlass.select_(row < rows, row, 0)]
                    for s in cutlass.range_constexpr(_K_STEPS):
                        a[s][h] = params.peel_a[token, 8 * s + q]
                        a[s][2 + h] = params.peel_a[token, 8 * s + q + 4]
                for nb in cutlass.range_constexpr(cute.size(acc, mode=[0, 2])):
                    _, n = ident[(0, 0, nb), mm, mn]  # this thread's column 2q of the 8-column block
                    col = tile_coord_mnkl[1] * tile_n + n - 2 * q + g  # B's column for lane (g, q): g
                    b_row = expert * n_e + cutlass.select_(col < n_e, col, 0)
                    c = [acc[(0, 0, nb), mm, mn], acc[(1, 0, nb), mm, mn],
                         acc[(0, 1, nb), mm, mn], acc[(1, 1, nb), mm, mn]]
                    for s in cutlass.range_constexpr(_K_STEPS):
                        c = _mma(c, a[s], [params.peel_b[b_row, 8 * s + q], params.peel_b[b_row, 8 * s + q + 4]])
                    acc[(0, 0, nb), mm, mn], acc[(1, 0, nb), mm, mn] = c[0], c[1]
                    acc[(0, 1, nb), mm, mn], acc[(1, 1, nb), mm, mn] = c[2], c[3]

    @cute.jit
    def epi_visit_subtile(self, params, epi_loop_tensors, tRS_rD: cute.Tensor, tRS_rC=None):
        per_row = epi_loop_tensors.get("mColVecBroadcast")  # 1/α_A of each output row
        per_col = epi_loop_tensors.get("mRowVecBroadcast")  # 1/α_B of each column
        for i in cutlass.range(cute.size(tRS_rD), unroll_full=True):
            tRS_rD[i] = tRS_rD[i] * per_row[i] * per_col[i]
        return ()


class Bf16PeelSm90(MiningParamsMixin, PeelEpilogueMixin, GemmDefaultEpiMixin, GemmSm90):
    """fp8 grouped GEMM (128-k promotion) → fold, peel and unscale → bf16 out."""


def peel_fits(config: GroupedGemmConfig, n: int) -> bool:
    """Whether the peel epilogue runs this config: the fold's `fits`, at most 128 columns a tile."""
    return fits(config, n) and config.tile_n <= _MAX_TILE_N


@functools.lru_cache(maxsize=None)
def compile_peel_gemm(config: GroupedGemmConfig, gather: bool = False) -> Callable:
    """The fp8 grouped GEMM with the fold, peel and unscale epilogue → bf16, for sm_90a;
    gather: A's rows read through Rflat (`compile_variant`)."""
    return compile_variant(Bf16PeelSm90, Precision.FP8, Output.BF16, config, fake_peel_arguments, gather=gather)


class PeelOperands(NamedTuple):
    """What the epilogue peel reads (device tensors)."""

    rflat: torch.Tensor  # (rows,) int32: output row → token
    a_peel: torch.Tensor  # (tokens, 64) bf16
    inv_alpha_rows: torch.Tensor  # (rows,) fp32: 1/α_A[Rflat[row]]
    b_peel: torch.Tensor  # (e, n, 64) bf16
    inv_alpha_b: torch.Tensor  # (e, n) fp32


def peeled_grouped_gemm(a: torch.Tensor, b: torch.Tensor, bounds: torch.Tensor, out: torch.Tensor,
                        lanes: torch.Tensor, peel: PeelOperands,
                        config: GroupedGemmConfig | None = None, gather: bool = False) -> torch.Tensor:
    """out (rows, n) bf16 = the peeled, unscaled layer output; `lanes` as `folded_grouped_gemm`.
    gather: a is the (tokens, k) token rows and the GEMM reads row r from a[rflat[r]]."""
    experts, n, k = b.shape
    config = checked_config(config, peel.rflat.shape[0], tuple(b.shape), gather, fit=peel_fits)
    epi = mining_arguments(bounds, lanes, mRowVecBroadcast=peel.inv_alpha_b, mColVecBroadcast=peel.inv_alpha_rows,
                           peel_a=peel.a_peel.contiguous().view(torch.int32),
                           peel_b=peel.b_peel.contiguous().view(torch.int32).view(experts * n, 32),
                           peel_rflat=peel.rflat)
    launch_variant(compile_peel_gemm(config, gather), a, b, bounds, out, config, epi,
                   a_idx=peel.rflat if gather else None)
    return out
