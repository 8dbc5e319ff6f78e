"""Int32 word ranges copied by programs of another kernel's launch: MINED's take (two ranges, the
folded lanes and READY's tail) rides the lagged pass's serving peel, or its own take kernel."""
from __future__ import annotations

import triton.language as tl

from kernels.triton_jit import jit

COPY_WORDS = 2048  # words a copy program moves (8 KiB)
_TW = tl.constexpr(COPY_WORDS)


@jit
def _copy_chunk(src_ptr, dst_ptr, chunk, words):
    """Words [chunk·COPY_WORDS, (chunk + 1)·COPY_WORDS) of a `words`-word range."""
    offs = chunk.to(tl.int64) * _TW + tl.arange(0, _TW)
    live = offs < words
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=live), mask=live)


@jit
def copy_two_ranges(chunk, first_src_ptr, first_dst_ptr, first_words, second_src_ptr, second_dst_ptr,
                    second_words):
    """Chunk `chunk` of the first range's COPY_WORDS-word chunks, then of the second's (past both:
    nothing); `chunks` sizes the grid."""
    first_chunks = (first_words + _TW - 1) // _TW
    if chunk < first_chunks:
        _copy_chunk(first_src_ptr, first_dst_ptr, chunk, first_words)
    else:
        _copy_chunk(second_src_ptr, second_dst_ptr, chunk - first_chunks, second_words)


def chunks(words: int) -> int:
    """Copy programs a range of `words` words takes."""
    return -(-words // COPY_WORDS)
