"""The peel and unscale (§10) inside the mined GEMM, its operands staged by the GEMM's own TMA
ring: out = (acc + A_peel · B_peelᵀ) · (1/α_A[row]) · (1/α_B[w, col]) in bf16, where acc is the
window-promoted e4m3 accumulator after the lottery fold (`matmul.PEEL_IN_EPILOGUE`).

How the operands travel. A bf16 peel row (64 values) is 128 bytes, exactly one 128-k slice of
an e4m3 row, and a 128-byte-swizzled (rows, 64) bf16 tile has the same bytes in shared memory as
a 128-byte-swizzled (rows, 128) e4m3 tile. So each A′ row carries its A peel as a 128-byte tail
(`peel.write_tails`: the GEMM's A is (rows, k + 128) e4m3) and each B′ row its B peel, and the
producer warp loads the tails as one more k-tile of the ring, with no change to it. The consumer
runs the e4m3 k-tiles as the folding GEMM does, folds the lottery tiles from the total, and then
reads the last stage as bf16 (the same shared memory, a bf16 view) with one K = 64 bf16 WGMMA
chain into the same accumulator, as Pearl's Hopper kernel does (fp8-and-integration.md §10).

Why not the earlier register-fed form (session 11): its ~150 scattered global loads a thread ran
while the tensor cores idled, and the pass was 1.1 ms slower than with the peel pass.

This module imports cutlass and quack at import time, like kernels.grouped_gemm_sm90.
"""
from __future__ import annotations

import functools
from typing import Callable

import cutlass
import cutlass.cute as cute
import torch
from cutlass import BFloat16, Int32, const_expr
from cutlass.cute.nvgpu import warpgroup
import cutlass.utils.hopper_helpers as sm90_utils
import quack.sm90_utils as quack_sm90_utils
from quack.gemm_default_epi import GemmDefaultEpiMixin
from quack.gemm_sm90 import GemmSm90

from kernels.grouped_gemm import launch_variant, tma_operand
from kernels.grouped_gemm_config import GroupedGemmConfig, Output, Precision
from kernels.grouped_gemm_sm90 import compile_variant
from kernels.mining_epilogue import MiningParamsMixin, fake_unscale_arguments, mining_arguments

from .fold_epilogue import FoldEpilogueMixin, checked_config, fits
from .peel import TAIL_BYTES

PEEL_COLUMNS = TAIL_BYTES // 2  # 2r = 64: the peel's K, one bf16 row in one 128-k e4m3 slice


