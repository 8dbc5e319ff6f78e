"""The mined FP8 GEMM: e4m3 × e4m3 → fp32 with 128-k promotion windows, as the Hopper model (§8).

Two CUDA implementations, chosen once per process (`gemm_impl`, logged):
- "cute": our CuTe DSL grouped GEMM (kernels.grouped_gemm, quack's GemmSm90 with tile_k = 128
  promoted accumulation) writing the raw fp32 accumulator (`out=` fp32, no scales). Used when
  `kernels.grouped_gemm_sm90` imports (cutlass + quack installed). Needs K·1 byte and N·4 bytes
  rows to be multiples of 16 bytes (TMA): K % 16 == 0 (ours: K % 32) and N % 4 == 0.
- "triton": the windowed Triton kernel below, the fallback and a second implementation that the
  GPU check compares against the model.
PEARL_FP8MINE_GEMM=cute|triton forces one. On the CPU the model itself is the GEMM.

In the Triton kernel each 128-k slice is one `tl.dot` into a fresh fp32 window (four K = 32 WGMMAs chained from
+0) and the window is promoted into the fp32 total with one RNE add; the add is written as an FMA
with 1.0 so Triton cannot fold the window into the dot's accumulator (which would chain the whole
k without promotion). That this reproduces proof.fp8.fp8_matmul(device="hopper") bit for bit is a
hypothesis the GPU check tests. On the CPU the model itself is the GEMM, so the pipeline around it
is testable without a GPU.

Grouped form: A rows in expert order (offsets = cumulative ends), B as (e, n_e, k); a static
upper bound of row tiles (routing.row_tiles(partial=True)) keeps the launch free of host syncs.
Dense GEMMs are the one-group case.
"""
from __future__ import annotations

import functools
import importlib
import logging
import os

import numpy as np
import torch
import triton
import triton.language as tl

from kernels.grouped_gemm_config import Regime, regime_for
from kernels.triton_jit import jit
from proof.fp8.mma import fp8_matmul as model_matmul

from .routing import RoutingTable, dense_table, row_tiles

WINDOW_K = 128
GROUP_K = 32
IMPLS = ("cute", "triton")
# Fold the lottery tiles in the CuTe GEMM's epilogue where the config allows (`fold_in_gemm`);
# False keeps the fold in the lottery pass (lottery.py), e.g. to time the two against each other.
FOLD_IN_EPILOGUE = True
# That GEMM stores its accumulator rounded to bf16 (the lanes are folded from the fp32 values
# first, so the lottery is unchanged): only the peel reads it then, and half the bytes are written
# by the GEMM and read by the peel. The output moves by well under its fp8 error (rel. error vs
# the bf16 GEMM at GLM-5 prefill 5.418 % against 5.408 %; H100 prefill pass 4469–4526 vs
# 4709–4768 µs; docs/kernels-fp8mine.md "Sixteenth session").
BF16_FOLDED_ACC = True
# Also peel and unscale in that epilogue (bf16 out, no accumulator written; peel_epilogue.py: the
# peel rows ride the TMA ring as one more k-tile) at prefill-sized launches: GLM-5 FC1 prefill
# pass 3869 vs 4279 µs and 4203 vs 4588 (H100, session 18). Decode-sized launches keep the peel
# pass: the same-launch GLM-5 decode pass was 396 vs 380 µs with it (and the decode default, the
# lagged pass, peels its clean rows apart anyway).
PEEL_IN_EPILOGUE = True
# An MoE launch's peeling GEMM reads A′'s token rows, peel tails included, through Rflat (quack's
# gather_A: cp.async row copies) instead of rows the codes launch wrote into expert order, top_k
# copies each (400 MB at GLM-5 prefill). Bitwise the same output; H100, session 20, same runs:
# prefill pass 3643.7 / 3625.6 vs 3672.9 / 3642.0 µs, ridge 549.4 / 549.7 vs 562.4 / 561.7. Not
# at decode size, where the GEMM does not peel and a gathering fold GEMM was slower (GLM-5 decode
# 372.0 vs 360.0 µs, the same session; the prefill pass of session 11, 4653 vs 4240).
GATHER_IN_GEMM = True
_log = logging.getLogger(__name__)


