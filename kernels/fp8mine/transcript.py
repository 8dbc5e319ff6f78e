"""The V4 transcript on the device (§3, §5): keys, operand digests, seeds, noise and jackpot keys.

Every value is a (1, 8) int32 tensor of digest words that never leaves the device; the fixed
label subkeys and the pA/pB parameter blocks are host constants. proof.fp8.transcript is the
reference. Plane roots come from int7's keyed 1024-byte-leaf chunk trees (HashId 3, the only leaf
size the official miner commits; other HashIds are rejected here).

Per launch, everything after the plane and routing roots — HA, seedA, the noise-line key and the
jackpot key — is one small kernel (`launch_keys`): the seedA message's job-constant tail
(seedB ‖ keyA ‖ pA) is laid out once per job (`seed_a_message`), and the kernel writes HA (and
HR, HO) into its head before hashing it.
"""
from __future__ import annotations


import numpy as np
import torch
import triton.language as tl

from kernels.stream_counters import stream_counters
from kernels.triton_jit import jit
from kernels.int7.blake3 import (chunk_chaining_value, compress, compress_block, keyed_trees, load_words8,
                                 store_words8)
from proof.fp8.params import HashId
from proof.fp8.transcript import LABEL_PREFIX, subkey

from . import noise
from .hashing import HashError, as_bytes, constant_bytes, constant_words, hash_short
from .noise import noise_codes

_DIGEST_WORDS = 8
_MAX_P_A = 32  # pA is padded to one digest slot of the seedA message
_LINE_LANES = 64  # the launch-keys program's width: noise lines a step (decode: 64 rows, one step)
# The launch-keys program draws E_A itself up to this many lines (two steps); beyond, one program
# walking the lines was the prefill A side's slowest part (8192 rows: 128 steps, ~200 µs on the
# H200 against 3.5 µs for noise.noise_lines' full grid), so E_A gets its own launch there.
_FUSED_LINES = 2 * _LINE_LANES

DEVICE_LEAF = HashId.CHUNK_1024


def _labelled(label: str, message: torch.Tensor) -> torch.Tensor:
    """H_label(message) with an unkeyed label subkey (a host constant)."""
    return hash_short(constant_words(subkey(label), message.device), message)


def _cat_bytes(*parts: torch.Tensor) -> torch.Tensor:
    return torch.cat([as_bytes(p) if p.dtype == torch.int32 else p for p in parts], dim=1)


def key_a(proposed_header: torch.Tensor) -> torch.Tensor:
    """keyA = H_key-A(σ̂) from the 76-byte header as a (1, 76) uint8 tensor."""
    _check_header(proposed_header, 76)
    return _labelled("key-A", proposed_header)


def key_b(ancestor_header: torch.Tensor) -> torch.Tensor:
    """keyB = H_key-B(σ_d) from the 108-byte ancestor header as a (1, 108) uint8 tensor."""
    _check_header(ancestor_header, 108)
    return _labelled("key-B", ancestor_header)


def _check_header(header: torch.Tensor, size: int) -> None:
    if header.dtype != torch.uint8 or tuple(header.shape) != (1, size):
        raise HashError(f"the header must be a (1, {size}) uint8 tensor, got {header.dtype} {tuple(header.shape)}")


def check_hash_id(hash_id: HashId) -> None:
    """The device trees use 1024-byte leaves only."""
    if HashId(hash_id) != DEVICE_LEAF:
        raise HashError(f"device trees use 1024-byte leaves (HashId 3), not {HashId(hash_id).name}")


def tree_root(key: torch.Tensor, data: torch.Tensor) -> torch.Tensor:
    """Keyed chunk-tree root of a tensor's bytes (row-major, zero-padded to 1024-byte leaves)."""
    flat = data.contiguous().view(torch.uint8).view(1, -1)
    return keyed_trees(key, flat).roots


_FOREST_TREES = 4  # codes, scales, Rflat, offsets
# chunks per program (2 warps): GLM-5 prefill's forest 86.3 / 85.8 µs against 91.0 at 128 chunks
# and 108 at 32 (H100, session 21, same run, roots equal); a decode launch's forest is 12 programs
_FOREST_LANES = 64
_FOREST_LEVELS = 6  # log2(_FOREST_LANES)


