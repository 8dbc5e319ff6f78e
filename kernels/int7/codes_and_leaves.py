"""Prefill A side: int7 codes and the leaf chaining values of their keyed BLAKE3 trees, in one launch.

At GLM-5 FC1 prefill the quantiser (65536 rows × 6144: 805 MB of bf16 read, 403 MB of codes
written, 308 µs on the H200) and the chunk hashing (the 403 MB read back, 311 µs, bound by the
integer ALUs) were two launches on the critical path, since s_A needs the root. Here a program
quantises whole rows (`activations.quantise_row_block`, the quantiser's own code), then, after a
CTA barrier, hashes the 1024-byte chunks of those rows: a lane per chunk, the codes read back from
L2 where they were just written (`blake3.chunk_chaining_value`, the chunk kernel's own code). The
codes never make a second trip from DRAM, and one program's memory phase overlaps another's
hashing on the same SM. `blake3.trees_from_leaves` builds the levels above.

Its codes are the quantiser's except at exact ties: for bf16 and fp16 rows it rounds the exact
product x · fl(1 / scale) (`activations.PRODUCT_CODES`) instead of repairing the reciprocal's
ties to match x / scale. The repair cost the fused launch ~12 % on the H100 (fifteenth session
probe at GLM-5 FC1 prefill: 621 µs without it, 674–693 with it, 705 for the two launches);
ties are 0.06 % of GLM-5's codes, and the protocol takes whatever codes are hashed. fp32 rows
divide, as the quantiser does.

It needs K a multiple of 1024 (a chunk lies in one row: lane l of a program hashes chunk l % (K /
1024) of its row l // (K / 1024)) and rows short enough to quantise in one pass; the pipeline uses
it at prefill sizes (`fits`) behind `pipeline.CODES_AND_LEAVES`.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_jit import jit
from .activations import PRODUCT_CODES, ActivationError, one_pass_blocks, quantise_row_block
from .blake3 import chunk_chaining_value, load_words8, store_words8

CHUNK_BYTES = 1024
LANES = 128  # chunks a program hashes: one a thread of 4 warps (the chunk kernel's prefill width)
MIN_ROWS = 4096  # below this many rows (decode) the fused decode A side or the two launches stay


@jit
def _codes_and_leaves_kernel(x_ptr, q_ptr, q_words_ptr, scale_ptr, key_ptr, key_stride, cv_ptr, rows,
                             rows_per_instance, K, ROWS: tl.constexpr, CHUNKS_PER_ROW: tl.constexpr, BK: tl.constexpr,
                             TAIL: tl.constexpr, RECIPROCAL: tl.constexpr, BF16_BITS: tl.constexpr,
                             LANES: tl.constexpr):
    """Rows [ROWS·program_id, +ROWS): their codes and scales, then their chunks' chaining values
    (q_words_ptr: the codes as int32 words, the chunk hashing's view of q_ptr)."""
    first = tl.program_id(0) * ROWS
    for r in range(ROWS):  # one row in registers at a time
        quantise_row_block(x_ptr, q_ptr, scale_ptr, first + r + tl.arange(0, 1), rows, K, 1, BK, 1, TAIL,
                           RECIPROCAL, BF16_BITS)
    tl.debug_barrier()  # the rows' codes, written by every thread, are read back by chunk below
    lane = tl.arange(0, LANES)
    row = first + lane // CHUNKS_PER_ROW
    live = (lane < ROWS * CHUNKS_PER_ROW) & (row < rows)
    inst = (row // rows_per_instance).to(tl.int64)
    words_per_instance = rows_per_instance * (K // 4)
    chunk = (row % rows_per_instance) * CHUNKS_PER_ROW + lane % CHUNKS_PER_ROW
    k0, k1, k2, k3, k4, k5, k6, k7 = load_words8(key_ptr + inst * key_stride, live)
    c0, c1, c2, c3, c4, c5, c6, c7 = chunk_chaining_value(
        q_words_ptr + inst * words_per_instance, chunk, words_per_instance, live,
        k0, k1, k2, k3, k4, k5, k6, k7, 0, LANES, True)
    at = row.to(tl.int64) * CHUNKS_PER_ROW + lane % CHUNKS_PER_ROW  # = inst · chunks + chunk
    store_words8(cv_ptr + at * 8, c0, c1, c2, c3, c4, c5, c6, c7, live)


def fits(x: torch.Tensor, rows_per_instance: int) -> bool:
    """Whether `codes_and_leaves` takes these rows: floating, prefill-sized, K a multiple of 1024 and
    short enough for one pass, more than one chunk an instance (a one-chunk tree hashes its leaf
    as the root)."""
    k = x.shape[-1] if x.dim() else 0
    rows = x.numel() // k if k else 0
    return (x.is_floating_point() and k > 0 and k % CHUNK_BYTES == 0 and one_pass_blocks(k) is not None
            and rows >= MIN_ROWS and rows_per_instance > 0 and rows % rows_per_instance == 0
            and rows_per_instance * k > CHUNK_BYTES and k // CHUNK_BYTES <= LANES)


def codes_and_leaves(x: torch.Tensor, keys: torch.Tensor, *,
                     rows_per_instance: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, scale, leaves) of floating rows x (..., K): the int7 codes (`activations.quantise_rows`'
    except at exact ties: see the module's docstring) and its row scales, and the leaf chaining
    values (instances, chunks, 8) int32 of the keyed trees `blake3.keyed_trees(keys,
    q.view(instances, -1))` builds, the instance of a row being row // rows_per_instance; keys
    (instances or 1, 8) int32."""
    if not fits(x, rows_per_instance):
        raise ActivationError(f"codes_and_leaves needs floating rows, K a multiple of {CHUNK_BYTES} (one pass), "
                              f"at least {MIN_ROWS} rows in instances of more than one chunk; got {x.dtype} "
                              f"{tuple(x.shape)}, {rows_per_instance} rows an instance")
    k = x.shape[-1]
    rows = x.numel() // k
    instances = rows // rows_per_instance
    if keys.dtype != torch.int32 or keys.dim() != 2 or keys.shape[1] != 8 or keys.shape[0] not in (1, instances):
        raise ActivationError(f"keys must be int32 (1 or {instances}, 8), got {keys.dtype} {tuple(keys.shape)}")
    block_k, tail = one_pass_blocks(k)
    chunks_per_row = k // CHUNK_BYTES
    rows_per_program = LANES // chunks_per_row
    x = x.contiguous()
    q = torch.empty(x.shape, dtype=torch.int8, device=x.device)
    scale = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    leaves = torch.empty((instances, rows_per_instance * chunks_per_row, 8), dtype=torch.int32, device=x.device)
    bf16 = x.dtype == torch.bfloat16
    _codes_and_leaves_kernel[(triton.cdiv(rows, rows_per_program),)](
        x.view(torch.int16) if bf16 else x, q, q.view(torch.int32), scale, keys.contiguous(),
        0 if keys.shape[0] == 1 else 8, leaves, rows, rows_per_instance, k, ROWS=rows_per_program,
        CHUNKS_PER_ROW=chunks_per_row, BK=block_k, TAIL=tail,
        RECIPROCAL=PRODUCT_CODES.value if bf16 or x.dtype == torch.float16 else 0, BF16_BITS=int(bf16),
        LANES=LANES, num_warps=LANES // 32)
    return q, scale, leaves