class PeelTileMixin(FoldEpilogueMixin):
    """mma: every k-tile but the last (the peel tails) as the folding GEMM; epi_visit_acc: the
    fold of the pre-peel total, then the peel tile's bf16 WGMMAs into it; epi_visit_subtile:
    the unscale (quack writes bf16 after it)."""

    # quack's kernel hands its epilogue hooks neither the ring's shared memory nor the pipeline
    # state, so the two hooks that see them (`epi_get_smem_tensors`, `mma`) keep them on self for
    # `add_peel_tile`: trace-time values of the same kernel body, read later in the same trace.

    def epi_get_smem_tensors(self, params, storage):
        """Also the ring's A and B stages seen as bf16 (for the peel tile's WGMMA)."""
        tile_m, tile_n = self.cta_tile_shape_mnk[0], self.cta_tile_shape_mnk[1]
        a_layout, b_layout, _, _ = self._make_smem_layouts(
            (tile_m, tile_n, PEEL_COLUMNS), self.epi_tile, BFloat16, self.a_layout, BFloat16, self.b_layout,
            self.ab_stage, None, self.d_layout, 0, None, None, 0)
        self._peel_smem = (storage.sA.get_tensor(a_layout.outer, swizzle=a_layout.inner, dtype=BFloat16),
                           storage.sB.get_tensor(b_layout.outer, swizzle=b_layout.inner, dtype=BFloat16))
        return super().epi_get_smem_tensors(params, storage)

    def mma(self, ab_pipeline, ab_read_state, mma_fn, acc, acc_slow, k_tile_cnt: Int32, warp_group_idx: Int32):
        """The e4m3 k-tiles (quack's promoted loop), leaving the peel tile's stage for the epilogue."""
        ab_read_state = super().mma(ab_pipeline, ab_read_state, mma_fn, acc, acc_slow, k_tile_cnt - 1,
                                    warp_group_idx)
        self._peel_stage = (ab_pipeline, ab_read_state.clone())
        ab_read_state.advance()
        return ab_read_state

    @cute.jit
    def epi_visit_acc(self, params, acc: cute.Tensor, tiled_mma, tile_coord_mnkl, tidx: Int32) -> None:
        self.fold_tiles(params, acc, tiled_mma, tile_coord_mnkl, tidx)
        self.add_peel_tile(acc, tidx)

    @cute.jit
    def add_peel_tile(self, acc: cute.Tensor, tidx: Int32) -> None:
        """acc += A_peel · B_peelᵀ from the peel tile's ring stage (bf16, K = 64), then the stage
        goes back to the producer."""
        tile_m, tile_n = self.cta_tile_shape_mnk[0], self.cta_tile_shape_mnk[1]
        # the fold's configs split no tile along N between warpgroups (quack then permutes N)
        assert self.atom_layout_mnk[1] == 1, "the peel tile needs one warpgroup column"
        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            BFloat16, BFloat16, self.a_layout.sm90_mma_major_mode(), self.b_layout.sm90_mma_major_mode(),
            self.acc_dtype, self.atom_layout_mnk, tiler_mn=(64, tile_n // self.atom_layout_mnk[1]))
        warp_group = 0 if const_expr(self.pingpong) else tidx // 128
        thr_mma = tiled_mma.get_slice(warp_group * 128)
        s_a, s_b = self._peel_smem
        _, t_a, t_b = quack_sm90_utils.partition_fragment_ABC(thr_mma, (tile_m, tile_n, PEEL_COLUMNS), s_a, s_b)
        pipeline, stage = self._peel_stage
        pipeline.consumer_wait(stage)
        quack_sm90_utils.gemm_w_idx(tiled_mma, acc, t_a, t_b, zero_init=False, A_idx=stage.index, B_idx=stage.index)
        warpgroup.wait_group(0)
        pipeline.consumer_release(stage)

    @cute.jit
    def epi_visit_subtile(self, params, epi_loop_tensors, tRS_rD: cute.Tensor, tRS_rC=None):
        per_row = epi_loop_tensors.get("mColVecBroadcast")  # 1/α_A of each output row
        per_col = epi_loop_tensors.get("mRowVecBroadcast")  # 1/α_B of each column
        for i in cutlass.range(cute.size(tRS_rD), unroll_full=True):
            tRS_rD[i] = tRS_rD[i] * per_row[i] * per_col[i]
        return ()


class Bf16PeelSm90(MiningParamsMixin, PeelTileMixin, GemmDefaultEpiMixin, GemmSm90):
    """fp8 grouped GEMM (128-k promotion) + the peel tile → fold, peel and unscale → bf16 out."""


def peel_fits(config: GroupedGemmConfig, n: int, k: int) -> bool:
    """Whether the peel epilogue runs this config: the fold's `fits`, and k whole 128-k tiles
    (the peel tile must start a ring stage of its own)."""
    return fits(config, n) and k % 128 == 0


@functools.lru_cache(maxsize=None)
def compile_peel_gemm(config: GroupedGemmConfig, gather: bool = False) -> Callable:
    """The fp8 grouped GEMM with the peel tile and the fold, peel and unscale epilogue → bf16,
    for sm_90a (fake tensors); gather: A's rows (their tails included) read through an index
    (`compile_variant`)."""
    return compile_variant(Bf16PeelSm90, Precision.FP8, Output.BF16, config, fake_unscale_arguments,
                           gather=gather)


def peeled_grouped_gemm(a: torch.Tensor, b: torch.Tensor, bounds: torch.Tensor, out: torch.Tensor,
                        lanes: torch.Tensor, inv_alpha_rows: torch.Tensor, inv_alpha_b: torch.Tensor,
                        config: GroupedGemmConfig | None = None, a_idx: torch.Tensor | None = None) -> torch.Tensor:
    """out (rows, n) bf16 = the peeled, unscaled layer output; `lanes` as
    `fold_epilogue.folded_grouped_gemm` (folded from the pre-peel accumulator).

    a (rows, k + TAIL_BYTES) e4m3: A′'s rows in expert order, each followed by its A peel row's
    128 bytes; b (e, n, k + TAIL_BYTES) e4m3: B′'s rows each followed by its B peel row
    (`peel.write_tails` builds both; strided views are read in place). bounds (e+1,) int32 row
    offsets; inv_alpha_rows (rows,) fp32 1/α_A of each output row; inv_alpha_b (e, n) fp32 1/α_B.
    config: one that `peel_fits` (default: the fold GEMM's for k). a_idx: (rows,) int32; then a
    holds the (tokens, k + TAIL_BYTES) token rows and output row r reads a[a_idx[r]] (the GEMM
    gathers the rows with their tails: A′ is written once, not once per expert copy)."""
    experts, n, padded_k = b.shape
    rows, k = a.shape[0] if a_idx is None else a_idx.shape[0], padded_k - TAIL_BYTES
    if a.shape[1] != padded_k or k <= 0 or k % 128:
        raise ValueError(f"a {tuple(a.shape)} and b {tuple(b.shape)} must share k + {TAIL_BYTES}, k a multiple of 128")
    if out.dtype != torch.bfloat16 or out.shape != (rows, n):
        raise ValueError(f"out must be bfloat16 ({rows}, {n}), got {out.dtype} {tuple(out.shape)}")
    if inv_alpha_rows.shape != (rows,) or inv_alpha_b.shape != (experts, n):
        raise ValueError(f"need inv_alpha_rows ({rows},) and inv_alpha_b ({experts}, {n}), got "
                         f"{tuple(inv_alpha_rows.shape)} and {tuple(inv_alpha_b.shape)}")
    config = checked_config(config, rows, (experts, n, k), a_idx is not None, fit=lambda c, n_: peel_fits(c, n_, k))
    epi = mining_arguments(bounds, lanes, mRowVecBroadcast=inv_alpha_b.float().contiguous(),
                           mColVecBroadcast=inv_alpha_rows.float().contiguous())
    launch_variant(compile_peel_gemm(config, a_idx is not None), tma_operand(a), tma_operand(b), bounds, out, config,
                   epi, a_idx=a_idx)
    return out
