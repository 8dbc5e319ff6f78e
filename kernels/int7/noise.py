"""Noise factors and noised operands on the device, bit-exact with proof.int7.noise (§4).

The PRNG block G(index, label, key, slot) is one keyed BLAKE3 compression of (eight i32 slots with
slot `slot` = index + 1) ‖ label; a Triton kernel computes one block per lane, both factors of a
side in one launch (`noise_factors`). The uniform factor
U (rows × rank, [−32, 31]) takes byte f of the flat row-major stream from block f // 32; the sparse
±1 factor P (k × rank) is stored as two index vectors (first, second) (and, for the job's P_B, also
dense for the A·P_B kernel). Applying them is a second kernel, the same rule for A (rows = tokens)
and for Bᵀ (rows = output columns): X' = X + U·Pᵀ, i.e. X + U[:, first] − U[:, second].

Two kernels apply it. With 64 or more rows per instance (prefill, B' per job) `_noised_mma_kernel`
computes U·Pᵀ on the tensor cores: a program holds 64 rows' U (its A operand, loaded once)
and walks K in 128-column steps (pipelined), building that step's ±1 one-hot block of P from the
two index vectors in registers (two compares per one-hot byte, amortised over 64 rows), or
(`LOAD_DENSE_P`) loading it from P stored dense once per call — no per-element gathers, x and x'
stream as 16-byte rows. With fewer rows (decode's 16) the one-hot build would cost more than
the product, and `_noised_kernel` gathers U[i, first[l]] and U[i, second[l]] per element
instead (U is a row's r bytes, L1-resident).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels.triton_jit import jit
from .blake3 import compress, constant_words, load_words8

_LANES = 128  # PRNG blocks per program: one per thread of 4 warps
_ROWS = 16  # rows per program of the noised-operand kernel (at most; a divisor of the instance's)
_COLS = 512  # k per program (masked at the end)
_NOISED_WARPS = 8  # 16 × 512 bytes over 256 threads: 32 per thread (64 registers, no spills)
_MMA_COLS = 128  # k per step of the tensor-core kernel (wgmma N)
# Tensor-core programs: (rows, warps, largest rank) — one wgmma warpgroup of 64 rows; larger ranks
# gather. Measured on the H200 (GLM-5 prefill A, 65536 × 6144, r 128): 64 rows with a 3-stage
# pipelined k loop 405 µs, 128 rows of 8 warps 546 (unpipelined 670 and 509); B' (131072 rows)
# 789 vs 1308 µs for the former default (128 rows, unpipelined).
_MMA_ROWS = ((64, 4, 256),)
_MMA_STAGES = 3  # k steps in flight: x and both index vectors (or P's block) arrive by cp.async
# The tensor-core kernel loads P's blocks from P stored dense (built once a call) instead of
# building one-hot blocks from the index vectors in registers. Measured on the H200 (fourteenth
# session, bitwise equal): noised A at GLM-5 prefill 309.4 against 405.1 µs, the whole mined
# pass 4715.4 against 4875.0 µs (Qwen3 prefill 1407.8 against 1448.8), so on; False keeps the
# one-hot build.
LOAD_DENSE_P = True
_SINGLE_BLOCK_KEYED = tl.constexpr(1 | 2 | 8 | 16)  # a global read inside a kernel must be constexpr


class NoiseError(ValueError):
    """Bad input to the device noise functions."""


@jit
def prng_block(key_ptr, label_ptr, index, sparse, live):
    """The 8 words of PRNG block G(index, label, key, slot) per lane: slot 1 (the index in word 1)
    for the sparse factor, slot 0 for the uniform one (`sparse` a lane mask); key_ptr points at
    each lane's 8 key words. Shared by the PRNG kernel and the fused decode A side."""
    k0, k1, k2, k3, k4, k5, k6, k7 = load_words8(key_ptr, live)
    l0, l1, l2, l3, l4, l5, l6, l7 = load_words8(label_ptr + tl.full(index.shape, 0, tl.int64), live)
    zero = tl.full(index.shape, 0, tl.uint32)
    index = index.to(tl.uint32)
    return compress(
        k0, k1, k2, k3, k4, k5, k6, k7,
        tl.where(sparse, zero, index), tl.where(sparse, index, zero), zero, zero, zero, zero, zero, zero,
        l0, l1, l2, l3, l4, l5, l6, l7, zero, zero + _SINGLE_BLOCK_KEYED)


