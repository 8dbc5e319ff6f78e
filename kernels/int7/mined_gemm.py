"""The mined int8 GEMM (Triton): the layer's GEMM, the INT transcript, the tickets and the peel in
one pass over the weights.

Per program: a BM × BN output block of one instance (an expert's dense instance, or an expert of
an MoE instance), looping over k in BK steps. After every multiple of the rank r (c·r ≤ D) each
h × w lottery tile of the noised accumulator is XOR-reduced and folded into its 16 words with
rotl13; after D one keyed BLAKE3 compression per tile under s_A and a compare with the bound (8 LE
u32 words, most significant first). The first winner claims the device record with an atomic CAS
and writes (instance, tile row, tile column, ticket).

Lottery tiles are contiguous h × w blocks (patterns 0..h−1 and 0..w−1), so a tile lies inside one
accumulator block and the XOR is a reshape + reduction in registers.

The peel ("stacked" option): the program also multiplies the clean A rows by B' (same B' tile, a
second MMA) and subtracts (A·P_B)·U_Bᵀ with three int8 limb MMAs of depth r, giving A·B exactly
(int32 arithmetic wraps, and A·B fits); then the dequantised bf16 output. A·B' − (A·P_B)·U_Bᵀ = A·B
because A·E_B = A·P_B·U_Bᵀ, so no term depends on the A seed and nothing re-reads the weights.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton.language as tl

from ._jit import jit
from .blake3 import compress

RECORD_WORDS = 16  # [0] claim, [1] instance, [2] tile row, [3] tile column, [4:12] ticket words
DUMP_WORDS = 24  # per tile: 16 transcript words, 8 ticket words
_NO_TILE = tl.constexpr(2**31 - 1)  # a global read inside a kernel must be constexpr


class MinedGemmError(ValueError):
    """Bad arguments to the mined GEMM."""


@dataclass(frozen=True)
class Tiling:
    """Program block shape and launch parameters."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3


@jit
def _xor_combine(a, b):
    return a ^ b


@jit
def _min_combine(a, b):
    return tl.minimum(a, b)


@jit
def _rotl13(x):
    return (x << 13) | (x >> 19)


@jit
def _fold(j0, j1, j2, j3, j4, j5, j6, j7, j8, j9, j10, j11, j12, j13, j14, j15, x, w):
    """J[w] ← rotl13(J[w]) ⊕ x for the runtime word index w (the other words unchanged)."""
    j0 = tl.where(w == 0, _rotl13(j0) ^ x, j0)
    j1 = tl.where(w == 1, _rotl13(j1) ^ x, j1)
    j2 = tl.where(w == 2, _rotl13(j2) ^ x, j2)
    j3 = tl.where(w == 3, _rotl13(j3) ^ x, j3)
    j4 = tl.where(w == 4, _rotl13(j4) ^ x, j4)
    j5 = tl.where(w == 5, _rotl13(j5) ^ x, j5)
    j6 = tl.where(w == 6, _rotl13(j6) ^ x, j6)
    j7 = tl.where(w == 7, _rotl13(j7) ^ x, j7)
    j8 = tl.where(w == 8, _rotl13(j8) ^ x, j8)
    j9 = tl.where(w == 9, _rotl13(j9) ^ x, j9)
    j10 = tl.where(w == 10, _rotl13(j10) ^ x, j10)
    j11 = tl.where(w == 11, _rotl13(j11) ^ x, j11)
    j12 = tl.where(w == 12, _rotl13(j12) ^ x, j12)
    j13 = tl.where(w == 13, _rotl13(j13) ^ x, j13)
    j14 = tl.where(w == 14, _rotl13(j14) ^ x, j14)
    j15 = tl.where(w == 15, _rotl13(j15) ^ x, j15)
    return j0, j1, j2, j3, j4, j5, j6, j7, j8, j9, j10, j11, j12, j13, j14, j15


