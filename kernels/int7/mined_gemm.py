"""The mined int8 GEMM (Triton): the layer's GEMM, the INT transcript, the tickets and the peel in
one pass over the weights.

Per program: a BM × BN output block of one instance (an expert's dense instance, or an expert of
an MoE instance), looping over k in BK steps. Lottery tiles are contiguous h rows × w = BN columns
(patterns 0..h−1 and 0..w−1): a tile is h whole rows of the block. After every multiple of the
rank r (c·r ≤ D) each row of the noised accumulator is XOR-reduced along the columns (no layout
change of the accumulator) and folded into that row's 16 words with rotl13. Folding is linear over
XOR, so after D the h rows' words XOR into the tile's transcript; then one keyed BLAKE3
compression per tile under s_A and a compare with the bound (8 LE u32 words, most significant
first). The first winner claims the device record with an atomic CAS and writes (instance, tile
row, tile column, ticket).

The peel (exact: int32 arithmetic wraps, and A·B fits), then the dequantised bf16 output: the
program also multiplies the clean A rows by B' (same B' tile, a second MMA) and subtracts
(A·P_B)·U_Bᵀ with three int8 limb MMAs of depth r: A·B' − (A·P_B)·U_Bᵀ = A·B because
A·E_B = A·P_B·U_Bᵀ; nothing re-reads the weights, and the second MMA is nearly free in a
memory-bound GEMM. (A Q peel through P_Aᵀ·B' was measured slower everywhere: docs/kernels-int7.md.)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from proof.int7.config import MAX_WORKER_INPUT

from kernels.triton_jit import jit, pdl_enabled, pdl_launch
from .tickets import draw_and_claim, store_dump, xor_combine

TILE_H = 2  # lottery tile rows: the protocol's smallest even height, so a tile spans the block width
TILE_WIDTHS = (128, 64, 32, 16)  # block_n options = lottery tile widths, widest first
RECORD_WORDS = 16  # [0] claim, [1] instance, [2] tile row, [3] tile column, [4:12] ticket words
DUMP_WORDS = 24  # per tile: 16 transcript words, 8 ticket words


class MinedGemmError(ValueError):
    """Bad arguments to the mined GEMM."""


@dataclass(frozen=True)
class LagPhase:
    """A device-side choice between two equal buffer sets `words` int32 words apart (the lagged
    pass's READY and PENDING states, pipeline._LagPair): a kernel given set 0 adds
    phase·words (READY) or (1 − phase)·words (PENDING) to its pointers. CUDA graphs bake pointers,
    so this lets every replay alternate the sets without a copy launch in front of the GEMM."""

    phase: torch.Tensor  # (1,) int32, 0 or 1
    words: int  # int32 words from set 0 to set 1, a multiple of 16 (the JIT then knows every
    # shifted pointer keeps 64-byte alignment, so the loads stay 16-byte vectors)


@jit
def lag_set(phase_ptr, PHASED: tl.constexpr, PENDING: tl.constexpr):
    """Which set (0/1, int64) of a LagPhase pair this kernel uses: READY = phase, PENDING = the
    other; 0 when not PHASED. Callers shift int32 pointers by set·words, bytes by set·4·words."""
    chosen = tl.full((), 0, tl.int64)
    if PHASED:
        chosen = tl.load(phase_ptr).to(tl.int64)
        if PENDING:
            chosen = 1 - chosen
    return chosen


@dataclass(frozen=True)
class Tiling:
    """Program block shape and launch parameters."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3


@jit
def _rotl13(x):
    return (x << 13) | (x >> 19)


@jit
def _fold(j0, j1, j2, j3, j4, j5, j6, j7, j8, j9, j10, j11, j12, j13, j14, j15, x):
    """Fold x into the transcript queue: the head word (the one chunk c updates, c mod 16) becomes
    rotl13(head) ⊕ x and moves to the back, so the next chunk's word is the head again.

    A static word index: one rotate and one XOR per row (the queue shift is register renaming
    across the loop's iterations), instead of 16 rotates and selects for a runtime index w.
    After c folds, position p holds word (c + p) mod 16; `_unrotate` restores the order.
    """
    return j1, j2, j3, j4, j5, j6, j7, j8, j9, j10, j11, j12, j13, j14, j15, _rotl13(j0) ^ x


@jit
def _rotate(j0, j1, j2, j3, j4, j5, j6, j7, j8, j9, j10, j11, j12, j13, j14, j15,
            BY: tl.constexpr, do):
    """The queue rotated left by BY positions (new[p] = old[(p + BY) mod 16]) where `do` holds."""
    w = (j0, j1, j2, j3, j4, j5, j6, j7, j8, j9, j10, j11, j12, j13, j14, j15)
    return (tl.where(do, w[BY % 16], j0), tl.where(do, w[(1 + BY) % 16], j1),
            tl.where(do, w[(2 + BY) % 16], j2), tl.where(do, w[(3 + BY) % 16], j3),
            tl.where(do, w[(4 + BY) % 16], j4), tl.where(do, w[(5 + BY) % 16], j5),
            tl.where(do, w[(6 + BY) % 16], j6), tl.where(do, w[(7 + BY) % 16], j7),
            tl.where(do, w[(8 + BY) % 16], j8), tl.where(do, w[(9 + BY) % 16], j9),
            tl.where(do, w[(10 + BY) % 16], j10), tl.where(do, w[(11 + BY) % 16], j11),
            tl.where(do, w[(12 + BY) % 16], j12), tl.where(do, w[(13 + BY) % 16], j13),
            tl.where(do, w[(14 + BY) % 16], j14), tl.where(do, w[(15 + BY) % 16], j15))


@jit
def _unrotate(j0, j1, j2, j3, j4, j5, j6, j7, j8, j9, j10, j11, j12, j13, j14, j15, folds):
    """Transcript words in order after `folds` folds (word w sits at position (w − folds) mod 16):
    a rotation by (−folds) mod 16 as four conditional rotations by 1, 2, 4, 8 (once per program)."""
    by = (16 - folds % 16) % 16
    j0, j1, j2, j3, j4, j5, j6, j7, j8, j9, j10, j11, j12, j13, j14, j15 = _rotate(
        j0, j1, j2, j3, j4, j5, j6, j7, j8, j9, j10, j11, j12, j13, j14, j15, 1, (by & 1) != 0)
    j0, j1, j2, j3, j4, j5, j6, j7, j8, j9, j10, j11, j12, j13, j14, j15 = _rotate(
        j0, j1, j2, j3, j4, j5, j6, j7, j8, j9, j10, j11, j12, j13, j14, j15, 2, (by & 2) != 0)
    j0, j1, j2, j3, j4, j5, j6, j7, j8, j9, j10, j11, j12, j13, j14, j15 = _rotate(
        j0, j1, j2, j3, j4, j5, j6, j7, j8, j9, j10, j11, j12, j13, j14, j15, 4, (by & 4) != 0)
    return _rotate(j0, j1, j2, j3, j4, j5, j6, j7, j8, j9, j10, j11, j12, j13, j14, j15, 8, (by & 8) != 0)


@jit
def _row_xor(acc):
    """XOR of each accumulator row across the block's columns: (BM,) uint32.

    A reduction along the column axis only: in-thread XORs and warp shuffles (plus a few words
    through shared memory where warps split the columns); the accumulator keeps its MMA layout.
    """
    return tl.reduce(acc.to(tl.uint32, bitcast=True), 1, xor_combine)


@jit
def split_limb(rest):
    """(low, rest') with rest = low + 256·rest' and low a signed int8 digit in [−128, 127]."""
    low = ((rest + 128) & 255) - 128
    return low.to(tl.int8), (rest - low) >> 8


@jit
def minus_rank_term(result, rest, ub):
    """result − rest·ubᵀ in wrapping int32: rest (BM × r) int32 split into three signed base-256
    int8 limbs (|rest| < 2^23), one int8 dot with ub (BN × r) each. Shared by the stacked peel
    and the lagged CuTe pass's served-row peel."""
    for limb in tl.static_range(3):
        low, rest = split_limb(rest)
        product = tl.dot(low, tl.trans(ub), tl.full(result.shape, 0, tl.int32), out_dtype=tl.int32)
        result -= product * (1 << (8 * limb))
    return result


@jit
def _tile_rows(words, BM: tl.constexpr, H: tl.constexpr):
    """A tile's transcript word from its H rows' words: (BM,) → (BM/H,) by XOR.

    Folding (rotl13, XOR) is linear over XOR, so XOR-combining the rows' finished transcripts
    equals the transcript of the rows' XOR at every chunk.
    """
    return tl.reduce(tl.reshape(words, (BM // H, H)), 1, xor_combine)


@jit
def _mined_gemm_kernel(an_ptr, ac_ptr, bt_ptr, apb_ptr, ub_ptr, key_ptr, bound_ptr, mvalid_ptr,
                       record_ptr, sa_ptr, sb_ptr, out_ptr, out32_ptr, dump_ptr, phase_ptr, phase_words,
                       M, N, K, NC,
                       R: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                       H: tl.constexpr, MINE: tl.constexpr, PEEL: tl.constexpr,
                       WRITE_I32: tl.constexpr, DUMP: tl.constexpr, PHASED: tl.constexpr,
                       WRITE_BF16: tl.constexpr, WAIT_APB: tl.constexpr = 0, DEPENDENTS: tl.constexpr = 0):
    """PHASED: an_ptr, key_ptr (s_A) and mvalid_ptr are set 0 of a LagPhase pair; the program
    reads the READY set (the shift is applied twice, before the k loop and in the epilogue, so no
    extra pointer lives across the loop). WRITE_BF16 = 0 writes only the int32 result (the raw
    A'·B' for the split peel, or Q for it). WAIT_APB: launched as the programmatic dependent of the
    A·P_B kernel, so apb is read only after waiting for that kernel's end (`mined_gemm(after_apb=)`).
    DEPENDENTS: the next kernel (the winner snapshot, which waits for this one's end before reading)
    may be dispatched as soon as every program has started, so it is resident when the GEMM ends."""
    if DEPENDENTS:
        gdc_launch_dependents()
    an_ptr += lag_set(phase_ptr, PHASED, 0) * (4 * phase_words)
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
    zero = tl.full((BM,), 0, tl.uint32)  # per-row transcripts; a tile = H rows × the block's BN columns
    j0, j1, j2, j3, j4, j5, j6, j7 = zero, zero, zero, zero, zero, zero, zero, zero
    j8, j9, j10, j11, j12, j13, j14, j15 = zero, zero, zero, zero, zero, zero, zero, zero
    steps_per_chunk = R // BK
    mined_steps = NC * steps_per_chunk
    for step in range(0, K // BK):
        kk = step * BK + rk
        b = tl.load(bt_ptr + b_rows[:, None] + kk[None, :])
        a = tl.load(an_ptr + a_rows[:, None] + kk[None, :])
        acc = tl.dot(a, tl.trans(b), acc, out_dtype=tl.int32)
        if PEEL:  # the clean rows through the same B' tile
            a_clean = tl.load(ac_ptr + a_rows[:, None] + kk[None, :])
            acc_clean = tl.dot(a_clean, tl.trans(b), acc_clean, out_dtype=tl.int32)
        if MINE:
            if ((step + 1) % steps_per_chunk == 0) & (step < mined_steps):
                j0, j1, j2, j3, j4, j5, j6, j7, j8, j9, j10, j11, j12, j13, j14, j15 = _fold(
                    j0, j1, j2, j3, j4, j5, j6, j7, j8, j9, j10, j11, j12, j13, j14, j15, _row_xor(acc))
    if MINE:  # tickets before the peel: the transcript words are dead when the peel needs registers
        j0, j1, j2, j3, j4, j5, j6, j7, j8, j9, j10, j11, j12, j13, j14, j15 = _unrotate(
            j0, j1, j2, j3, j4, j5, j6, j7, j8, j9, j10, j11, j12, j13, j14, j15, NC)
        t0, t1, t2, t3 = _tile_rows(j0, BM, H), _tile_rows(j1, BM, H), _tile_rows(j2, BM, H), _tile_rows(j3, BM, H)
        t4, t5, t6, t7 = _tile_rows(j4, BM, H), _tile_rows(j5, BM, H), _tile_rows(j6, BM, H), _tile_rows(j7, BM, H)
        t8, t9, t10, t11 = _tile_rows(j8, BM, H), _tile_rows(j9, BM, H), _tile_rows(j10, BM, H), _tile_rows(j11, BM, H)
        t12, t13, t14, t15 = (_tile_rows(j12, BM, H), _tile_rows(j13, BM, H), _tile_rows(j14, BM, H),
                              _tile_rows(j15, BM, H))
        ready_words = lag_set(phase_ptr, PHASED, 0) * phase_words
        tiles_n = N // BN
        tr = pid_m * (BM // H) + tl.arange(0, BM // H)
        eligible = (tr + 1) * H <= tl.load(mvalid_ptr + ready_words + e)
        linear = tr * tiles_n + pid_n
        c0, c1, c2, c3, c4, c5, c6, c7 = draw_and_claim(
            t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13, t14, t15,
            key_ptr + ready_words + e * 8, bound_ptr, eligible, linear, tiles_n, e, record_ptr, H, BN,
            False)  # rounds rolled: unrolled, the decode GEMM spilled 16 bytes (sm_90 cubin)
        if DUMP:
            store_dump(dump_ptr + ((e * (M // H) * tiles_n + linear.to(tl.int64)) * 24),
                       t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13, t14, t15,
                       c0, c1, c2, c3, c4, c5, c6, c7, tr >= 0)
    if PEEL:  # A·B' from the second accumulator
        if WAIT_APB:
            gdc_wait()
        result = acc_clean
        # − (A·P_B)·U_Bᵀ; A·P_B (int32) is split here into three signed base-256 int8 limbs
        # (|A·P_B| ≤ 64·k ≤ 2^22, so the top limb stays within ±65).
        ub_rows = (e * N + rn).to(tl.int64) * R
        apb_rows = (e * M + rm).to(tl.int64) * R
        for rr in range(0, R // BK):
            kr = rr * BK + rk
            ub = tl.load(ub_ptr + ub_rows[:, None] + kr[None, :])
            result = minus_rank_term(result, tl.load(apb_ptr + apb_rows[:, None] + kr[None, :]), ub)
    else:
        result = acc
    out_offsets = (e * M + rm).to(tl.int64)[:, None] * N + rn[None, :]
    if WRITE_I32:
        tl.store(out32_ptr + out_offsets, result)
    if WRITE_BF16:
        scale_a = tl.load(sa_ptr + e * M + rm)
        scale_b = tl.load(sb_ptr + e * N + rn)
        value = result.to(tl.float32) * scale_a[:, None] * scale_b[None, :]
        tl.store(out_ptr + out_offsets, value.to(tl.bfloat16))


def lottery_tile(n: int, k: int, rank: int, *, moe: bool = False) -> tuple[int, int]:
    """The lottery tile (h, w) for N output columns (per expert): h = 2 rows × w = the program's
    block width.

    w is the widest of 128, 64, 32, 16 that divides N and keeps the protocol's limits
    (h·w ≤ 256, (h + w)·D ≤ 2^22 with D = k − k mod r; MoE: fewer than N opened columns);
    2 × 128 = 256 cells is the protocol maximum, the fewest BLAKE3 compressions per output.
    """
    d = k - k % rank
    for w in TILE_WIDTHS:
        if n % w == 0 and (TILE_H + w) * d <= MAX_WORKER_INPUT and not (moe and w >= n):
            return TILE_H, w
    raise MinedGemmError(f"no lottery tile of width {'/'.join(map(str, TILE_WIDTHS))} fits N={n}, "
                         f"K={k}, rank={rank}")


def default_tiling(m: int, n: int, k: int, rank: int, tile_h: int = TILE_H,
                   tile_w: int | None = None) -> Tiling:
    """Decode (few rows per instance): 16-row blocks, 2 warps, 4 stages; prefill: 64-row blocks,
    4 warps, 3 stages; k steps of 128 or 64 — the fastest whole mined pass measured on the H200
    (docs/kernels-int7.md: decode w2s4 beat w4s4 and a 160-register cap on GLM-5, DeepSeek-V3 and
    Qwen3; prefill w4s3 beat w8s3 by 28–30 % despite a small epilogue spill).

    block_n is the lottery tile width when mining (the widest of 128..16 dividing N otherwise);
    block_m the largest option dividing M that holds whole tile rows. _check_tiling names what
    does not fit when none does.
    """
    def largest(extent: int, options: tuple[int, ...], multiple: int) -> int:
        return next((b for b in options if extent % b == 0 and b % multiple == 0), options[-1])

    block_k = 128 if rank % 128 == 0 and k % 128 == 0 else 64
    block_n = tile_w if tile_w is not None else largest(n, TILE_WIDTHS, 1)
    if m <= 32:
        return Tiling(largest(m, (16, 32), tile_h), block_n, block_k, num_warps=2, num_stages=4)
    return Tiling(largest(m, (64, 32, 16), tile_h), block_n, block_k, num_warps=4, num_stages=3)


def check_operand(name: str, t: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    """A kernel operand's shape, dtype and contiguity, named in the error (the kernels take raw
    pointers, so a wrong view would be read as garbage)."""
    if tuple(t.shape) != shape or t.dtype != dtype or not t.is_contiguous():
        raise MinedGemmError(f"{name} must be contiguous {dtype} {shape}, got {t.dtype} "
                             f"{tuple(t.shape)}{'' if t.is_contiguous() else ' (not contiguous)'}")


def check_lag(lag: LagPhase) -> None:
    """The phase word, and a set distance that keeps set 1 as aligned as set 0."""
    check_operand("lag.phase", lag.phase, (1,), torch.int32)
    if lag.words <= 0 or lag.words % 16:
        raise MinedGemmError(f"lag.words must be a positive multiple of 16, got {lag.words}")


def _check_tiling(tiling: Tiling, m: int, n: int, k: int, rank: int,
                  tile: tuple[int, int] | None) -> None:
    """Block shape against the problem; when mining, the tile (h, w) against the block."""
    bm, bn, bk = tiling.block_m, tiling.block_n, tiling.block_k
    problems = [(m % bm, f"M={m} is not a multiple of block_m={bm}"),
                (n % bn, f"N={n} is not a multiple of block_n={bn}"),
                (k % bk, f"K={k} is not a multiple of block_k={bk}"),
                (rank % bk, f"rank={rank} is not a multiple of block_k={bk}")]
    if tile is not None:
        h, w = tile
        problems += [(w != bn, f"the tile width {w} must equal block_n={bn} (a tile spans the block)"),
                     (h % 2 or bm % h, f"the tile height {h} must be even and divide block_m={bm}")]
    for bad, message in problems:
        if bad:
            raise MinedGemmError(message)


def mined_gemm(a_noised: torch.Tensor, a_clean: torch.Tensor | None, bt_noised: torch.Tensor,
               apb: torch.Tensor | None, u_b: torch.Tensor | None, s_a: torch.Tensor,
               bound_words: torch.Tensor, rows_valid: torch.Tensor, record: torch.Tensor,
               scale_a: torch.Tensor | None, scale_b: torch.Tensor | None, *, rank: int, tile_h: int,
               tile_w: int, out: torch.Tensor | None, out_i32: torch.Tensor | None = None,
               dump: torch.Tensor | None = None, tiling: Tiling | None = None,
               peel: bool = True, lag: LagPhase | None = None, after_apb: bool = False) -> None:
    """Mined GEMM of E instances: out[e] = dequant(A_e·B_e) from the noised operands.

    a_noised/a_clean: (E, M, K) int8 (A' and A); bt_noised: (E, N, K) int8 (B'ᵀ); apb:
    (E, M, r) int32 A·P_B; u_b: (E, N, r) int8; s_a: (E, 8) int32 ticket keys;
    bound_words: (8,) int32 LE words of the bound; rows_valid: (E,) int32 rows that may hold
    lottery tiles (a multiple of tile_h); record: (16,) int32, [0] = 0 arms it; scale_a (E, M)
    and scale_b (E, N) float32; out (E, M, N) bf16 or None (then out_i32 is the only output);
    out_i32 optional exact A·B; dump optional
    (E, M/h, N/w, 24) int32 per-tile transcript words and tickets (for checks). Lottery tiles are
    tile_h rows × tile_w = block_n columns. peel=False skips the peel (the output is then
    A'·B', which `split_peel` peels in its own pass at prefill; a_clean, apb and u_b are then
    unread and may be None, as scale_a and scale_b may be without `out`). lag: a_noised, s_a and rows_valid are set 0
    of a LagPhase pair and the kernel reads the READY set (pipeline.MinedPass(lagged=True)).
    after_apb: the caller's last launch on this stream was the A·P_B that wrote apb and nothing
    else (`activations.prepare_rows`); the GEMM then starts beside it (programmatic dependent
    launch, sm_90) and waits for it only where the peel reads apb, so the weight stream is not
    held back by A·P_B. Every other operand must be complete before that A·P_B launch.
    """
    e, m, k = a_noised.shape
    n = bt_noised.shape[1]
    check_operand("a_noised", a_noised, (e, m, k), torch.int8)
    check_operand("bt_noised", bt_noised, (e, n, k), torch.int8)
    if peel:
        check_operand("a_clean", a_clean, (e, m, k), torch.int8)
        check_operand("apb", apb, (e, m, rank), torch.int32)
        check_operand("u_b", u_b, (e, n, rank), torch.int8)
    check_operand("s_a", s_a, (e, 8), torch.int32)
    check_operand("bound_words", bound_words, (8,), torch.int32)
    check_operand("rows_valid", rows_valid, (e,), torch.int32)
    check_operand("record", record, (RECORD_WORDS,), torch.int32)
    if out is not None:
        check_operand("scale_a", scale_a, (e, m), torch.float32)
        check_operand("scale_b", scale_b, (e, n), torch.float32)
    _check_outputs(out, out_i32, (e, m, n))
    if dump is not None:
        check_operand("dump", dump, (e, m // tile_h, n // tile_w, DUMP_WORDS), torch.int32)
    if lag is not None:
        check_lag(lag)
    tiling = tiling or default_tiling(m, n, k, rank, tile_h, tile_w)
    _check_tiling(tiling, m, n, k, rank, (tile_h, tile_w))
    grid = (n // tiling.block_n, m // tiling.block_m, e)
    overlap = after_apb and peel and pdl_enabled()
    _mined_gemm_kernel[grid](
        a_noised, _either(a_clean, a_noised), bt_noised, _either(apb, s_a), _either(u_b, a_noised), s_a,
        bound_words, rows_valid, record, _either(scale_a, record), _either(scale_b, record),
        _either(out, out_i32), _either(out_i32, out), _either(dump, out_i32, out),
        rows_valid if lag is None else lag.phase, 0 if lag is None else lag.words,
        m, n, k, k // rank,
        R=rank, BM=tiling.block_m, BN=tiling.block_n, BK=tiling.block_k, H=tile_h,
        MINE=1, PEEL=int(peel), WRITE_I32=int(out_i32 is not None), DUMP=int(dump is not None),
        PHASED=int(lag is not None), WRITE_BF16=int(out is not None), WAIT_APB=int(overlap),
        DEPENDENTS=int(pdl_enabled()),
        num_warps=tiling.num_warps, num_stages=tiling.num_stages, **pdl_launch(overlap))


def plain_gemm(a: torch.Tensor, bt: torch.Tensor, scale_a: torch.Tensor | None,
               scale_b: torch.Tensor | None, *, out: torch.Tensor | None,
               out_i32: torch.Tensor | None = None, tiling: Tiling | None = None) -> None:
    """The same kernel without mining or peel: out[e] = dequant(A_e·B_eᵀ) — the unmined baseline.
    out None: only the exact out_i32 = A_e·B_eᵀ (the split peel's Qᵀ = B'·P_A); the scales are
    then unused and may be None."""
    e, m, k = a.shape
    n = bt.shape[1]
    check_operand("a", a, (e, m, k), torch.int8)
    check_operand("bt", bt, (e, n, k), torch.int8)
    if out is not None:
        check_operand("scale_a", scale_a, (e, m), torch.float32)
        check_operand("scale_b", scale_b, (e, n), torch.float32)
    _check_outputs(out, out_i32, (e, m, n))
    tiling = tiling or default_tiling(m, n, k, 128)
    _check_tiling(tiling, m, n, k, tiling.block_k, None)
    grid = (n // tiling.block_n, m // tiling.block_m, e)
    first = _either(out, out_i32)
    _mined_gemm_kernel[grid](
        a, a, bt, a, a, a, a, a, a, _either(scale_a, first), _either(scale_b, first), first,
        _either(out_i32, out), first, a, 0,
        m, n, k, 0,
        R=tiling.block_k, BM=tiling.block_m, BN=tiling.block_n, BK=tiling.block_k, H=2,
        MINE=0, PEEL=0, WRITE_I32=int(out_i32 is not None), DUMP=0, PHASED=0, WRITE_BF16=int(out is not None),
        num_warps=tiling.num_warps, num_stages=tiling.num_stages)


def _check_outputs(out: torch.Tensor | None, out_i32: torch.Tensor | None, shape: tuple[int, ...]) -> None:
    """The bf16 output and/or the int32 one; at least one (a kernel that writes nothing is a mistake)."""
    if out is None and out_i32 is None:
        raise MinedGemmError("give out (bf16), out_i32 (int32) or both: nothing would be written")
    if out is not None:
        check_operand("out", out, shape, torch.bfloat16)
    if out_i32 is not None:
        check_operand("out_i32", out_i32, shape, torch.int32)


def _either(*tensors: torch.Tensor | None) -> torch.Tensor:
    """The first tensor given: a pointer argument the kernel does not touch under its flags still
    needs a tensor."""
    return next(t for t in tensors if t is not None)
