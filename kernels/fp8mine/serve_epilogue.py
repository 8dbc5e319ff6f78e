"""The lagged decode GEMM that serves its clean rows itself (§10): no serving peel after it.

A lagged launch's combined operand holds, per expert, the READY rows (the previous launch's A′,
mined) and then the clean rows (this launch's tokens, served). This GEMM's epilogue
- folds the READY rows' lottery tiles into their compact lanes (`FoldEpilogueMixin`, as the
  folding GEMM), and
- peels and unscales the clean rows straight from the fp32 accumulator in registers and stores
  them as bf16 at their compact positions (expert order, the layout the MoE combine reads):
  out[i, j] = (acc + A_peel[t] · B_peel[w, j]) · 1/α_A[t] · 1/α_B[w, j], t = Rflat[i].

Clean rows carry no A noise, so their A peel's left half is zero and only the right halves
enter: A_c′ · F_Bᵀ (32 values a token, written by the lagged front) against −β_B ⊙ E_B (32 bf16
a column, 64 bytes, read as 16 words). The products run on the CUDA cores of the consumer
warpgroup (a decode tile holds ~16 clean rows of 64, so one or two warps do them) while the
producer warp keeps streaming the next tile's weights. Nothing else is stored: the GEMM has no D
operand (READY rows' accumulator was never read), and the rows' bf16 accumulator no longer
makes a round trip through memory.

The host side checks the shapes and the config (`served_grouped_gemm`). This module imports
cutlass and quack at import time, like kernels.grouped_gemm_sm90.
"""
from __future__ import annotations

import functools
from typing import Callable

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, Int32, Uint32, const_expr
from cutlass._mlir_helpers.arith import bitcast
from cutlass.cutlass_dsl import T
from quack.compile_utils import make_fake_tensor

from kernels.grouped_gemm import launch_variant, shared_config
from kernels.grouped_gemm_config import GroupedGemmConfig, Output, Precision
from kernels.grouped_gemm_sm90 import GroupedGemmFp32AccSm90, compile_variant, sharing
from kernels.mining_epilogue import MiningParamsMixin, fake_tile_words_arguments, mining_arguments

from .fold_epilogue import FoldEpilogueMixin, checked_config
from .lagged import PEEL_HALF

_HALF_WORDS = PEEL_HALF // 2  # that half of a bf16 B peel row as int32 words


def _f32(bits: Uint32) -> Float32:
    return Float32(bitcast(bits.ir_value(), T.f32()))


def _bf16_bits(x: Float32) -> Uint32:
    """x rounded to nearest-even bf16, as its 16 bits (finite values)."""
    u = Uint32(bitcast(x.ir_value(), T.i32()))
    return (u + Uint32(0x7FFF) + ((u >> 16) & Uint32(1))) >> 16