class MatmulError(ValueError):
    """Bad operands for the windowed FP8 GEMM."""


@jit
def _windowed_kernel(a_ptr, b_ptr, out_ptr, tile_row_ptr, tile_expert_ptr, ends_ptr, n, k,
                     BM: tl.constexpr, BN: tl.constexpr):
    row0 = tl.load(tile_row_ptr + tl.program_id(0))
    if row0 >= 0:
        expert = tl.load(tile_expert_ptr + tl.program_id(0)).to(tl.int64)
        row_end = tl.load(ends_ptr + expert)
        rows = row0 + tl.arange(0, BM)
        cols = tl.program_id(1) * BN + tl.arange(0, BN)
        live_rows = rows < row_end
        live_cols = cols < n
        kk = tl.arange(0, 128)
        a_rows = a_ptr + rows.to(tl.int64)[:, None] * k
        b_rows = b_ptr + (expert * n + cols.to(tl.int64))[:, None] * k
        total = tl.full((BM, BN), 0.0, tl.float32)
        for k0 in range(0, k, 128):
            live_k = (k0 + kk) < k
            a = tl.load(a_rows + k0 + kk[None, :], mask=live_rows[:, None] & live_k[None, :], other=0)
            b = tl.load(b_rows + k0 + kk[None, :], mask=live_cols[:, None] & live_k[None, :], other=0)
            window = tl.dot(a.to(tl.float8e4nv, bitcast=True), tl.trans(b.to(tl.float8e4nv, bitcast=True)))
            total = tl.fma(window, 1.0, total)  # the RNE promotion, kept apart from the dot
        out = out_ptr + rows.to(tl.int64)[:, None] * n + cols[None, :]
        tl.store(out, total, mask=live_rows[:, None] & live_cols[None, :])