@jit
def store_uniform(out_ptr, block, limit, ok, w0, w1, w2, w3, w4, w5, w6, w7,
                  R: tl.constexpr, ROWS_T: tl.constexpr):
    """U bytes 32·block .. 32·block+31 (below limit) of PRNG block `block`: 6 bits each − 32,
    stored transposed, (R, ROWS_T) for ROWS_T rows (byte p is U[p // R][p mod R]), so a column of
    U is ROWS_T contiguous bytes (`noised_rows(U_T=)`). Row-major U is `_store_uniform_words`'."""
    words = (w0, w1, w2, w3, w4, w5, w6, w7)
    for j in tl.static_range(8):
        for byte in tl.static_range(4):
            value = ((words[j] >> (8 * byte)) & 0x3F).to(tl.int32) - 32
            pos = block * 32 + 4 * j + byte
            tl.store(out_ptr + (pos % R) * ROWS_T + pos // R, value.to(tl.int8), mask=ok & (pos < limit))


@jit
def _uniform_word(w):
    """The 4 U bytes of one PRNG word packed in a word: byte b = ((w >> 8b) & 0x3F) − 32 (int8).
    Bytewise: b − 32 is b & 0x1F when bit 5 is set, else b | 0xE0 (0x20·7, no carry out)."""
    m = w & 0x3F3F3F3F
    return (m & 0x1F1F1F1F) | (((m & 0x20202020) ^ 0x20202020) * 7)


@jit
def _store_uniform_words(words_ptr, block, ok, w0, w1, w2, w3, w4, w5, w6, w7):
    """(words_ptr: a pointer per lane, at its instance's U) Row-major U words 8·block .. 8·block+7 (bytes 32·block .. +31) of PRNG block `block`, as
    one (lanes, 8) tile: each lane stores 32 contiguous bytes (two 16-byte stores) where 32 byte
    stores a lane, 1 KB apart across a warp, wrote every sector 32 times."""
    tile = tl.join(tl.join(tl.join(_uniform_word(w0), _uniform_word(w4)),
                           tl.join(_uniform_word(w2), _uniform_word(w6))),
                   tl.join(tl.join(_uniform_word(w1), _uniform_word(w5)),
                           tl.join(_uniform_word(w3), _uniform_word(w7))))  # [x, y, z] = word 4x + 2y + z
    tile = tl.reshape(tile, (block.shape[0], 8)).to(tl.int32, bitcast=True)
    tl.store(words_ptr[:, None] + block[:, None] * 8 + tl.arange(0, 8)[None, :], tile, mask=ok[:, None])


@jit
def store_sparse(first_ptr, second_ptr, block, limit, rank, ok, w0, w1, w2, w3, w4, w5, w6, w7):
    """P rows 8·block .. 8·block+7 (below limit) of PRNG block `block` as (first, second) index
    pairs: first = u mod r, second = first ⊕ (1 + ⌊(r − 1)·u / 2^32⌋)."""
    words = (w0, w1, w2, w3, w4, w5, w6, w7)
    mask = tl.full(block.shape, 0, tl.uint32) + (rank - 1)
    for j in tl.static_range(8):
        u = words[j]
        first = u & mask
        spread = ((tl.full(block.shape, 0, tl.uint64) + (rank - 1)) * u.to(tl.uint64)) >> 32
        second = first ^ (1 + spread.to(tl.uint32))
        pos = block * 8 + j
        tl.store(first_ptr + pos, first.to(tl.int32), mask=ok & (pos < limit))
        tl.store(second_ptr + pos, second.to(tl.int32), mask=ok & (pos < limit))


@jit
def _prng_lanes(key_ptr, label_ptr, out_ptr, second_ptr, program, blocks, total, limit, rank,
                SPARSE: tl.constexpr, LANES: tl.constexpr):
    """Uniform (SPARSE=0): 32 factor bytes per block, out_ptr at U's int32 words. Sparse (SPARSE=1):
    8 (first, second) pairs."""
    lane = program * LANES + tl.arange(0, LANES)
    live = lane < total
    inst = (lane // blocks).to(tl.int64)
    block = (lane % blocks).to(tl.int64)
    sparse = tl.full(lane.shape, SPARSE, tl.int32) != 0
    w0, w1, w2, w3, w4, w5, w6, w7 = prng_block(key_ptr + inst * 8, label_ptr, block + 1, sparse, live)
    if SPARSE:
        store_sparse(out_ptr + inst * limit, second_ptr + inst * limit, block, limit, rank, live,
                     w0, w1, w2, w3, w4, w5, w6, w7)
    else:  # U as int32 words: limit (rows·rank bytes) is a multiple of 32, so blocks are whole
        _store_uniform_words(out_ptr + inst * (limit // 4), block, live, w0, w1, w2, w3, w4, w5, w6, w7)


@jit
def _prng_kernel(key_ptr, label_ptr, u_ptr, first_ptr, second_ptr, u_blocks, u_total, u_limit,
                 s_blocks, s_total, s_limit, rank, u_programs, LANES: tl.constexpr):
    """Both factors of a side in one launch: programs below u_programs make U (u_ptr: its int32
    words), the rest P."""
    program = tl.program_id(0)
    if program < u_programs:
        _prng_lanes(key_ptr, label_ptr, u_ptr, u_ptr, program, u_blocks, u_total, u_limit, rank,
                    0, LANES)
    else:
        _prng_lanes(key_ptr, label_ptr, first_ptr, second_ptr, program - u_programs, s_blocks,
                    s_total, s_limit, rank, 1, LANES)


def _check_keys(keys: torch.Tensor) -> None:
    if keys.dtype != torch.int32 or keys.dim() != 2 or keys.shape[1] != 8:
        raise NoiseError(f"keys must be int32 (instances, 8), got {keys.dtype} {tuple(keys.shape)}")


def _check_rank(rank: int) -> None:
    if rank < 32 or rank & (rank - 1):
        raise NoiseError(f"noise rank must be a power of two >= 32, got {rank}")


def noise_factors(keys: torch.Tensor, label: bytes, rows: int, k: int, rank: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """U (instances, rows, rank) int8 in [−32, 31] for rows 0..rows−1, and P as (first, second),
    each (instances, k) int32 (row l: +1 at first, −1 at second), of every instance: one launch.
    rows = 0 or k = 0 leaves that factor out (an empty tensor)."""
    _check_keys(keys)
    _check_rank(rank)
    instances = keys.shape[0]
    device = keys.device
    u_blocks, s_blocks = rows * rank // 32, triton.cdiv(k, 8)
    u_total, s_total = instances * u_blocks, instances * s_blocks
    uniform = torch.empty((instances, rows, rank), dtype=torch.int8, device=device)
    first = torch.empty((instances, k), dtype=torch.int32, device=device)
    second = torch.empty_like(first)
    u_programs = triton.cdiv(u_total, _LANES)
    grid = (u_programs + triton.cdiv(s_total, _LANES),)
    _prng_kernel[grid](keys.contiguous(), constant_words(label, device), uniform.view(torch.int32), first, second,
                       max(u_blocks, 1), u_total, rows * rank, max(s_blocks, 1), s_total, k, rank, u_programs,
                       LANES=_LANES)
    return uniform, first, second


def uniform_factor(keys: torch.Tensor, label: bytes, rows: int, rank: int) -> torch.Tensor:
    """U for rows 0..rows−1 of every instance: (instances, rows, rank) int8 in [−32, 31]."""
    return noise_factors(keys, label, rows, 0, rank)[0]


def sparse_factor(keys: torch.Tensor, label: bytes, k: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """P as (first, second), each (instances, k) int32: row l has +1 at first, −1 at second."""
    _, first, second = noise_factors(keys, label, 0, k, rank)
    return first, second


def dense_sparse_factor(first: torch.Tensor, second: torch.Tensor, rank: int, *,
                        rank_contiguous: bool = False) -> torch.Tensor:
    """P stored dense: (instances, k, rank) int8 with +1 at (l, first[l]) and −1 at (l, second[l])
    (first ≠ second always). The int8 tensor-core operands must be contiguous along the product's
    depth: for a product over k (the A·P_B kernel, Qᵀ = B'·P_A) the storage is Pᵀ ((instances,
    rank, k) contiguous), returned as its transposed view; for a product over the rank (U·Pᵀ in
    `noised`) `rank_contiguous` stores P itself."""
    if first.shape != second.shape or first.dim() != 2 or first.dtype != torch.int32:
        raise NoiseError(f"first/second must be int32 (instances, k), got {first.dtype} "
                         f"{tuple(first.shape)} and {tuple(second.shape)}")
    if rank_contiguous:
        dense = torch.zeros((*first.shape, rank), dtype=torch.int8, device=first.device)
        dense.scatter_(2, first.long().unsqueeze(2), 1)
        dense.scatter_(2, second.long().unsqueeze(2), -1)
        return dense
    dense_t = torch.zeros((first.shape[0], rank, first.shape[1]), dtype=torch.int8, device=first.device)
    dense_t.scatter_(1, first.long().unsqueeze(1), 1)
    dense_t.scatter_(1, second.long().unsqueeze(1), -1)
    return dense_t.transpose(1, 2)


@jit
def noised_rows(x_ptr, u_ptr, first_ptr, second_ptr, out_ptr, rows, ks, live, K, R: tl.constexpr,
                copy_ptr=None, COPY: tl.constexpr = 0, U_T: tl.constexpr = 0):
    """out[i][l] = x[i][l] + U[i][first[l]] − U[i][second[l]] for rows i (int64 vector, one
    instance whose index vectors start at first_ptr/second_ptr; u_ptr at U's row 0 of the rows'
    numbering) and columns ks (masked by live). Shared by the noised kernel and the fused A side.
    COPY: x is also stored at copy_ptr (same offsets), so a caller that keeps the clean rows
    needs no copy launch of its own (the lagged side chain). U_T > 0: U is stored transposed for
    U_T rows (`store_uniform(ROWS_T=)`), rows = 0 .. U_T − 1: a column's U_T bytes are one vector
    load instead of U_T byte gathers (the fused A side at decode, where the gathers were the
    side chain's bulk)."""
    first = tl.load(first_ptr + ks, mask=live, other=0)
    second = tl.load(second_ptr + ks, mask=live, other=0)
    if U_T:
        col_u = u_ptr + rows[:, None]
        plus = tl.load(col_u + first[None, :] * U_T).to(tl.int16)
        minus = tl.load(col_u + second[None, :] * U_T).to(tl.int16)
    else:
        row_u = u_ptr + rows[:, None] * R
        plus = tl.load(row_u + first[None, :]).to(tl.int16)
        minus = tl.load(row_u + second[None, :]).to(tl.int16)
    at = rows[:, None] * K + ks[None, :]
    x = tl.load(x_ptr + at, mask=live[None, :], other=0)
    if COPY:
        tl.store(copy_ptr + at, x, mask=live[None, :])
    value = x.to(tl.int16) + plus - minus
    tl.store(out_ptr + at, value.to(tl.int8), mask=live[None, :])


@jit
def _noised_kernel(x_ptr, u_ptr, first_ptr, second_ptr, out_ptr, rows_per_instance, factor_stride, K,
                   R: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr):
    """X' = X + U·Pᵀ over BR rows × BK columns per program.

    The BR rows of a program share one instance (BR divides rows_per_instance), so the index
    vectors are loaded once per column block and broadcast over the rows; U comes from each
    row's r bytes (L1-resident); x and out are contiguous int8 rows (16-byte vector accesses).
    """
    rows = (tl.program_id(0) * BR + tl.arange(0, BR)).to(tl.int64)
    ks = tl.program_id(1) * BK + tl.arange(0, BK)
    inst = ((tl.program_id(0) * BR) // rows_per_instance).to(tl.int64)
    noised_rows(x_ptr, u_ptr, first_ptr + inst * factor_stride, second_ptr + inst * factor_stride,
                out_ptr, rows, ks, ks < K, K, R)


@jit
def _noised_mma_kernel(x_ptr, u_ptr, first_ptr, second_ptr, p_ptr, out_ptr, rows_per_instance, factor_stride, K,
                       R: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr, STAGES: tl.constexpr,
                       LOAD_P: tl.constexpr):
    """X' = X + U·Pᵀ for BR rows of one instance over all of K, BC columns per step: U's rows are
    the loop-invariant A operand, the step's block of P the B operand; int32 sums wrap to int8
    like the gather kernel's int16 ones. LOAD_P: P's (BC × R) block is loaded from P stored dense
    (rank-contiguous, `dense_sparse_factor(rank_contiguous=True)`, at p_ptr; from L2, since every
    program of an instance reads the same blocks); else the ±1 one-hot block of Pᵀ (R × BC) is
    built in registers from the two index vectors. factor_stride = K, or 0 for one factor shared
    by all instances. The k loop is pipelined (STAGES): a step's loads arrive by cp.async while
    earlier steps multiply, so no step waits on a global load."""
    row0 = tl.program_id(0) * BR
    rows = (row0 + tl.arange(0, BR)).to(tl.int64)
    inst = (row0 // rows_per_instance).to(tl.int64)  # BR divides rows_per_instance
    ts = tl.arange(0, R)
    u = tl.load(u_ptr + rows[:, None] * R + ts[None, :])
    first_inst = first_ptr + inst * factor_stride
    second_inst = second_ptr + inst * factor_stride
    p_inst = p_ptr + inst * factor_stride * R
    cs = tl.arange(0, BC)
    row_at = rows[:, None] * K
    for c0 in tl.range(0, K, BC, num_stages=STAGES):
        ks = c0 + cs
        live = ks < K
        x = tl.load(x_ptr + row_at + ks[None, :], mask=live[None, :], other=0)
        if LOAD_P:
            p = tl.load(p_inst + ks[:, None] * R + ts[None, :], mask=live[:, None], other=0)
            noise = tl.dot(u, tl.trans(p), out_dtype=tl.int32)
        else:
            first = tl.load(first_inst + ks, mask=live, other=0)  # a dead column: +1 − 1 at 0 = 0
            second = tl.load(second_inst + ks, mask=live, other=0)
            # built in this orientation so a thread compares few columns (4 index loads per
            # thread instead of 64 in the (BC × R) orientation's default layout)
            one_hot = (ts[:, None] == first[None, :]).to(tl.int8) - (ts[:, None] == second[None, :]).to(tl.int8)
            noise = tl.dot(u, one_hot, out_dtype=tl.int32)
        tl.store(out_ptr + row_at + ks[None, :], (x.to(tl.int32) + noise).to(tl.int8), mask=live[None, :])


def noised(x: torch.Tensor, uniform: torch.Tensor, first: torch.Tensor,
           second: torch.Tensor) -> torch.Tensor:
    """X' = X + U·Pᵀ row by row: x (I, rows, k) int8 in [−64, 64], uniform (I, rows, r) int8,
    first/second (I, k) int32 (or (1, k): one sparse factor shared by all instances)."""
    instances, rows, k = x.shape
    if (x.dtype != torch.int8 or uniform.shape[:2] != x.shape[:2] or uniform.dtype != torch.int8
            or first.shape not in ((instances, k), (1, k)) or first.shape != second.shape
            or first.dtype != torch.int32 or second.dtype != torch.int32):
        raise NoiseError(f"noised: x {x.dtype} {tuple(x.shape)}, uniform {uniform.dtype} "
                         f"{tuple(uniform.shape)}, first {first.dtype} {tuple(first.shape)} do not agree")
    rank = uniform.shape[2]
    out = torch.empty_like(x)
    factor_stride = 0 if first.shape[0] == 1 else k
    first, second = first.contiguous(), second.contiguous()
    for block_rows, warps, max_rank in _MMA_ROWS:
        if rows % block_rows == 0 and rank <= max_rank:
            dense = dense_sparse_factor(first, second, rank, rank_contiguous=True) if LOAD_DENSE_P else first
            _noised_mma_kernel[(instances * rows // block_rows,)](
                x.contiguous(), uniform.contiguous(), first, second, dense, out, rows, factor_stride, k,
                R=rank, BR=block_rows, BC=_MMA_COLS, STAGES=_MMA_STAGES, LOAD_P=int(LOAD_DENSE_P), num_warps=warps)
            return out
    block_rows = math.gcd(rows, _ROWS)  # a program's rows share one instance
    block_k = min(_COLS, triton.next_power_of_2(k))
    grid = (instances * rows // block_rows, triton.cdiv(k, block_k))
    _noised_kernel[grid](x.contiguous(), uniform.contiguous(), first, second, out,
                         rows, factor_stride, k, R=rank, BR=block_rows, BK=block_k, num_warps=_NOISED_WARPS)
    return out