@jit
def _pick4(index, v0, v1, v2, v3):
    """v[index] for index in 0..3 (scalars or lane tensors; pointers too)."""
    return tl.where(index == 0, v0, tl.where(index == 1, v1, tl.where(index == 2, v2, v3)))


@jit
def _stack8(c0, c1, c2, c3, c4, c5, c6, c7):
    """Eight lane tensors as one (lanes, 2, 2, 2) tile (one gather moves a whole node)."""
    return tl.join(tl.join(tl.join(c0, c1), tl.join(c2, c3)), tl.join(tl.join(c4, c5), tl.join(c6, c7)))


@jit
def _unstack8(t):
    """The eight lane tensors of `_stack8`."""
    lo, hi = tl.split(t)
    a, b = tl.split(lo)
    c, d = tl.split(hi)
    c0, c1 = tl.split(a)
    c2, c3 = tl.split(b)
    c4, c5 = tl.split(c)
    c6, c7 = tl.split(d)
    return c0, c1, c2, c3, c4, c5, c6, c7


@jit
def _fold_lanes(c0, c1, c2, c3, c4, c5, c6, c7, count, whole, k0, k1, k2, k3, k4, k5, k6, k7,
                LEVELS: tl.constexpr):
    """The subtree over the first `count` (≤ 2^LEVELS) lane nodes (an aligned group of one tree's
    level): each level, lane i pairs nodes 2i and 2i+1 (two gathers of whole nodes in registers;
    an odd last node is promoted), no memory round trip or barrier; only the ceil(log2(count))
    levels there are; ROOT on the last compression when the group is the whole tree. The lanes
    keep their width (the upper ones compute copies: same latency). Returns the node in lane 0."""
    lane = tl.arange(0, 1 << LEVELS)
    tile_index = tl.full((1 << LEVELS, 2, 2, 2), 0, tl.int32)
    left = tile_index + tl.minimum(2 * lane, (1 << LEVELS) - 1)[:, None, None, None]
    right = tile_index + tl.minimum(2 * lane + 1, (1 << LEVELS) - 1)[:, None, None, None]
    zero = tl.full(lane.shape, 0, tl.uint32)
    n = count
    while n > 1:
        paired = 2 * lane + 1 < n
        flags = zero + tl.where(whole & (n == 2), 16 | 4 | 8, 16 | 4)  # KEYED_HASH | PARENT (| ROOT)
        nodes = _stack8(c0, c1, c2, c3, c4, c5, c6, c7)
        l0, l1, l2, l3, l4, l5, l6, l7 = _unstack8(tl.gather(nodes, left, 0))
        r0, r1, r2, r3, r4, r5, r6, r7 = _unstack8(tl.gather(nodes, right, 0))
        p0, p1, p2, p3, p4, p5, p6, p7 = compress(
            zero + k0, zero + k1, zero + k2, zero + k3, zero + k4, zero + k5, zero + k6, zero + k7,
            l0, l1, l2, l3, l4, l5, l6, l7, r0, r1, r2, r3, r4, r5, r6, r7, zero, flags)
        c0, c1, c2, c3 = (tl.where(paired, p0, l0), tl.where(paired, p1, l1), tl.where(paired, p2, l2),
                          tl.where(paired, p3, l3))
        c4, c5, c6, c7 = (tl.where(paired, p4, l4), tl.where(paired, p5, l5), tl.where(paired, p6, l6),
                          tl.where(paired, p7, l7))
        n = (n + 1) // 2
    return c0, c1, c2, c3, c4, c5, c6, c7