def _check(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.dtype != torch.float8_e4m3fn or b.dtype != torch.float8_e4m3fn:
        raise MatmulError(f"operands must be float8_e4m3fn, got {a.dtype} and {b.dtype}")
    if a.dim() != 2 or b.dim() != 3 or a.shape[1] != b.shape[2]:
        raise MatmulError(f"need a (rows, k) and b (e, n, k), got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[1] % GROUP_K or a.shape[1] == 0:
        raise MatmulError(f"k must be a positive multiple of {GROUP_K}, got {a.shape[1]}")
    if a.device != b.device:
        raise MatmulError(f"operands on different devices: {a.device} and {b.device}")


def tile_config(rows: int, experts: int) -> tuple[int, int, int]:
    """(block_m, block_n, num_warps) from static shapes: 64-row tiles for decode-like launches
    (few rows per expert), 128-row tiles with 8 warps once experts average 128 rows or more."""
    return (128, 128, 8) if rows >= 128 * experts else (64, 128, 4)


@functools.lru_cache(maxsize=1)
def gemm_impl() -> str:
    """The CUDA implementation of this process ("cute" or "triton"), decided and logged once."""
    forced = os.environ.get("PEARL_FP8MINE_GEMM", "")
    if forced:
        if forced not in IMPLS:
            raise MatmulError(f"PEARL_FP8MINE_GEMM must be one of {IMPLS}, got {forced!r}")
        choice, why = forced, "forced by PEARL_FP8MINE_GEMM"
    else:
        try:
            importlib.import_module("kernels.grouped_gemm_sm90")  # cutlass + quack present
            choice, why = "cute", "kernels.grouped_gemm_sm90 imports"
        except ImportError as exc:
            choice, why = "triton", f"kernels.grouped_gemm_sm90 does not import ({exc})"
    _log.info("fp8mine GEMM: %s (%s)", choice, why)
    return choice


def fold_in_gemm(rows: int, b: torch.Tensor, impl: str | None = None) -> bool:
    """Whether `grouped_matmul(..., fold_into=)` can fold the lottery tiles of `rows` A rows
    against b in the GEMM's epilogue: CUDA, the CuTe GEMM, and a config the epilogue supports."""
    return fold_fits(rows, tuple(b.shape), b.device, impl)


def fold_fits(rows: int, b_shape: tuple[int, int, int], device: torch.device, impl: str | None = None) -> bool:
    """`fold_in_gemm` from b's shape and device alone (a pass deciding before its B side exists)."""
    if not FOLD_IN_EPILOGUE or device.type != "cuda" or (impl or gemm_impl()) != "cute":
        return False
    from .fold_epilogue import fold_config
    return fold_config(rows, *b_shape) is not None


def peel_in_gemm(rows: int, b: torch.Tensor, impl: str | None = None) -> bool:
    """Whether that epilogue also peels and unscales (PEEL_IN_EPILOGUE on, a launch past decode
    size, and a config the peel epilogue supports: `peel_epilogue.peel_fits`)."""
    if not (PEEL_IN_EPILOGUE and fold_in_gemm(rows, b, impl)) or regime_for(rows, b.shape[0]) is Regime.DECODE:
        return False
    from .fold_epilogue import fold_config
    from .peel_epilogue import peel_fits
    return peel_fits(fold_config(rows, *b.shape), b.shape[1], b.shape[2])


def gather_in_gemm(rows: int, b: torch.Tensor, impl: str | None = None) -> bool:
    """Whether the peeling GEMM (`peel_in_gemm`) also gathers its A rows: GATHER_IN_GEMM on, and
    a config without a cluster along N (quack multicasts no gathered A)."""
    if not (GATHER_IN_GEMM and peel_in_gemm(rows, b, impl)):
        return False
    from .fold_epilogue import fold_config
    return fold_config(rows, *b.shape).cluster_n == 1


def folded_lanes(rows: int, n: int, device: torch.device) -> torch.Tensor:
    """The buffer `grouped_matmul(..., fold_into=)` fills: int32 (rows // 4, n / 64, 16)."""
    return torch.empty((rows // 4, n // 64, 16), dtype=torch.int32, device=device)


def grouped_matmul(a: torch.Tensor, b: torch.Tensor, table: RoutingTable,
                   impl: str | None = None, max_sms: int | None = None, side_smem: int = 0,
                   fold_into: torch.Tensor | None = None, fold_bounds: torch.Tensor | None = None,
                   tile_counter: torch.Tensor | None = None, compact: RoutingTable | None = None,
                   expert_done: torch.Tensor | None = None) -> torch.Tensor:
    """out[rows of w] = a[rows of w] · b[w]ᵀ accumulated as the Hopper model; (rows, n) fp32.

    a: (rows, k) e4m3 in expert order (rows = table.rflat length); b: (e, n, k) e4m3.
    impl: "cute" or "triton" on CUDA (default: `gemm_impl()`); ignored on the CPU (the model).
    max_sms: the CuTe GEMM's persistent grid on at most this many SMs (the rest stay free for
    side-stream work); the Triton grid is not persistent and ignores it. side_smem: the CuTe
    GEMM shares every SM with side-stream kernels, leaving them this much shared memory
    (`grouped_gemm`). fold_into: `folded_lanes(rows, n)`, receiving every whole 4×64 tile's
    folded lanes from the epilogue (only where `fold_in_gemm`) for `LotteryLatch.run_folded`;
    the accumulator is then bf16 where BF16_FOLDED_ACC. fold_bounds: fold only each expert's
    first rows, into their own compact layout (`fold_epilogue.folded_grouped_gemm`'s
    lottery_bounds; fold_into then holds fold_bounds[e] // 4 entries). tile_counter: with
    fold_into, (1,) int32 zeroed before the launch: the folding GEMM's tiles are taken from it
    (`fold_epilogue.folded_grouped_gemm`). compact: with fold_bounds, only the rows after each
    expert's folded ones are stored, bf16, compact by this table's bounds: (its rows, n) (the
    lagged pass's clean rows; `folded_grouped_gemm(compact_bounds=)`). expert_done: with compact,
    (e,) int32 zeroed before the launch: each expert's finished tiles counted for a peel that
    polls them (`folded_grouped_gemm(expert_done=)`).
    """
    _check(a, b)
    experts, n, k = b.shape
    if table.experts != experts or table.rflat.shape[0] != a.shape[0]:
        raise MatmulError(f"routing has {table.experts} experts / {table.rflat.shape[0]} rows, "
                          f"operands {experts} / {a.shape[0]}")
    if tile_counter is not None and fold_into is None:
        raise MatmulError("tile_counter schedules the folding GEMM only (pass fold_into)")
    if expert_done is not None and compact is None:
        raise MatmulError("expert_done counts the compact store's tiles (pass compact)")
    if compact is not None and fold_bounds is None:
        raise MatmulError("a compact store keeps the rows after the folded ones (pass fold_into and fold_bounds)")
    if a.device.type != "cuda":
        if compact is not None:
            raise MatmulError("a compact store needs the folding CuTe GEMM (CUDA)")
        return _model_grouped(a, b, table)
    impl = impl or gemm_impl()
    if impl not in IMPLS:
        raise MatmulError(f"impl must be one of {IMPLS}, got {impl!r}")
    rows = table.rflat.shape[0]
    folded_bf16 = fold_into is not None and (BF16_FOLDED_ACC or compact is not None)
    out = torch.empty((rows if compact is None else compact.rflat.shape[0], n),
                      dtype=torch.bfloat16 if folded_bf16 else torch.float32, device=a.device)
    if fold_into is not None:
        if not fold_in_gemm(rows, b, impl):
            raise MatmulError(f"no fold epilogue for {rows} rows × {tuple(b.shape)} (impl {impl})")
        from .fold_epilogue import folded_grouped_gemm
        from kernels.grouped_gemm import tma_operand
        return folded_grouped_gemm(tma_operand(a), tma_operand(b), table.bounds, out, fold_into,
                                   lottery_bounds=fold_bounds, max_sms=max_sms, side_smem=side_smem,
                                   tile_counter=tile_counter,
                                   compact_bounds=None if compact is None else compact.bounds,
                                   expert_done=expert_done)
    if impl == "cute":
        return _cute_grouped(a, b, table, out, max_sms, side_smem)
    block_m, block_n, warps = tile_config(a.shape[0], experts)
    tiles = row_tiles(table, block_m, partial=True)
    grid = (tiles.row_start.shape[0], triton.cdiv(n, block_n))
    _windowed_kernel[grid](a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8), out,
                           tiles.row_start, tiles.expert, table.offsets, n, k,
                           BM=block_m, BN=block_n, num_warps=warps, num_stages=3)
    return out


def _cute_grouped(a: torch.Tensor, b: torch.Tensor, table: RoutingTable, out: torch.Tensor,
                  max_sms: int | None = None, side_smem: int = 0) -> torch.Tensor:
    """The CuTe DSL grouped GEMM's raw fp32 accumulator (rows in expert order, bounds (e+1,))."""
    from kernels.grouped_gemm import grouped_gemm, tma_operand  # checks the TMA alignment (K % 16, N % 4)
    return grouped_gemm(tma_operand(a), tma_operand(b), table.bounds, out=out, max_sms=max_sms,
                        side_smem=side_smem)


def matmul(a: torch.Tensor, b: torch.Tensor, impl: str | None = None) -> torch.Tensor:
    """Dense a (m, k) · b (n, k)ᵀ with Hopper promotion: the one-group case; (m, n) fp32."""
    if b.dim() != 2:
        raise MatmulError(f"b must be (n, k), got {tuple(b.shape)}")
    return grouped_matmul(a, b.unsqueeze(0), dense_table(a.shape[0], a.device), impl)


def _codes(x: torch.Tensor) -> np.ndarray:
    return x.view(torch.uint8).cpu().numpy()


def _model_grouped(a: torch.Tensor, b: torch.Tensor, table: RoutingTable) -> torch.Tensor:
    """The CPU path: proof.fp8.fp8_matmul per expert (host offsets are free on the CPU)."""
    out = torch.empty((a.shape[0], b.shape[1]), dtype=torch.float32)
    start = 0
    for expert, end in enumerate(table.offsets.tolist()):
        if end > start:
            out[start:end] = torch.from_numpy(model_matmul("hopper", _codes(a[start:end]), _codes(b[expert])))
        start = end
    return out.to(a.device)
