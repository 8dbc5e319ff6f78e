"""Keyed BLAKE3 on the device: the compression function as a Triton device function, and vectorised
chunk trees (one lane per chunk, parents level by level) batched over instances.

Why Triton and not torch ops: a compression is ~800 dependent 32-bit operations; as torch ops that
is ~800 kernel launches per block over every chunk, far too slow for per-launch hashing of
activations. One lane per chunk keeps all 16 blocks of a chunk in registers.

Words are int32 tensors on the torch side (two's complement bits of the u32 words, little-endian
byte order inside a word) and are bit-cast to uint32 inside the kernels. `KeyedTrees` keeps every
non-root level (leaf chaining values first) so openings need only a gather of siblings; the roots
equal `proof.blake3tree.keyed_tree_root(key, data, 1024)` = the standard BLAKE3 keyed hash.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from kernels.triton_jit import jit

CHUNK_START = 1
CHUNK_END = 2
PARENT = 4
ROOT = 8
KEYED_HASH = 16
IV = (0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A, 0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19)
_LANES = 128  # chunks per program: one per thread of 4 warps
_SPREAD_CHUNKS = 132 * 128  # below this many chunks (H200: 132 SMs) the chunk kernel uses 1-warp programs
# Levels of at most this many nodes are built, with all levels above them, in one program an
# instance (one launch instead of one a level: per-launch hashing of decode activations is
# latency-bound, and a prefill tree's narrow top levels were a dozen tiny launches); wider levels
# go one launch a level across the whole GPU.
_ONE_PROGRAM_CHUNKS = 2048


class Blake3Error(ValueError):
    """Bad input to the device BLAKE3 functions."""


@jit
def _rotr(x, n: tl.constexpr):
    return (x >> n) | (x << (32 - n))


@jit
def _g(a, b, c, d, x, y):
    a = a + b + x
    d = _rotr(d ^ a, 16)
    c = c + d
    b = _rotr(b ^ c, 12)
    a = a + b + y
    d = _rotr(d ^ a, 8)
    c = c + d
    b = _rotr(b ^ c, 7)
    return a, b, c, d


@jit
def _round(v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15,
           m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15):
    v0, v4, v8, v12 = _g(v0, v4, v8, v12, m0, m1)
    v1, v5, v9, v13 = _g(v1, v5, v9, v13, m2, m3)
    v2, v6, v10, v14 = _g(v2, v6, v10, v14, m4, m5)
    v3, v7, v11, v15 = _g(v3, v7, v11, v15, m6, m7)
    v0, v5, v10, v15 = _g(v0, v5, v10, v15, m8, m9)
    v1, v6, v11, v12 = _g(v1, v6, v11, v12, m10, m11)
    v2, v7, v8, v13 = _g(v2, v7, v8, v13, m12, m13)
    v3, v4, v9, v14 = _g(v3, v4, v9, v14, m14, m15)
    return v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15


@jit
def compress(k0, k1, k2, k3, k4, k5, k6, k7,
             m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15,
             counter, flags, UNROLL: tl.constexpr = False):
    """One BLAKE3 compression of a full 64-byte block: the 8-word chaining value (UNROLL: as
    `compress_block`)."""
    return compress_block(k0, k1, k2, k3, k4, k5, k6, k7,
                          m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15,
                          counter, 64, flags, UNROLL)


@jit
def compress_block(k0, k1, k2, k3, k4, k5, k6, k7,
                   m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15,
                   counter, block_len, flags, UNROLL: tl.constexpr = False):
    """One BLAKE3 compression of a block of `block_len` bytes (zero-padded words): the 8-word CV.

    All inputs are uint32 tensors of one shape (a lane per independent compression); the counter's
    high word is zero (fewer than 2^32 chunks per instance). The 7 rounds are a runtime loop, whose
    message permutation costs ~30 register moves a round (129 instructions a round on sm_90), or,
    UNROLL, unrolled: the permutation is renaming (~99 a round), for the hot call sites only —
    each unrolled site costs compile time (the plane forest's fold sites: 8 s → 127 s).
    """
    v0, v1, v2, v3, v4, v5, v6, v7 = k0, k1, k2, k3, k4, k5, k6, k7
    v8 = tl.full(m0.shape, 0x6A09E667, tl.uint32)
    v9 = tl.full(m0.shape, 0xBB67AE85, tl.uint32)
    v10 = tl.full(m0.shape, 0x3C6EF372, tl.uint32)
    v11 = tl.full(m0.shape, 0xA54FF53A, tl.uint32)
    v12 = tl.full(m0.shape, 0, tl.uint32) + counter
    v13 = tl.full(m0.shape, 0, tl.uint32)
    v14 = tl.full(m0.shape, 0, tl.uint32) + block_len
    v15 = tl.full(m0.shape, 0, tl.uint32) + flags
    # Unrolled: seven static copies of a one-step loop (which folds away); rolled: one copy of a
    # seven-step runtime loop.
    for _ in tl.static_range(7 if UNROLL else 1):
        for _ in range(1 if UNROLL else 7):
            v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15, \
                m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15 = _round_and_permute(
                    v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15,
                    m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15)
    return v0 ^ v8, v1 ^ v9, v2 ^ v10, v3 ^ v11, v4 ^ v12, v5 ^ v13, v6 ^ v14, v7 ^ v15


@jit
def _round_and_permute(v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15,
                       m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15):
    """One round, then BLAKE3's message permutation (2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9,
    14, 15, 8) for the next."""
    v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15 = _round(
        v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15,
        m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15)
    return (v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15,
            m2, m6, m3, m10, m7, m0, m4, m13, m1, m11, m12, m5, m9, m14, m15, m8)


@jit
def load_words8(ptr, mask):
    """Eight consecutive int32 words at ptr (a pointer tensor), as uint32 tensors."""
    w0 = tl.load(ptr + 0, mask=mask, other=0).to(tl.uint32, bitcast=True)
    w1 = tl.load(ptr + 1, mask=mask, other=0).to(tl.uint32, bitcast=True)
    w2 = tl.load(ptr + 2, mask=mask, other=0).to(tl.uint32, bitcast=True)
    w3 = tl.load(ptr + 3, mask=mask, other=0).to(tl.uint32, bitcast=True)
    w4 = tl.load(ptr + 4, mask=mask, other=0).to(tl.uint32, bitcast=True)
    w5 = tl.load(ptr + 5, mask=mask, other=0).to(tl.uint32, bitcast=True)
    w6 = tl.load(ptr + 6, mask=mask, other=0).to(tl.uint32, bitcast=True)
    w7 = tl.load(ptr + 7, mask=mask, other=0).to(tl.uint32, bitcast=True)
    return w0, w1, w2, w3, w4, w5, w6, w7


@jit
def store_words8(ptr, w0, w1, w2, w3, w4, w5, w6, w7, mask):
    """Store eight uint32 tensors as consecutive int32 words at ptr."""
    tl.store(ptr + 0, w0.to(tl.int32, bitcast=True), mask=mask)
    tl.store(ptr + 1, w1.to(tl.int32, bitcast=True), mask=mask)
    tl.store(ptr + 2, w2.to(tl.int32, bitcast=True), mask=mask)
    tl.store(ptr + 3, w3.to(tl.int32, bitcast=True), mask=mask)
    tl.store(ptr + 4, w4.to(tl.int32, bitcast=True), mask=mask)
    tl.store(ptr + 5, w5.to(tl.int32, bitcast=True), mask=mask)
    tl.store(ptr + 6, w6.to(tl.int32, bitcast=True), mask=mask)
    tl.store(ptr + 7, w7.to(tl.int32, bitcast=True), mask=mask)


@jit
def _halves(t, LANES: tl.constexpr, N: tl.constexpr):
    """The even and odd columns of a (LANES, N) tile."""
    return tl.split(tl.reshape(t, (LANES, N // 2, 2)))


@jit
def block_tile(base, first, limit, live, LANES: tl.constexpr):
    """Words first..first+15 of every lane's run at base (per-lane pointers and word offsets) as
    one (LANES, 16) tile: a warp's load covers whole 64-byte runs of several lanes (a few cache
    lines a request, not one line per lane and word); words at or past `limit` read as zero."""
    index = first[:, None] + tl.arange(0, 16)[None, :]
    return tl.load(base[:, None] + index, mask=live[:, None] & (index < limit),
                   other=0).to(tl.uint32, bitcast=True)


@jit
def tile_words(tile, LANES: tl.constexpr):
    """The 16 columns of a (LANES, 16) tile as lane tensors m0..m15 (one layout change through
    shared memory per block; each lane then holds its whole block in registers)."""
    e, o = _halves(tile, LANES, 16)  # words 2j, 2j+1
    e0, e1 = _halves(e, LANES, 8)  # 4j, 4j+2
    o0, o1 = _halves(o, LANES, 8)  # 4j+1, 4j+3
    a0, a1 = _halves(e0, LANES, 4)  # 8j, 8j+4
    b0, b1 = _halves(e1, LANES, 4)  # 8j+2, 8j+6
    c0, c1 = _halves(o0, LANES, 4)  # 8j+1, 8j+5
    d0, d1 = _halves(o1, LANES, 4)  # 8j+3, 8j+7
    m0, m8 = tl.split(a0)
    m4, m12 = tl.split(a1)
    m2, m10 = tl.split(b0)
    m6, m14 = tl.split(b1)
    m1, m9 = tl.split(c0)
    m5, m13 = tl.split(c1)
    m3, m11 = tl.split(d0)
    m7, m15 = tl.split(d1)
    return m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15


@jit
def chunk_chaining_value(base, chunk, words_per_instance, live,
                         k0, k1, k2, k3, k4, k5, k6, k7, last_flags, LANES: tl.constexpr,
                         UNROLL: tl.constexpr):
    """Keyed chaining value of chunk `chunk` (a lane tensor of LANES) of the words at base (one
    pointer, or one per lane); words at or past `words_per_instance` read as zero. Shared by the
    chunk kernel and the fused decode A side.

    Each 64-byte block of all lanes' chunks is one coalesced (LANES, 16) tile load, issued one
    block ahead so its latency overlaps the current compression: lane-strided scalar loads (16 a
    block, each warp request touching 32 cache lines 1 KB apart) took 512 L1 wavefronts per warp
    per block, 16× the tile's (kernels/fp8mine's transcript forest measured the same pattern).
    UNROLL: the compression's rounds unrolled (`compress_block`), for the launches that hash whole
    prefill planes."""
    c0, c1, c2, c3, c4, c5, c6, c7 = k0, k1, k2, k3, k4, k5, k6, k7
    counter = chunk.to(tl.uint32)
    w = chunk.to(tl.int64) * 256
    lanes = base + w * 0  # one pointer per lane
    ahead = block_tile(lanes, w, words_per_instance, live, LANES)
    for block in range(16):
        tile = ahead
        w += 16
        ahead = block_tile(lanes, w, words_per_instance, live & (block < 15), LANES)
        m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15 = tile_words(tile, LANES)
        start = tl.where(block == 0, 1, 0)  # CHUNK_START
        end = tl.where(block == 15, 2 | last_flags, 0)  # CHUNK_END (| ROOT for a one-chunk tree)
        flags = tl.full(counter.shape, 16, tl.uint32) | (start | end)
        c0, c1, c2, c3, c4, c5, c6, c7 = compress(
            c0, c1, c2, c3, c4, c5, c6, c7,
            m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15, counter, flags, UNROLL)
    return c0, c1, c2, c3, c4, c5, c6, c7


@jit
def _chunk_kernel(data_ptr, key_ptr, key_stride, out_ptr, words_per_instance, chunks_per_instance,
                  total_chunks, last_flags, LANES: tl.constexpr):
    """Keyed chaining value of every 1024-byte chunk of every instance (a lane per chunk)."""
    lane = tl.program_id(0) * LANES + tl.arange(0, LANES)
    live = lane < total_chunks
    inst = (lane // chunks_per_instance).to(tl.int64)
    k0, k1, k2, k3, k4, k5, k6, k7 = load_words8(key_ptr + inst * key_stride, live)
    c0, c1, c2, c3, c4, c5, c6, c7 = chunk_chaining_value(
        data_ptr + inst * words_per_instance, lane % chunks_per_instance, words_per_instance, live,
        k0, k1, k2, k3, k4, k5, k6, k7, last_flags, LANES, True)
    store_words8(out_ptr + lane.to(tl.int64) * 8, c0, c1, c2, c3, c4, c5, c6, c7, live)


@jit
def _parents(src, dst, p, count, live, k0, k1, k2, k3, k4, k5, k6, k7, flags):
    """Parents p of a level of `count` nodes at src into dst: keyed PARENT compressions of pairs,
    an odd last node promoted unchanged."""
    paired = live & (2 * p + 1 < count)
    left = src + 2 * p * 8
    l0, l1, l2, l3, l4, l5, l6, l7 = load_words8(left, live)
    r0, r1, r2, r3, r4, r5, r6, r7 = load_words8(left + 8, paired)
    zero = tl.full(l0.shape, 0, tl.uint32)
    c0, c1, c2, c3, c4, c5, c6, c7 = compress(
        k0, k1, k2, k3, k4, k5, k6, k7,
        l0, l1, l2, l3, l4, l5, l6, l7, r0, r1, r2, r3, r4, r5, r6, r7, zero, zero + flags)
    store_words8(dst + p * 8, tl.where(paired, c0, l0), tl.where(paired, c1, l1),
                 tl.where(paired, c2, l2), tl.where(paired, c3, l3), tl.where(paired, c4, l4),
                 tl.where(paired, c5, l5), tl.where(paired, c6, l6), tl.where(paired, c7, l7), live)


@jit
def _parent_kernel(level_ptr, key_ptr, key_stride, out_ptr, count, parents, total, flags,
                   LANES: tl.constexpr):
    """One tree level up for every instance (large trees: one launch per level)."""
    lane = tl.program_id(0) * LANES + tl.arange(0, LANES)
    live = lane < total
    inst = (lane // parents).to(tl.int64)
    p = (lane % parents).to(tl.int64)
    k0, k1, k2, k3, k4, k5, k6, k7 = load_words8(key_ptr + inst * key_stride, live)
    _parents(level_ptr + inst * count * 8, out_ptr + inst * parents * 8, p, count, live,
             k0, k1, k2, k3, k4, k5, k6, k7, flags)


@jit
def upper_levels(src, dst, chunks, lane, k0, k1, k2, k3, k4, k5, k6, k7, LANES: tl.constexpr):
    """Every parent level of one tree over the `chunks` leaf CVs at src, level after level into
    dst (consecutive levels, the root last), a CTA barrier between levels; ROOT on the top
    compression. `lane` is tl.arange(0, LANES) (int64). Shared by the one-program tree kernel and
    the fused decode A side; the caller puts a barrier between writing the leaves and this."""
    count = chunks
    while count > 1:
        parents = (count + 1) // 2
        flags = tl.where(count == 2, 16 | 4 | 8, 16 | 4)  # KEYED_HASH | PARENT (| ROOT at the top)
        for p0 in range(0, parents, LANES):
            p = p0 + lane
            _parents(src, dst, p, count, p < parents, k0, k1, k2, k3, k4, k5, k6, k7, flags)
        tl.debug_barrier()
        src = dst
        dst = dst + parents * 8
        count = parents


@jit
def _upper_levels_kernel(level_ptr, key_ptr, key_stride, flat_ptr, chunks, flat_nodes,
                         LANES: tl.constexpr):
    """Every parent level of one instance in one program (small trees) into flat
    (instances, flat_nodes, 8)."""
    inst = tl.program_id(0).to(tl.int64)
    lane = tl.arange(0, LANES).to(tl.int64)
    every = lane >= 0
    k0, k1, k2, k3, k4, k5, k6, k7 = load_words8(key_ptr + inst * key_stride + lane * 0, every)
    upper_levels(level_ptr + inst * chunks * 8, flat_ptr + inst * flat_nodes * 8, chunks, lane,
                 k0, k1, k2, k3, k4, k5, k6, k7, LANES)


def words_from_bytes(data: bytes, device: torch.device | str = "cpu") -> torch.Tensor:
    """Little-endian u32 words of `data` (length a multiple of 4) as an int32 tensor."""
    if len(data) % 4:
        raise Blake3Error(f"byte string length {len(data)} is not a multiple of 4")
    return torch.from_numpy(np.frombuffer(bytes(data), dtype="<i4").copy()).to(device)


def bytes_from_words(words: torch.Tensor) -> bytes:
    """The little-endian bytes of an int32 word tensor (copied to the host)."""
    return words.detach().to("cpu").contiguous().numpy().astype("<i4").tobytes()


def _check_keys(keys: torch.Tensor, instances: int) -> None:
    if keys.dtype != torch.int32 or keys.dim() != 2 or keys.shape[1] != 8:
        raise Blake3Error(f"keys must be int32 (instances or 1, 8), got {keys.dtype} {tuple(keys.shape)}")
    if keys.shape[0] not in (1, instances):
        raise Blake3Error(f"keys has {keys.shape[0]} rows for {instances} instances")


def _key_stride(keys: torch.Tensor) -> int:
    return 0 if keys.shape[0] == 1 else 8


def constant_words(data: bytes, device: torch.device | str) -> torch.Tensor:
    """`words_from_bytes` cached per device: constants made once, before any CUDA-graph capture
    (a host-to-device copy of pageable memory cannot be captured)."""
    return _constant_words(bytes(data), torch.device(device))


@functools.lru_cache(maxsize=None)
def _constant_words(data: bytes, device: torch.device) -> torch.Tensor:
    return words_from_bytes(data, device)


@dataclass
class KeyedTrees:
    """Keyed 1024-byte-leaf BLAKE3 trees of a batch of equal-length instances.

    levels[0] holds the leaf chaining values, (instances, leaves, 8); each next level the parents,
    an odd last node promoted. The single top level is not kept: `roots` is (instances, 8).
    """

    levels: list[torch.Tensor]
    roots: torch.Tensor
    num_leaves: int


def level_counts(nbytes: int) -> list[int]:
    """Node counts of the kept levels (leaves first, root excluded) of a tree over nbytes."""
    counts = []
    count = max(1, triton.cdiv(nbytes, 1024))
    while count > 1:
        counts.append(count)
        count = triton.cdiv(count, 2)
    return counts


def keyed_trees(keys: torch.Tensor, data: torch.Tensor) -> KeyedTrees:
    """Trees of data (instances, bytes) int8/uint8 (each row zero-padded to whole 1024-byte leaves).

    keys: (instances or 1, 8) int32. Shapes are static, so this runs without host syncs.
    """
    if data.dim() != 2 or data.dtype not in (torch.int8, torch.uint8):
        raise Blake3Error(f"data must be (instances, bytes) int8/uint8, got {data.dtype} {tuple(data.shape)}")
    instances, nbytes = data.shape
    if nbytes % 4 or nbytes == 0:
        raise Blake3Error(f"bytes per instance must be a positive multiple of 4, got {nbytes}")
    _check_keys(keys, instances)
    keys = keys.contiguous()
    words = data.contiguous().view(torch.int32)
    chunks = triton.cdiv(nbytes, 1024)
    total = instances * chunks
    cvs = torch.empty((instances, chunks, 8), dtype=torch.int32, device=data.device)
    # few chunks (decode): one-warp programs spread the latency-bound lanes over more SMs
    lanes = _LANES if total >= _SPREAD_CHUNKS else 32
    _chunk_kernel[(triton.cdiv(total, lanes),)](words, keys, _key_stride(keys), cvs, nbytes // 4,
                                                 chunks, total, ROOT if chunks == 1 else 0, LANES=lanes)
    return trees_from_leaves(keys, cvs)


def trees_from_leaves(keys: torch.Tensor, cvs: torch.Tensor) -> KeyedTrees:
    """The trees above leaf chaining values cvs (instances, chunks, 8) int32 (a one-chunk tree's
    leaf is its root, so hashed with ROOT); keys as in `keyed_trees`. The chunk kernel and the
    quantiser that hashes its codes as it writes them (`codes_and_leaves`) both end here."""
    instances, chunks, _ = cvs.shape
    _check_keys(keys, instances)
    keys = keys.contiguous()
    if chunks == 1:
        return KeyedTrees([], cvs[:, 0, :], 1)
    levels = [cvs]  # large trees: one launch a level across the GPU while a level is wide
    while levels[-1].shape[1] > _ONE_PROGRAM_CHUNKS:
        count = levels[-1].shape[1]
        parents = triton.cdiv(count, 2)
        out = torch.empty((instances, parents, 8), dtype=torch.int32, device=cvs.device)
        _parent_kernel[(triton.cdiv(instances * parents, _LANES),)](
            levels[-1], keys, _key_stride(keys), out, count, parents, instances * parents,
            KEYED_HASH | PARENT | (ROOT if count == 2 else 0), LANES=_LANES)
        levels.append(out)
    count = levels[-1].shape[1]  # then every level above in one program an instance
    if count == 1:
        return KeyedTrees(levels[:-1], levels[-1][:, 0, :], chunks)
    counts = level_counts(count * 1024)[1:] + [1]
    flat = torch.empty((instances, sum(counts), 8), dtype=torch.int32, device=cvs.device)
    _upper_levels_kernel[(instances,)](levels[-1], keys, _key_stride(keys), flat, count, sum(counts),
                                       LANES=_LANES)
    views = list(torch.split(flat, counts, dim=1))
    return KeyedTrees(levels + views[:-1], views[-1][:, 0, :], chunks)