@jit
def _tile_xor(acc, BM: tl.constexpr, BN: tl.constexpr, H: tl.constexpr, W: tl.constexpr):
    """XOR of each h × w tile of the accumulator block: (BM/h, BN/w) uint32."""
    bits = tl.reshape(acc.to(tl.uint32, bitcast=True), (BM // H, H, BN // W, W))
    return tl.reduce(tl.reduce(bits, 3, _xor_combine), 1, _xor_combine)


@jit
def _pick(values, selected):
    """The value at the single selected position of a 2-D tile grid."""
    chosen = tl.where(selected, values, tl.full(values.shape, 0, tl.uint32))
    return tl.reduce(tl.reduce(chosen, 1, _xor_combine), 0, _xor_combine)


@jit
def _mined_gemm_kernel(an_ptr, ac_ptr, bt_ptr, limb_ptr, ub_ptr, key_ptr, bound_ptr, mvalid_ptr,
                       record_ptr, sa_ptr, sb_ptr, out_ptr, out32_ptr, dump_ptr,
                       E, M, N, K, NC,
                       R: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                       H: tl.constexpr, W: tl.constexpr, MINE: tl.constexpr, PEEL: tl.constexpr,
                       WRITE_I32: tl.constexpr, DUMP: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    e = tl.program_id(2).to(tl.int64)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a_rows = (e * M + rm).to(tl.int64) * K
    b_rows = (e * N + rn).to(tl.int64) * K
    acc = tl.full((BM, BN), 0, tl.int32)
    acc_clean = tl.full((BM, BN), 0, tl.int32)
    zero = tl.full((BM // H, BN // W), 0, tl.uint32)
    j0, j1, j2, j3, j4, j5, j6, j7 = zero, zero, zero, zero, zero, zero, zero, zero
    j8, j9, j10, j11, j12, j13, j14, j15 = zero, zero, zero, zero, zero, zero, zero, zero
    steps_per_chunk = R // BK
    mined_steps = NC * steps_per_chunk
    for step in range(0, K // BK):
        kk = step * BK + rk
        b = tl.load(bt_ptr + b_rows[:, None] + kk[None, :])
        a = tl.load(an_ptr + a_rows[:, None] + kk[None, :])
        acc = tl.dot(a, tl.trans(b), acc, out_dtype=tl.int32)
        if PEEL:
            a_clean = tl.load(ac_ptr + a_rows[:, None] + kk[None, :])
            acc_clean = tl.dot(a_clean, tl.trans(b), acc_clean, out_dtype=tl.int32)
        if MINE:
            if ((step + 1) % steps_per_chunk == 0) & (step < mined_steps):
                x = _tile_xor(acc, BM, BN, H, W)
                j0, j1, j2, j3, j4, j5, j6, j7, j8, j9, j10, j11, j12, j13, j14, j15 = _fold(
                    j0, j1, j2, j3, j4, j5, j6, j7, j8, j9, j10, j11, j12, j13, j14, j15,
                    x, (step // steps_per_chunk) % 16)
    if PEEL:
        # A·B = A·B' − (A·P_B)·U_Bᵀ; A·P_B arrives as three signed base-256 int8 limbs.
        ub_rows = (e * N + rn).to(tl.int64) * R
        limb_rows = (e * M + rm).to(tl.int64) * R
        limb_stride = E * M * R
        for rr in range(0, R // BK):
            kr = rr * BK + rk
            ub = tl.load(ub_ptr + ub_rows[:, None] + kr[None, :])
            for limb in tl.static_range(3):
                part = tl.load(limb_ptr + limb * limb_stride + limb_rows[:, None] + kr[None, :])
                product = tl.dot(part, tl.trans(ub), tl.full((BM, BN), 0, tl.int32), out_dtype=tl.int32)
                acc_clean -= product * (1 << (8 * limb))
        result = acc_clean
    else:
        result = acc
    if MINE:
        kw = key_ptr + e * 8
        c0, c1, c2, c3, c4, c5, c6, c7 = compress(
            zero + tl.load(kw).to(tl.uint32, bitcast=True),
            zero + tl.load(kw + 1).to(tl.uint32, bitcast=True),
            zero + tl.load(kw + 2).to(tl.uint32, bitcast=True),
            zero + tl.load(kw + 3).to(tl.uint32, bitcast=True),
            zero + tl.load(kw + 4).to(tl.uint32, bitcast=True),
            zero + tl.load(kw + 5).to(tl.uint32, bitcast=True),
            zero + tl.load(kw + 6).to(tl.uint32, bitcast=True),
            zero + tl.load(kw + 7).to(tl.uint32, bitcast=True),
            j0, j1, j2, j3, j4, j5, j6, j7, j8, j9, j10, j11, j12, j13, j14, j15,
            zero, zero + 27)  # CHUNK_START | CHUNK_END | ROOT | KEYED_HASH
        ticket = (c0, c1, c2, c3, c4, c5, c6, c7)
        below = zero != zero
        equal = zero == zero
        for i in tl.static_range(8):
            word = ticket[7 - i]
            limit = tl.load(bound_ptr + (7 - i)).to(tl.uint32, bitcast=True)
            below = below | (equal & (word < limit))
            equal = equal & (word == limit)
        tiles_n = N // W
        tr = pid_m * (BM // H) + tl.arange(0, BM // H)
        tc = pid_n * (BN // W) + tl.arange(0, BN // W)
        eligible = (tr + 1) * H <= tl.load(mvalid_ptr + e)
        wins = (below | equal) & eligible[:, None]
        linear = tr[:, None] * tiles_n + tc[None, :]
        if DUMP:
            slot = dump_ptr + ((e * (M // H) * tiles_n + linear.to(tl.int64)) * 24)
            words = (j0, j1, j2, j3, j4, j5, j6, j7, j8, j9, j10, j11, j12, j13, j14, j15)
            for i in tl.static_range(16):
                tl.store(slot + i, words[i].to(tl.int32, bitcast=True))
            for i in tl.static_range(8):
                tl.store(slot + 16 + i, ticket[i].to(tl.int32, bitcast=True))
        best = tl.reduce(tl.reduce(tl.where(wins, linear, _NO_TILE), 1, _min_combine), 0, _min_combine)
        if best < _NO_TILE:
            if tl.atomic_cas(record_ptr, 0, 1) == 0:
                selected = linear == best
                tl.store(record_ptr + 1, e.to(tl.int32))
                tl.store(record_ptr + 2, (best // tiles_n) * H)
                tl.store(record_ptr + 3, (best % tiles_n) * W)
                for i in tl.static_range(8):
                    tl.store(record_ptr + 4 + i, _pick(ticket[i], selected).to(tl.int32, bitcast=True))
    out_offsets = (e * M + rm).to(tl.int64)[:, None] * N + rn[None, :]
    if WRITE_I32:
        tl.store(out32_ptr + out_offsets, result)
    scale_a = tl.load(sa_ptr + e * M + rm)
    scale_b = tl.load(sb_ptr + e * N + rn)
    value = result.to(tl.float32) * scale_a[:, None] * scale_b[None, :]
    tl.store(out_ptr + out_offsets, value.to(tl.bfloat16))


def default_tiling(m: int, n: int, k: int, rank: int, tile_h: int = 2, tile_w: int = 2) -> Tiling:
    """Decode (few rows per instance): 16-row blocks; prefill: 128 × 128; k steps of 128 or 64.

    Picks the largest block sizes that divide the problem and hold whole lottery tiles; the
    _check_tiling error names what does not fit when none does.
    """
    def largest(extent: int, options: tuple[int, ...], multiple: int) -> int:
        return next((b for b in options if extent % b == 0 and b % multiple == 0), options[-1])

    block_k = 128 if rank % 128 == 0 and k % 128 == 0 else 64
    block_n = largest(n, (128, 64, 32, 16), tile_w)
    if m <= 32:
        return Tiling(largest(m, (16, 32), tile_h), block_n, block_k, num_warps=4, num_stages=4)
    return Tiling(largest(m, (128, 64, 32, 16), tile_h), block_n, block_k, num_warps=8, num_stages=3)


def _check_operand(name: str, t: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    if tuple(t.shape) != shape or t.dtype != dtype or not t.is_contiguous():
        raise MinedGemmError(f"{name} must be contiguous {dtype} {shape}, got {t.dtype} "
                             f"{tuple(t.shape)}{'' if t.is_contiguous() else ' (not contiguous)'}")


def _check_tiling(tiling: Tiling, m: int, n: int, k: int, rank: int, h: int, w: int) -> None:
    bm, bn, bk = tiling.block_m, tiling.block_n, tiling.block_k
    problems = [(m % bm, f"M={m} is not a multiple of block_m={bm}"),
                (n % bn, f"N={n} is not a multiple of block_n={bn}"),
                (k % bk, f"K={k} is not a multiple of block_k={bk}"),
                (rank % bk, f"rank={rank} is not a multiple of block_k={bk}"),
                (bm % h, f"block_m={bm} is not a multiple of the tile height {h}"),
                (bn % w, f"block_n={bn} is not a multiple of the tile width {w}")]
    for bad, message in problems:
        if bad:
            raise MinedGemmError(message)


def mined_gemm(a_noised: torch.Tensor, a_clean: torch.Tensor, bt_noised: torch.Tensor,
               apb_limbs: torch.Tensor, u_b: torch.Tensor, s_a: torch.Tensor,
               bound_words: torch.Tensor, rows_valid: torch.Tensor, record: torch.Tensor,
               scale_a: torch.Tensor, scale_b: torch.Tensor, *, rank: int, tile_h: int,
               tile_w: int, out: torch.Tensor, out_i32: torch.Tensor | None = None,
               dump: torch.Tensor | None = None, tiling: Tiling | None = None,
               peel: bool = True) -> None:
    """Mined GEMM of E instances: out[e] = dequant(A_e·B_e) from the noised operands.

    a_noised/a_clean: (E, M, K) int8 (A' and A); bt_noised: (E, N, K) int8 (B'ᵀ); apb_limbs:
    (3, E, M, r) int8 limbs of A·P_B; u_b: (E, N, r) int8; s_a: (E, 8) int32 ticket keys;
    bound_words: (8,) int32 LE words of the bound; rows_valid: (E,) int32 rows that may hold
    lottery tiles (a multiple of tile_h); record: (16,) int32, [0] = 0 arms it; scale_a (E, M)
    and scale_b (E, N) float32; out (E, M, N) bf16; out_i32 optional exact A·B; dump optional
    (E, M/h, N/w, 24) int32 per-tile transcript words and tickets (for checks). peel=False
    skips the peel (the output is then A'·B'): only for measuring what the peel costs.
    """
    e, m, k = a_noised.shape
    n = bt_noised.shape[1]
    _check_operand("a_noised", a_noised, (e, m, k), torch.int8)
    _check_operand("a_clean", a_clean, (e, m, k), torch.int8)
    _check_operand("bt_noised", bt_noised, (e, n, k), torch.int8)
    _check_operand("apb_limbs", apb_limbs, (3, e, m, rank), torch.int8)
    _check_operand("u_b", u_b, (e, n, rank), torch.int8)
    _check_operand("s_a", s_a, (e, 8), torch.int32)
    _check_operand("bound_words", bound_words, (8,), torch.int32)
    _check_operand("rows_valid", rows_valid, (e,), torch.int32)
    _check_operand("record", record, (RECORD_WORDS,), torch.int32)
    _check_operand("scale_a", scale_a, (e, m), torch.float32)
    _check_operand("scale_b", scale_b, (e, n), torch.float32)
    _check_operand("out", out, (e, m, n), torch.bfloat16)
    if out_i32 is not None:
        _check_operand("out_i32", out_i32, (e, m, n), torch.int32)
    if dump is not None:
        _check_operand("dump", dump, (e, m // tile_h, n // tile_w, DUMP_WORDS), torch.int32)
    tiling = tiling or default_tiling(m, n, k, rank, tile_h, tile_w)
    _check_tiling(tiling, m, n, k, rank, tile_h, tile_w)
    grid = (n // tiling.block_n, m // tiling.block_m, e)
    _mined_gemm_kernel[grid](
        a_noised, a_clean, bt_noised, apb_limbs, u_b, s_a, bound_words, rows_valid, record,
        scale_a, scale_b, out, out if out_i32 is None else out_i32, out if dump is None else dump,
        e, m, n, k, k // rank,
        R=rank, BM=tiling.block_m, BN=tiling.block_n, BK=tiling.block_k, H=tile_h, W=tile_w,
        MINE=1, PEEL=int(peel), WRITE_I32=int(out_i32 is not None), DUMP=int(dump is not None),
        num_warps=tiling.num_warps, num_stages=tiling.num_stages)


def plain_gemm(a: torch.Tensor, bt: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, *,
               out: torch.Tensor, out_i32: torch.Tensor | None = None,
               tiling: Tiling | None = None) -> None:
    """The same kernel without mining or peel: out[e] = dequant(A_e·B_eᵀ) — the unmined baseline."""
    e, m, k = a.shape
    n = bt.shape[1]
    _check_operand("a", a, (e, m, k), torch.int8)
    _check_operand("bt", bt, (e, n, k), torch.int8)
    _check_operand("scale_a", scale_a, (e, m), torch.float32)
    _check_operand("scale_b", scale_b, (e, n), torch.float32)
    _check_operand("out", out, (e, m, n), torch.bfloat16)
    if out_i32 is not None:
        _check_operand("out_i32", out_i32, (e, m, n), torch.int32)
    tiling = tiling or default_tiling(m, n, k, 128)
    _check_tiling(tiling, m, n, k, tiling.block_k, 2, 2)
    grid = (n // tiling.block_n, m // tiling.block_m, e)
    _mined_gemm_kernel[grid](
        a, a, bt, a, a, a, a, a, a, scale_a, scale_b, out, out if out_i32 is None else out_i32, out,
        e, m, n, k, 0,
        R=tiling.block_k, BM=tiling.block_m, BN=tiling.block_n, BK=tiling.block_k, H=2, W=2,
        MINE=0, PEEL=0, WRITE_I32=int(out_i32 is not None), DUMP=0,
        num_warps=tiling.num_warps, num_stages=tiling.num_stages)
