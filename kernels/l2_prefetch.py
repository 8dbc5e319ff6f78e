"""Weights into L2 while latency-bound kernels hold the serving stream.

A decode grouped GEMM is memory-bound: it streams the weights once. The kernels in front of it
(a mining pass's front: routing, quantization, operand copies) are latency-bound and leave the
memory system idle for several microseconds. A side-stream launch of this op during them asks
L2 for the bytes the GEMM's first wave of tiles reads first (`cp.async.bulk.prefetch.L2`, a hint:
nothing is written, no result depends on it), so the GEMM starts on L2 hits instead of waiting
for DRAM. On Triton's interpreter (no GPU) it does nothing.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels.triton_jit import INTERPRETING, jit

_ROWS_PER_PROGRAM = 256
_WARPS = 8


class PrefetchError(ValueError):
    """A prefetch region that does not lie inside its tensor, or is not 16-byte aligned."""


def first_wave_rows(experts: int, n: int, ctas: int, tile_n: int) -> int:
    """Rows of b (experts, n, k), flattened expert-major, that a persistent varlen-M grouped GEMM
    of `ctas` CTAs and `tile_n`-column tiles reads in its first wave, assuming (decode) one row
    block an expert: quack's varlen scheduler numbers tiles expert by expert, so the first `ctas`
    tiles lie in the first experts; whole experts, since the tile order inside one is swizzled."""
    if min(experts, n, ctas, tile_n) <= 0:
        raise PrefetchError(f"experts, n, ctas, tile_n must be positive, got {experts, n, ctas, tile_n}")
    return min(experts, math.ceil(ctas * tile_n / n)) * n


def prefetch_rows(b: torch.Tensor, rows: int, row_bytes: int) -> None:
    """Ask L2 for the first `row_bytes` bytes of each of the first `rows` rows of `b` (its last
    dimension contiguous, the others flattened), from the current stream."""
    if b.dim() < 2 or b.stride(-1) != 1:
        raise PrefetchError(f"b needs rows with a contiguous last dimension, got strides {b.stride()}")
    try:
        flat = b.view(-1, b.shape[-1])  # a view: a reshape's copy would prefetch the copy
    except RuntimeError as error:
        raise PrefetchError(f"b's rows are not one stride apart (strides {b.stride()})") from error
    stride = flat.stride(0) * b.element_size()
    length = b.shape[-1] * b.element_size()
    if not 0 < rows <= flat.shape[0] or not 0 < row_bytes <= length:
        raise PrefetchError(f"{rows} rows of {row_bytes} bytes do not lie in {flat.shape[0]} rows of {length}")
    if row_bytes % 16 or stride % 16 or b.data_ptr() % 16:
        raise PrefetchError(f"row bytes {row_bytes}, row stride {stride} and the base must be 16-byte aligned")
    if INTERPRETING or b.device.type != "cuda":
        return
    _prefetch_kernel[(triton.cdiv(rows, _ROWS_PER_PROGRAM),)](
        flat.view(torch.uint8) if b.element_size() == 1 else flat, flat.stride(0), rows, row_bytes,
        BLOCK=_ROWS_PER_PROGRAM, num_warps=_WARPS)


@jit
def _prefetch_kernel(b_ptr, row_stride, rows, row_bytes, BLOCK: tl.constexpr):
    """One bulk L2 prefetch a row (the last program repeats the last row: a hint twice)."""
    row = tl.minimum(tl.program_id(0) * BLOCK + tl.arange(0, BLOCK), rows - 1)
    tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;", "=r,l,r",
                              [b_ptr + row.to(tl.int64) * row_stride, row_bytes + row * 0],
                              dtype=tl.int32, is_pure=False, pack=1)