class ServeEpilogueMixin(FoldEpilogueMixin):
    """epi_visit_acc: the READY rows' fold (lottery_bounds), then the clean rows' peel, unscale
    and bf16 store (serve_*)."""

    @cute.jit
    def epi_visit_acc(self, params, acc: cute.Tensor, tiled_mma, tile_coord_mnkl, tidx: Int32) -> None:
        self.fold_tiles(params, acc, tiled_mma, tile_coord_mnkl, tidx)
        self.serve_clean_rows(params, acc, tiled_mma, tile_coord_mnkl, tidx)

    @cute.jit
    def serve_clean_rows(self, params, acc: cute.Tensor, tiled_mma, tile_coord_mnkl, tidx: Int32) -> None:
        """This thread's fragment rows that are clean rows of the tile's expert (expert-local
        row ready + i, i < the expert's clean count): each column pair peeled, unscaled and
        packed into one word, a row's words stored after all its loads.

        Why the B peel travels by shuffles: the fragment gives lane l columns 8·nb + 2·(l % 4) + c,
        so one thread would walk 32 columns' peels one dependent load after another (the first
        form: the GEMM 90 µs slower at GLM-5 decode on an H100). Instead a warp with a clean row
        loads each 8-column block's peels once, 16 bytes a lane, all blocks of a half at once
        (one round trip), and every lane takes the words of its two columns from the lanes
        that hold them."""
        tile_m, tile_n = self.cta_tile_shape_mnk[0], self.cta_tile_shape_mnk[1]
        ident = tiled_mma.get_slice(tidx).partition_C(cute.make_identity_tensor((tile_m, tile_n)))
        blocks = const_expr(cute.size(acc, mode=[0]) // 4)  # (c, h, nb): 8-column blocks
        half = const_expr(blocks // 2 if blocks % 2 == 0 else blocks)  # blocks loaded at once
        expert = tile_coord_mnkl[3]
        ready = params.lottery_bounds[expert + 1] - params.lottery_bounds[expert]
        first = params.serve_bounds[expert]
        clean = params.serve_bounds[expert + 1] - first
        last_row = cute.size(params.serve_rflat, mode=[0]) - 1
        n_e = cute.size(params.serve_inv_alpha_b, mode=[1])
        lane = tidx % 32
        for mm in cutlass.range_constexpr(cute.size(acc, mode=[1])):
            for mn in cutlass.range_constexpr(cute.size(acc, mode=[2])):
                for h in cutlass.range_constexpr(2):
                    m, n0 = ident[(0, h, 0), mm, mn]
                    i = tile_coord_mnkl[0] * tile_m + m - ready
                    live = (i >= 0) & (i < clean)
                    if cute.arch.vote_any_sync(live):  # the same on every lane of the warp
                        row = cutlass.max(cutlass.min(first + i, last_row), 0)
                        token = params.serve_rflat[row]
                        a = cute.make_rmem_tensor((PEEL_HALF,), Float32)
                        cute.autovec_copy(params.serve_a_peel[token, None], a)
                        inv_a = params.serve_inv_alpha[token]
                        col0 = tile_coord_mnkl[1] * tile_n + n0 - 2 * (lane % 4)  # the block's first column
                        words = cute.make_rmem_tensor((blocks,), Int32)
                        for part in cutlass.range_constexpr(blocks // half):
                            held = cute.make_rmem_tensor((4, half), Int32)  # words 4·(l % 4) .. + 3 of column l // 4
                            for j in cutlass.range_constexpr(half):
                                col = cutlass.min(col0 + 8 * (part * half + j) + lane // 4, n_e - 1)
                                cute.autovec_copy(params.serve_b_peel[expert, col, lane % 4, None], held[None, j])
                            for j in cutlass.range_constexpr(half):
                                nb = part * half + j
                                col = cutlass.min(col0 + 8 * nb + 2 * (lane % 4), n_e - 2)
                                low = self._peeled(acc[(0, h, nb), mm, mn], a, held, j, lane, 0) * inv_a
                                high = self._peeled(acc[(1, h, nb), mm, mn], a, held, j, lane, 1) * inv_a
                                low = _bf16_bits(low * params.serve_inv_alpha_b[expert, col])
                                high = _bf16_bits(high * params.serve_inv_alpha_b[expert, col + 1])
                                words[nb] = Int32(low | (high << 16))
                        if live:
                            for nb in cutlass.range_constexpr(blocks):
                                _, n = ident[(0, h, nb), mm, mn]
                                col = tile_coord_mnkl[1] * tile_n + n
                                if col < n_e:
                                    params.serve_out[row, col // 2] = words[nb]

    @cute.jit
    def _peeled(self, value: Float32, a: cute.Tensor, held: cute.Tensor, j: int, lane: Int32, c: int) -> Float32:
        """value + a · B_peel's right half of this lane's column 2·(lane % 4) + c of block j
        (`held`: the warp's 16-byte slices of that block's peels)."""
        source = 4 * (2 * (lane % 4) + c)  # lanes 4q .. 4q + 3 hold column q of the block
        for w in cutlass.range_constexpr(_HALF_WORDS):
            word = Uint32(cute.arch.shuffle_sync(held[w % 4, j], source + w // 4))
            value = value + a[2 * w] * _f32(word << 16)
            value = value + a[2 * w + 1] * _f32(word & Uint32(0xFFFF0000))
        return value


class ServeFoldSm90(MiningParamsMixin, ServeEpilogueMixin, GroupedGemmFp32AccSm90):
    """fp8 grouped GEMM (128-k promotion), the READY rows folded and the clean rows served from
    the epilogue; no D."""


def fake_serve_arguments(m, n, num_experts):
    """`fake_tile_words_arguments` plus the serving tensors (symbolic sizes)."""
    return fake_tile_words_arguments(m, n, num_experts)._replace(
        serve_bounds=make_fake_tensor(Int32, (cute.sym_int(),), leading_dim=0),
        serve_rflat=make_fake_tensor(Int32, (cute.sym_int(),), leading_dim=0),
        serve_a_peel=make_fake_tensor(Float32, (cute.sym_int(), PEEL_HALF), leading_dim=1, divisibility=4),
        serve_inv_alpha=make_fake_tensor(Float32, (cute.sym_int(),), leading_dim=0),
        serve_b_peel=make_fake_tensor(Int32, (num_experts, n, 4, 4), leading_dim=3, divisibility=4),
        serve_inv_alpha_b=make_fake_tensor(Float32, (num_experts, n), leading_dim=1),
        serve_out=make_fake_tensor(Int32, (cute.sym_int(), cute.sym_int()), leading_dim=1))


@functools.lru_cache(maxsize=None)
def compile_serve_gemm(config: GroupedGemmConfig, side_smem: int = 0, dynamic: bool = False) -> Callable:
    """The serving fp8 grouped GEMM for sm_90a (fake tensors); side_smem and dynamic as
    `fold_epilogue.compile_fold_gemm`'s (the lagged pass shares its SMs and takes tiles from a
    counter)."""
    cls = sharing(ServeFoldSm90, side_smem) if side_smem else ServeFoldSm90
    return compile_variant(cls, Precision.FP8, Output.FP32, config, fake_serve_arguments, side_smem,
                           dynamic=dynamic, store_d=False)


def served_grouped_gemm(a: torch.Tensor, b: torch.Tensor, bounds: torch.Tensor, lanes: torch.Tensor,
                        ready_bounds: torch.Tensor, clean_bounds: torch.Tensor, rflat: torch.Tensor,
                        a_peel_right: torch.Tensor, inv_alpha: torch.Tensor, b_peel: torch.Tensor,
                        inv_alpha_b: torch.Tensor, out: torch.Tensor, config: GroupedGemmConfig | None = None,
                        max_sms: int | None = None, side_smem: int = 0,
                        tile_counter: torch.Tensor | None = None) -> torch.Tensor:
    """out (R, n) bf16 = the clean rows' peeled, unscaled output in compact expert order, and
    the READY rows' folded lanes, from one GEMM over a lagged launch's combined operand.

    a (rows, k) e4m3: per expert [READY rows ; clean rows]; b (e, n, k) e4m3; bounds (e+1,) its
    combined row bounds; lanes / ready_bounds: as `fold_epilogue.folded_grouped_gemm`'s lanes /
    lottery_bounds (the READY rows' bounds); clean_bounds (e+1,) and rflat (R,): the clean rows'
    routing (compact row i of expert w is expert-local row ready_w + (i − clean_bounds[w]) of the
    GEMM, and serves token rflat[i]); a_peel_right (m, 32) fp32: each token's A_c′ · F_Bᵀ;
    inv_alpha (m,) fp32: 1/α of each token; b_peel (e·n, 64) bf16: the B peel (its right halves
    are read); inv_alpha_b (e, n) fp32. config, max_sms, side_smem, tile_counter: as
    `folded_grouped_gemm`'s. Nothing is checked on the device (no host sync): the bounds must
    be consistent, as the lagged front writes them."""
    experts, n, k = b.shape
    rows, tokens = rflat.shape[0], inv_alpha.shape[0]
    config = shared_config(checked_config(config, a.shape[0], (experts, n, k), False), side_smem)
    expected = {"out": (out, torch.bfloat16, (rows, n)), "a_peel_right": (a_peel_right, torch.float32, (tokens, PEEL_HALF)),
                "inv_alpha": (inv_alpha, torch.float32, (tokens,)), "b_peel": (b_peel, torch.bfloat16, (experts * n, 64)),
                "inv_alpha_b": (inv_alpha_b, torch.float32, (experts, n)),
                "clean_bounds": (clean_bounds, torch.int32, (experts + 1,)),
                "ready_bounds": (ready_bounds, torch.int32, (experts + 1,)), "rflat": (rflat, torch.int32, (rows,))}
    for name, (t, dtype, shape) in expected.items():
        if t.dtype != dtype or tuple(t.shape) != shape or not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous {dtype} {shape}, got {t.dtype} {tuple(t.shape)}")
    if lanes.dtype != torch.int32 or lanes.dim() != 3 or lanes.shape[1:] != (n // 64, 16):
        raise ValueError(f"lanes must be int32 (tiles, {n // 64}, 16), got {lanes.dtype} {tuple(lanes.shape)}")
    b_half = b_peel.view(torch.int32).view(experts, n, 2 * _HALF_WORDS)[:, :, _HALF_WORDS:].unflatten(2, (4, 4))
    epi = mining_arguments(ready_bounds, lanes, serve_bounds=clean_bounds, serve_rflat=rflat,
                           serve_a_peel=a_peel_right, serve_inv_alpha=inv_alpha, serve_b_peel=b_half,
                           serve_inv_alpha_b=inv_alpha_b, serve_out=out.view(torch.int32))
    launch_variant(compile_serve_gemm(config, side_smem, tile_counter is not None), a, b, bounds, None, config, epi,
                   max_sms=max_sms, tile_counter=tile_counter)
    return out