@jit
def _load_words8_l2(ptr, mask):
    """Eight words at ptr from L2 (.cg): other programs of this launch wrote them."""
    w0 = tl.load(ptr + 0, mask=mask, other=0, cache_modifier=".cg").to(tl.uint32, bitcast=True)
    w1 = tl.load(ptr + 1, mask=mask, other=0, cache_modifier=".cg").to(tl.uint32, bitcast=True)
    w2 = tl.load(ptr + 2, mask=mask, other=0, cache_modifier=".cg").to(tl.uint32, bitcast=True)
    w3 = tl.load(ptr + 3, mask=mask, other=0, cache_modifier=".cg").to(tl.uint32, bitcast=True)
    w4 = tl.load(ptr + 4, mask=mask, other=0, cache_modifier=".cg").to(tl.uint32, bitcast=True)
    w5 = tl.load(ptr + 5, mask=mask, other=0, cache_modifier=".cg").to(tl.uint32, bitcast=True)
    w6 = tl.load(ptr + 6, mask=mask, other=0, cache_modifier=".cg").to(tl.uint32, bitcast=True)
    w7 = tl.load(ptr + 7, mask=mask, other=0, cache_modifier=".cg").to(tl.uint32, bitcast=True)
    return w0, w1, w2, w3, w4, w5, w6, w7


@jit
def _forest_kernel(key_ptr, p0, p1, p2, p3, w0, w1, w2, w3, n0, n1, n2, n3, g1, g2, g3, b1, b2, b3,
                   nodes_ptr, blocks_ptr, roots_ptr, counter_ptr, block_counter_ptr, LANES: tl.constexpr,
                   LEVELS: tl.constexpr):
    """Roots of up to four planes' trees in one launch, as three levels of aligned subtrees.
    Program p hashes an aligned group of LANES chunks of one tree (tree t's groups are programs
    g_t.., g_0 = 0; w_t words, n_t chunks) and folds them to the group's node in registers; a
    one-group tree's node is its root. The last program of each block of LANES groups to finish
    (an acq_rel counter per block, block_counter_ptr[block], reset by it) folds the block's
    group nodes: the root where the tree is one block, else the block's node (tree t's blocks at
    b_t.., b_0 = 0). The last block of a tree to finish (counter_ptr[t]) folds its ≤ LANES block
    nodes to the root. Blocks and trees fold side by side: one program folding every block of
    every tree in turn made the tail of the GLM-5 prefill forest most of its ~108 µs."""
    pid = tl.program_id(0)
    tree = (pid >= g1).to(tl.int32) + (pid >= g2).to(tl.int32) + (pid >= g3).to(tl.int32)
    group = pid - _pick4(tree, 0, g1, g2, g3)
    chunks = _pick4(tree, n0, n1, n2, n3)
    lane = tl.arange(0, LANES)
    every = lane >= 0
    k0, k1, k2, k3, k4, k5, k6, k7 = load_words8(key_ptr + lane * 0, every)
    base = _pick4(tree, p0 + lane * 0, p1 + lane * 0, p2 + lane * 0, p3 + lane * 0)
    chunk = group * LANES + lane
    words = _pick4(tree, w0, w1, w2, w3)
    last_flags = tl.where(chunks == 1, 8, 0)  # ROOT on a one-chunk tree's only chunk
    c0, c1, c2, c3, c4, c5, c6, c7 = chunk_chaining_value(
        base, chunk, words, chunk < chunks, k0, k1, k2, k3, k4, k5, k6, k7, last_flags, LANES, True)
    whole = chunks <= LANES
    k0, k1, k2, k3, k4, k5, k6, k7 = load_words8(key_ptr, pid >= 0)
    live_chunks = tl.minimum(chunks - group * LANES, LANES)
    c0, c1, c2, c3, c4, c5, c6, c7 = _fold_lanes(c0, c1, c2, c3, c4, c5, c6, c7, live_chunks, whole,
                                                 k0, k1, k2, k3, k4, k5, k6, k7, LEVELS)
    out = tl.where(whole, roots_ptr + tree * 8, nodes_ptr + pid.to(tl.int64) * 8) + lane * 0
    store_words8(out, c0, c1, c2, c3, c4, c5, c6, c7, lane == 0)
    if not whole:
        tl.debug_barrier()  # every thread's stores come before the release below
        groups = (chunks + LANES - 1) // LANES
        blocks = (groups + LANES - 1) // LANES
        block = group // LANES
        first_block = _pick4(tree, 0, b1, b2, b3)
        size = tl.minimum(groups - block * LANES, LANES)
        block_counter = block_counter_ptr + first_block + block
        if tl.atomic_add(block_counter, 1, sem="acq_rel") == size - 1:
            first = pid - group + block * LANES  # the block's first group's program
            d0, d1, d2, d3, d4, d5, d6, d7 = _load_words8_l2(nodes_ptr + (first + lane).to(tl.int64) * 8, lane < size)
            one_block = blocks == 1
            d0, d1, d2, d3, d4, d5, d6, d7 = _fold_lanes(d0, d1, d2, d3, d4, d5, d6, d7, size, one_block,
                                                         k0, k1, k2, k3, k4, k5, k6, k7, LEVELS)
            node = tl.where(one_block, roots_ptr + tree * 8, blocks_ptr + (first_block + block).to(tl.int64) * 8)
            store_words8(node + lane * 0, d0, d1, d2, d3, d4, d5, d6, d7, lane == 0)
            tl.store(block_counter, 0)  # ready for the next launch (graph replays reuse the counters)
            if not one_block:
                tl.debug_barrier()  # the block node is stored before the release below
                if tl.atomic_add(counter_ptr + tree, 1, sem="acq_rel") == blocks - 1:
                    e0, e1, e2, e3, e4, e5, e6, e7 = _load_words8_l2(
                        blocks_ptr + (first_block + lane).to(tl.int64) * 8, lane < blocks)
                    e0, e1, e2, e3, e4, e5, e6, e7 = _fold_lanes(e0, e1, e2, e3, e4, e5, e6, e7, blocks, blocks > 0,
                                                                 k0, k1, k2, k3, k4, k5, k6, k7, LEVELS)
                    store_words8(roots_ptr + tree * 8 + lane * 0, e0, e1, e2, e3, e4, e5, e6, e7, lane == 0)
                    tl.store(counter_ptr + tree, 0)


