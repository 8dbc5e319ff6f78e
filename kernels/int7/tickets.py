"""Tickets of finished tile transcripts (int-protocol.md §5.3): one keyed BLAKE3 compression per
tile under its instance's s_A, the compare with the bound, and the first winner's claim of the
device record. Device functions shared by the Triton mined GEMM (which draws its tiles' tickets in
its own epilogue) and `tile_lottery` (tickets of the transcript words a CuTe GEMM stored).

The record (int32[16], `mined_gemm.RECORD_WORDS`): [0] claim (CAS 0 → 1 by the first winning
program, which then names the lowest winning tile among its own), [1] instance, [2] tile row,
[3] tile column, [4:12] the ticket's words.
"""
from __future__ import annotations

import triton.language as tl

from kernels.triton_jit import jit

from .blake3 import compress

NO_TILE = tl.constexpr(2**31 - 1)  # above every tile index (a global read inside a kernel must be constexpr)
_TICKET_FLAGS = tl.constexpr(27)  # CHUNK_START | CHUNK_END | ROOT | KEYED_HASH: a one-block keyed hash


@jit
def xor_combine(a, b):
    return a ^ b


@jit
def min_combine(a, b):
    return tl.minimum(a, b)


@jit
def pick(values, selected):
    """The value at the single selected position of a 1-D tile vector."""
    return tl.reduce(tl.where(selected, values, tl.full(values.shape, 0, tl.uint32)), 0, xor_combine)


@jit
def draw_and_claim(t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13, t14, t15,
                   key_ptr, bound_ptr, eligible, linear, tiles_n, instance, record_ptr,
                   H: tl.constexpr, BN: tl.constexpr, UNROLL: tl.constexpr):
    """Tickets of a vector of tiles (16 uint32 transcript words each) under the 8 key words at
    key_ptr; tiles that are `eligible` and at or below the bound (8 LE words at bound_ptr, compared
    from the most significant word down) win; the lowest winning `linear` index (tile row ·
    tiles_n + tile column) claims the record if no program has. Returns the tickets' 8 words.
    UNROLL: the compression's rounds unrolled (`blake3.compress_block`)."""
    zero = t0 ^ t0
    c0, c1, c2, c3, c4, c5, c6, c7 = compress(
        zero + tl.load(key_ptr).to(tl.uint32, bitcast=True),
        zero + tl.load(key_ptr + 1).to(tl.uint32, bitcast=True),
        zero + tl.load(key_ptr + 2).to(tl.uint32, bitcast=True),
        zero + tl.load(key_ptr + 3).to(tl.uint32, bitcast=True),
        zero + tl.load(key_ptr + 4).to(tl.uint32, bitcast=True),
        zero + tl.load(key_ptr + 5).to(tl.uint32, bitcast=True),
        zero + tl.load(key_ptr + 6).to(tl.uint32, bitcast=True),
        zero + tl.load(key_ptr + 7).to(tl.uint32, bitcast=True),
        t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13, t14, t15,
        zero, zero + _TICKET_FLAGS, UNROLL)
    ticket = (c0, c1, c2, c3, c4, c5, c6, c7)
    below = zero != zero
    equal = zero == zero
    for i in tl.static_range(8):
        word = ticket[7 - i]
        limit = tl.load(bound_ptr + (7 - i)).to(tl.uint32, bitcast=True)
        below = below | (equal & (word < limit))
        equal = equal & (word == limit)
    wins = (below | equal) & eligible
    best = tl.reduce(tl.where(wins, linear, NO_TILE), 0, min_combine)
    if best < NO_TILE:
        if tl.atomic_cas(record_ptr, 0, 1) == 0:
            selected = linear == best
            tl.store(record_ptr + 1, instance.to(tl.int32))
            tl.store(record_ptr + 2, (best // tiles_n) * H)
            tl.store(record_ptr + 3, (best % tiles_n) * BN)
            for i in tl.static_range(8):
                tl.store(record_ptr + 4 + i, pick(ticket[i], selected).to(tl.int32, bitcast=True))
    return c0, c1, c2, c3, c4, c5, c6, c7


@jit
def store_dump(slot, t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13, t14, t15,
               c0, c1, c2, c3, c4, c5, c6, c7, live):
    """Checks only: a tile's 16 transcript words, then its 8 ticket words, at its 24-word slot."""
    words = (t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13, t14, t15, c0, c1, c2, c3, c4, c5, c6, c7)
    for i in tl.static_range(24):
        tl.store(slot + i, words[i].to(tl.int32, bitcast=True), mask=live)
