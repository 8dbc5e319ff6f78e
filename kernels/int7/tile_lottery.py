"""The INT7 lottery over stored tile transcripts: the tickets, the bound and the first-winner
claim of tiles whose 16 transcript words a GEMM wrote (`transcript_gemm`, the CuTe mined GEMM
that folds the transcript in its main loop and leaves the BLAKE3 work to this pass).

A program takes BT consecutive tiles of one instance in the words' own order (tile row, then
column: neighbouring threads read neighbouring 64-byte word groups), one tile a thread; its tiles'
16 words arrive as 16 loads of one word a tile (as the FP8 lottery measured faster than one
(BT, 16) tile split into lane vectors: 91 against 198 µs at GLM-5 prefill). With BT tile rows of
one column tile a program instead, neighbours read tiles_n · 64 bytes apart: 73.9 µs against
50.1 for GLM-5 prefill's 1.05 M tiles (H200, session 21, every ticket equal); the
tickets, compare and claim are the Triton mined GEMM's own (`tickets.draw_and_claim`), so the
record is the same: [1] instance, [2] tile row, [3] tile column, [4:12] the ticket.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_jit import jit

from .blake3 import load_words8
from .mined_gemm import DUMP_WORDS, RECORD_WORDS, MinedGemmError, check_operand
from .tickets import draw_and_claim, store_dump

TILES_PER_PROGRAM = 64
LANES_PER_WARP = 32  # one tile a thread: a program of BT tiles runs BT / 32 warps (Triton's default
# 4 warps held every lane vector of 64 tiles twice, so every compression ran on two threads)


@jit
def _tile_lottery_kernel(words_ptr, key_ptr, bound_ptr, mvalid_ptr, record_ptr, dump_ptr, tile_rows, tiles_n,
                         H: tl.constexpr, BN: tl.constexpr, BT: tl.constexpr, DUMP: tl.constexpr):
    e = tl.program_id(1).to(tl.int64)
    tile = tl.program_id(0) * BT + tl.arange(0, BT)  # tile row · tiles_n + tile column
    tr = tile // tiles_n
    live = tr < tile_rows
    slot = e * tile_rows * tiles_n + tile
    m0, m1, m2, m3, m4, m5, m6, m7 = load_words8(words_ptr + slot * 16, live)
    m8, m9, m10, m11, m12, m13, m14, m15 = load_words8(words_ptr + slot * 16 + 8, live)
    eligible = live & ((tr + 1) * H <= tl.load(mvalid_ptr + e))
    c0, c1, c2, c3, c4, c5, c6, c7 = draw_and_claim(
        m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15,
        key_ptr + e * 8, bound_ptr, eligible, tile, tiles_n, e, record_ptr, H, BN, True)
    if DUMP:
        store_dump(dump_ptr + slot * 24, m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15,
                   c0, c1, c2, c3, c4, c5, c6, c7, live)


def tile_lottery(words: torch.Tensor, s_a: torch.Tensor, bound_words: torch.Tensor,
                 rows_valid: torch.Tensor, record: torch.Tensor, *, rows: int, tile_h: int, tile_w: int,
                 dump: torch.Tensor | None = None) -> None:
    """Draw the tickets of E instances' tiles from their transcript words.

    words: (E · rows / tile_h, N / tile_w, 16) int32, tile row t of instance e at [e · rows / tile_h
    + t]; s_a (E, 8) int32 ticket keys; bound_words (8,) int32 LE; rows_valid (E,) int32 rows that
    may hold winning tiles; record (16,) int32, [0] = 0 arms it; dump: optional (E, rows / tile_h,
    N / tile_w, 24) int32 of every tile's words and ticket (checks), as `mined_gemm`'s.
    """
    experts = s_a.shape[0]
    if rows % tile_h or tile_h % 2:
        raise MinedGemmError(f"{rows} rows per instance do not hold whole {tile_h}-row tiles")
    tile_rows = rows // tile_h
    tiles_n = words.shape[1] if words.dim() == 3 else 0
    check_operand("words", words, (experts * tile_rows, tiles_n, 16), torch.int32)
    check_operand("s_a", s_a, (experts, 8), torch.int32)
    check_operand("bound_words", bound_words, (8,), torch.int32)
    check_operand("rows_valid", rows_valid, (experts,), torch.int32)
    check_operand("record", record, (RECORD_WORDS,), torch.int32)
    if dump is not None:
        check_operand("dump", dump, (experts, tile_rows, tiles_n, DUMP_WORDS), torch.int32)
    tiles = tile_rows * tiles_n
    bt = min(TILES_PER_PROGRAM, triton.next_power_of_2(max(tiles, 1)))
    grid = (max(1, triton.cdiv(tiles, bt)), experts)
    _tile_lottery_kernel[grid](words, s_a, bound_words, rows_valid, record, words if dump is None else dump,
                               tile_rows, tiles_n, H=tile_h, BN=tile_w, BT=bt, DUMP=int(dump is not None),
                               num_warps=max(1, bt // LANES_PER_WARP))