def _forest_roots(key: torch.Tensor, planes: list[torch.Tensor]) -> torch.Tensor:
    """(len(planes), 8) roots of up to four small planes' trees: one launch."""
    device = key.device
    words = [p.contiguous().view(torch.int32).view(-1) for p in planes]
    chunks = [-(-w.numel() // 256) for w in words]
    pad = _FOREST_TREES - len(planes)
    counts = [w.numel() for w in words] + [0] * pad
    chunks += [0] * pad  # empty trees at the end: no programs
    words += [words[0]] * pad
    groups = [-(-c // _FOREST_LANES) for c in chunks]
    starts = np.cumsum([0] + groups).tolist()
    block_starts = np.cumsum([0] + [-(-g // _FOREST_LANES) if g > 1 else 0 for g in groups]).tolist()
    programs, blocks = starts[_FOREST_TREES], block_starts[_FOREST_TREES]
    nodes = torch.empty((programs, 8), dtype=torch.int32, device=device)
    block_nodes = torch.empty((max(blocks, 1), 8), dtype=torch.int32, device=device)
    roots = torch.empty((_FOREST_TREES, 8), dtype=torch.int32, device=device)
    counters = stream_counters(device, _FOREST_TREES + blocks)  # a tree's, then a block's
    _forest_kernel[(programs,)](
        key, *words, *counts, *chunks, *starts[1:4], *block_starts[1:4], nodes, block_nodes, roots,
        counters, counters[_FOREST_TREES:], LANES=_FOREST_LANES, LEVELS=_FOREST_LEVELS,
        num_warps=_FOREST_LANES // 32)
    return roots[:len(planes)]


def plane_roots(key: torch.Tensor, planes: list[torch.Tensor]) -> list[torch.Tensor]:
    """The keyed chunk-tree roots (each (1, 8)) of up to four planes, equal to `tree_root` of each.

    Every plane of up to _FOREST_LANES³ chunks (256 MB; all of a launch's: codes, scales, Rflat,
    offsets, at decode and at prefill) shares one launch instead of int7's chunk kernel and a
    launch per parent level of each plane; larger ones go through int7's trees."""
    if not 1 <= len(planes) <= _FOREST_TREES:
        raise HashError(f"plane_roots takes 1..{_FOREST_TREES} planes, got {len(planes)}")
    if key.dtype != torch.int32 or tuple(key.shape) != (1, 8):
        raise HashError(f"the key must be (1, 8) int32, got {key.dtype} {tuple(key.shape)}")
    for plane in planes:
        if plane.numel() * plane.element_size() % 4 or plane.numel() == 0:
            raise HashError(f"a plane must hold a positive multiple of 4 bytes, got {tuple(plane.shape)} {plane.dtype}")
    small = [i for i, p in enumerate(planes) if p.numel() * p.element_size() <= _FOREST_LANES ** 3 * 1024]
    roots: list[torch.Tensor | None] = [None] * len(planes)
    if small:
        forest = _forest_roots(key.contiguous(), [planes[i] for i in small])
        for row, i in enumerate(small):
            roots[i] = forest[row:row + 1]
    return [r if r is not None else tree_root(key, planes[i]) for i, r in enumerate(roots)]


def operand_digest(key: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """HX = BLAKE3(root(codes) ‖ root(scales); key = keyX): one keyed single-block compression."""
    return hash_short(key, _cat_bytes(tree_root(key, codes), tree_root(key, scales)))


def seed_b(hash_b: torch.Tensor, key_b_: torch.Tensor, p_b: bytes) -> torch.Tensor:
    """seedB = H_seed-B(HB ‖ keyB ‖ pB)."""
    return _labelled("seed-B", _cat_bytes(hash_b, key_b_, constant_bytes(p_b, hash_b.device)))


def _label_block(label: str) -> bytes:
    """The full label (prefix ‖ label) zero-padded to one 64-byte block."""
    text = LABEL_PREFIX + label.encode("ascii")
    return text + bytes(64 - len(text))


def noise_key(seed: torch.Tensor) -> torch.Tensor:
    """Subkey("noise-line", seed) = BLAKE3(full label; key = seed): a side's noise-line XOF key."""
    return hash_short(seed, constant_bytes(LABEL_PREFIX + b"noise-line", seed.device))


def seed_a_message(seed_b_: torch.Tensor, key_a_: torch.Tensor, p_a: bytes, routed: bool) -> torch.Tensor:
    """The seedA message HA [‖ HR ‖ HO] ‖ seedB ‖ keyA ‖ pA as (1, words) int32, with the head
    (HA, HR, HO) zero: `launch_keys` fills it per launch. Made once per job (set_job)."""
    if len(p_a) > _MAX_P_A:
        raise HashError(f"pA is at most {_MAX_P_A} bytes, got {len(p_a)}")
    head = torch.zeros((1, (3 if routed else 1) * _DIGEST_WORDS), dtype=torch.int32, device=seed_b_.device)
    p_a_words = np.frombuffer(bytes(p_a) + bytes(_MAX_P_A - len(p_a)), dtype="<i4").tobytes()
    tail = constant_bytes(p_a_words, seed_b_.device).view(torch.int32)
    return torch.cat([head, seed_b_, key_a_, tail], dim=1)


def seed_a_message_words(routed: bool) -> int:
    """Length in words of a seedA message buffer: HA [, HR, HO], seedB, keyA, the padded pA."""
    return (5 if routed else 3) * _DIGEST_WORDS + _MAX_P_A // 4


def _key_a_offset(message: torch.Tensor) -> int:
    return message.shape[1] - _DIGEST_WORDS - _MAX_P_A // 4


def key_a_of(message: torch.Tensor) -> torch.Tensor:
    """keyA inside a seedA message (a (1, 8) view)."""
    start = _key_a_offset(message)
    return message[:, start:start + _DIGEST_WORDS]


@jit
def _load_words16(ptr, mask):
    """Sixteen consecutive words (one message block) as uint32 lane tensors."""
    m0, m1, m2, m3, m4, m5, m6, m7 = load_words8(ptr, mask)
    m8, m9, m10, m11, m12, m13, m14, m15 = load_words8(ptr + 8, mask)
    return m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15


@jit
def _launch_keys_kernel(roots_codes_ptr, roots_scales_ptr, hr_ptr, ho_ptr, msg_ptr, key_a_offset,
                        seed_key_ptr, labels_ptr, label_len0, label_len1, seed_bytes,
                        out_ptr, lines_ptr, lines, address, target, ROUTED: tl.constexpr, LANES: tl.constexpr):
    """HA, seedA, Subkey("noise-line", seedA), Subkey("jackpot", seedA) into out (4, 8), then
    the first `lines` noise lines (e4m3, 32 bytes each) under the noise-line key into lines_ptr.

    Every input word is loaded up front (one round of independent loads); all lanes compute the
    same chain in registers — HA, the seedA blocks (HA from registers, the job's tail from the
    message: 3 blocks routed, 2 dense), both label subkeys (independent, interleaved) — so no
    value goes through memory and back; lane 0 stores; the lines use the key in registers."""
    lane = tl.arange(0, LANES)
    every = lane >= 0
    first = lane == 0
    at = lane * 0
    k0, k1, k2, k3, k4, k5, k6, k7 = load_words8(msg_ptr + key_a_offset + at, every)
    m0, m1, m2, m3, m4, m5, m6, m7 = load_words8(roots_codes_ptr + at, every)
    m8, m9, m10, m11, m12, m13, m14, m15 = load_words8(roots_scales_ptr + at, every)
    s0, s1, s2, s3, s4, s5, s6, s7 = load_words8(seed_key_ptr + at, every)
    tail = msg_ptr + (24 if ROUTED else 8) + at  # seedB ‖ keyA ‖ pA
    t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13, t14, t15 = _load_words16(tail, every)
    u0, u1, u2, u3, u4, u5, u6, u7 = load_words8(tail + 16, every)  # pA, the message's last words
    a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15 = _load_words16(labels_ptr + at, every)
    b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15 = _load_words16(labels_ptr + 16 + at, every)
    if ROUTED:
        r0, r1, r2, r3, r4, r5, r6, r7 = load_words8(hr_ptr + at, every)
        o0, o1, o2, o3, o4, o5, o6, o7 = load_words8(ho_ptr + at, every)
    h0, h1, h2, h3, h4, h5, h6, h7 = compress_block(
        k0, k1, k2, k3, k4, k5, k6, k7,
        m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15, 0, 64, 27)
    store_words8(msg_ptr + at, h0, h1, h2, h3, h4, h5, h6, h7, first)
    store_words8(out_ptr + at, h0, h1, h2, h3, h4, h5, h6, h7, first)
    last_len = seed_bytes - (128 if ROUTED else 64)
    if ROUTED:  # HA ‖ HR | HO ‖ seedB | keyA ‖ pA
        store_words8(msg_ptr + 8 + at, r0, r1, r2, r3, r4, r5, r6, r7, first)
        store_words8(msg_ptr + 16 + at, o0, o1, o2, o3, o4, o5, o6, o7, first)
        s0, s1, s2, s3, s4, s5, s6, s7 = compress_block(
            s0, s1, s2, s3, s4, s5, s6, s7,
            h0, h1, h2, h3, h4, h5, h6, h7, r0, r1, r2, r3, r4, r5, r6, r7, 0, 64, 17)
        s0, s1, s2, s3, s4, s5, s6, s7 = compress_block(
            s0, s1, s2, s3, s4, s5, s6, s7,
            o0, o1, o2, o3, o4, o5, o6, o7, t0, t1, t2, t3, t4, t5, t6, t7, 0, 64, 16)
    else:  # HA ‖ seedB | keyA ‖ pA
        s0, s1, s2, s3, s4, s5, s6, s7 = compress_block(
            s0, s1, s2, s3, s4, s5, s6, s7,
            h0, h1, h2, h3, h4, h5, h6, h7, t0, t1, t2, t3, t4, t5, t6, t7, 0, 64, 17)
    s0, s1, s2, s3, s4, s5, s6, s7 = compress_block(  # keyA ‖ pA, the last block
        s0, s1, s2, s3, s4, s5, s6, s7,
        t8, t9, t10, t11, t12, t13, t14, t15, u0, u1, u2, u3, u4, u5, u6, u7, 0, last_len, 16 | 10)
    store_words8(out_ptr + 8 + at, s0, s1, s2, s3, s4, s5, s6, s7, first)
    n0, n1, n2, n3, n4, n5, n6, n7 = compress_block(  # the noise-line label
        s0, s1, s2, s3, s4, s5, s6, s7,
        a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, 0, label_len0, 27)
    j0, j1, j2, j3, j4, j5, j6, j7 = compress_block(  # the jackpot label
        s0, s1, s2, s3, s4, s5, s6, s7,
        b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15, 0, label_len1, 27)
    store_words8(out_ptr + 16 + at, n0, n1, n2, n3, n4, n5, n6, n7, first)
    store_words8(out_ptr + 24 + at, j0, j1, j2, j3, j4, j5, j6, j7, first)
    for start in range(0, lines, LANES):
        line = (start + lane).to(tl.int64)
        code = noise_codes(n0, n1, n2, n3, n4, n5, n6, n7, line, address, target, LANES)
        tl.store(lines_ptr + line[:, None] * 32 + tl.arange(0, 32)[None, :], code.to(tl.uint8),
                 mask=(line < lines)[:, None])


def launch_keys(message: torch.Tensor, p_a_len: int, roots: tuple[torch.Tensor, torch.Tensor],
                routing: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """(4, 8) int32 rows HA, seedA, noise-line key, jackpot key from the plane roots (codes,
    scales), the routing roots (HR, HO) or None (dense), and the job's `seed_a_message` (pA of
    `p_a_len` bytes), whose head this writes. One launch, no host sync."""
    return launch_keys_and_noise(message, p_a_len, roots, routing, 0)[0]


def launch_keys_and_noise(message: torch.Tensor, p_a_len: int, roots: tuple[torch.Tensor, torch.Tensor],
                          routing: tuple[torch.Tensor, torch.Tensor] | None,
                          lines: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`launch_keys` and E_A = noise.noise_lines(keys[2:3], "A", "E", lines) in the same launch
    (the noise-line key never leaves the program) up to _FUSED_LINES lines, E_A in a launch of its
    own beyond: (keys (4, 8) int32, E_A (lines, 32) e4m3)."""
    routed = routing is not None
    words = seed_a_message_words(routed)
    if message.dtype != torch.int32 or tuple(message.shape) != (1, words):
        raise HashError(f"the seedA message must be (1, {words}) int32 for routed={routed}, "
                        f"got {message.dtype} {tuple(message.shape)}")
    device = message.device
    labels = constant_bytes(_label_block("noise-line") + _label_block("jackpot"), device).view(torch.int32)
    if not 0 <= p_a_len <= _MAX_P_A:
        raise HashError(f"pA is at most {_MAX_P_A} bytes, got {p_a_len}")
    seed_bytes = (message.shape[1] - _MAX_P_A // 4) * 4 + p_a_len
    out = torch.empty((4, _DIGEST_WORDS), dtype=torch.int32, device=device)
    fused = lines if lines <= _FUSED_LINES else 0
    e_lines = torch.empty((fused, 32), dtype=torch.uint8, device=device)
    hr, ho = routing if routed else roots
    _launch_keys_kernel[(1,)](
        roots[0].contiguous(), roots[1].contiguous(), hr.contiguous(), ho.contiguous(), message,
        _key_a_offset(message),
        constant_words(subkey("seed-A"), device), labels,
        len(LABEL_PREFIX) + len("noise-line"), len(LABEL_PREFIX) + len("jackpot"),
        seed_bytes, out, e_lines, fused, noise.address("A", "E"), noise.TARGET,
        ROUTED=routed, LANES=_LINE_LANES, num_warps=_LINE_LANES // 32, enable_fp_fusion=False)
    if fused < lines:
        return out, noise.noise_lines(out[2:3], "A", "E", lines)
    return out, e_lines.view(torch.float8_e4m3fn)
