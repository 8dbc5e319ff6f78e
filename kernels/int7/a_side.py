"""The per-launch A side of a dense pass with few rows per instance (decode), fused after the
quantisation: same-launch, two kernels (commitment + seed, then noise + A' + A·P_B); lagged, one
kernel (commitment + seed + noise + A', no A·P_B).

The staged A side is eight dependent launches (quantise, zero, A·P_B, chunk hashing, tree levels,
seeds, PRNG, noised A), each paying launch latency and a pass over memory; at decode every one of
them is latency-bound (16 rows per instance). Here:

1. `_commit_seed_kernel`, one program per instance: keyed BLAKE3 of the instance's int7 rows
   (a lane per 1024-byte chunk), the parent levels up to the root (CTA barriers between levels),
   then the seed chain s_A = BLAKE3(s_B ‖ hA') with V3 salting; it also zeroes the instance's
   A·P_B rows for step 2's partial sums. The hashing is a chain of ~16 + log2(chunks) dependent
   compressions whichever way it is spread, so one program per instance costs no latency and
   needs no launch between the leaves and the tree.
2. `_noise_apply_kernel`, a program per (instance, column block): the PRNG blocks of the sparse
   factor P_A for its columns and of U_A (recomputed by each program of the instance into its own
   scratch copy: one parallel round of compressions, no cross-program dependency), a CTA barrier,
   then A' = A + U_A·P_Aᵀ for its rows × columns and its k-slice of A·P_B (tensor cores, int32
   atomics into the rows zeroed by step 1).

`noised_a_side`, the lagged pass's side chain (pipeline.MinedPass(lagged=True)), is s_A and A'
without A·P_B in ONE kernel, `_side_chain_kernel`, `split` programs per instance: the first does
step 1's hashing and seed and hands s_A to the others inside the kernel (`_hand_off`), then each
takes its share of the columns for step 2's factors and A'. As one launch it is dispatched whole
before the serving stream's GEMM fills the machine (a second launch would queue behind the GEMM's
programs: docs/kernels-int7.md, "Lagged mining"). Both paths share `_commit_seed` (hash + seed of
one instance) and `_noise_columns` (factors of a column range, barrier, A' over it).

The tree levels of A are not kept for openings: a winner's A is retained by the winner slot and
re-hashed on the host (pipeline.MinedPass._build_proof); they live in a scratch buffer here.
Every device function is shared with the staged kernels (chunk_chaining_value, upper_levels,
seed_chain, prng_block, store_sparse/store_uniform, noised_rows, apb_partial).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from proof.int7.noise import LABEL_A
from proof.int7.seeds import SEED_SALT_A

from kernels.triton_jit import jit
from .activations import apb_partial
from .mined_gemm import LagPhase, check_lag, lag_set
from .blake3 import (chunk_chaining_value, constant_words, level_counts, load_words8,
                     store_words8, upper_levels)
from .noise import noised_rows, prng_block, store_sparse, store_uniform
from .seeds import seed_chain

FUSED_ROWS = (16, 32, 64)  # rows per instance the fused A side takes (power-of-two tiles)
_LANES = 128  # chunks / PRNG blocks per round: one per thread of 4 warps
_ZERO_BLOCK = 1024
_BLOCK_BYTES = 8192  # rows × columns of a step-2 program (the noised kernel's 16 × 512)
_APPLY_WARPS = 8
_APPLY_STAGES = 3  # the A·P_B k loop's pipelining depth
# The lagged side chain (one program per instance, a PRNG block / chunk per thread, 32 bytes of
# A' per thread per column step): 4 warps at 80 registers (10 K) still fit on an SM beside three
# decode GEMM programs (3 × 16 K of its 64 K registers), 8 warps (20 K) evict one of them
# (docs/kernels-int7.md, "Side chain footprint"). SIDE_WARPS_CHOICES are what noised_a_side takes.
SIDE_WARPS = 4
SIDE_WARPS_CHOICES = (2, 4, 8)
# The side chain's programs in all (noised_a_side(split=) = this // E, 1..MAX_SIDE_SPLIT): on the
# H200 (lagged pass, µs, split 1/2/4/8) GLM-5 decode (E 32) 257/251/278/281, DeepSeek-V3 (32)
# 291/291/316/314, Qwen3 (16) 118/99/97/115 — 64 programs was best at both E.
SIDE_PROGRAMS = 64
MAX_SIDE_SPLIT = 4
_SIDE_STEP_BYTES_PER_THREAD = 32
_SIDE_REGISTER_BUDGET = 16384  # what three decode GEMM programs (2 warps × 256) leave of 64 K


class ASideError(ValueError):
    """Bad input to the fused A side."""


@jit
def _commit_seed(q_ptr, key_ptr, sb_ptr, salt_ptr, nodes_ptr, sa_ptr, inst, words_per_instance, chunks,
                 nodes_per_instance, dim, SALTED: tl.constexpr, LANES: tl.constexpr):
    """Instance `inst`: hash its int7 rows to the root (a lane per chunk, CTA barriers between
    levels; the tree lives in nodes_ptr's scratch) and store s_A at sa_ptr + 8·inst."""
    lane = tl.arange(0, LANES).to(tl.int64)
    every = lane >= 0
    k0, k1, k2, k3, k4, k5, k6, k7 = load_words8(key_ptr + lane * 0, every)
    nodes = nodes_ptr + inst * nodes_per_instance * 8  # leaves, then the parent levels, root last
    last_flags = tl.where(chunks == 1, 8, 0)  # ROOT on a one-chunk tree's leaf
    for first_chunk in range(0, chunks, LANES):
        chunk = first_chunk + lane
        live = chunk < chunks
        c0, c1, c2, c3, c4, c5, c6, c7 = chunk_chaining_value(
            q_ptr + inst * words_per_instance, chunk, words_per_instance, live,
            k0, k1, k2, k3, k4, k5, k6, k7, last_flags, LANES, False)  # decode: a dozen variants to compile
        store_words8(nodes + chunk * 8, c0, c1, c2, c3, c4, c5, c6, c7, live)
    tl.debug_barrier()
    upper_levels(nodes, nodes + chunks * 8, chunks, lane, k0, k1, k2, k3, k4, k5, k6, k7, LANES)
    h0, h1, h2, h3, h4, h5, h6, h7 = load_words8(nodes + (nodes_per_instance - 1) * 8 + lane * 0, every)
    p0, p1, p2, p3, p4, p5, p6, p7 = load_words8(sb_ptr + inst * 8 + lane * 0, every)
    s0, s1, s2, s3, s4, s5, s6, s7 = seed_chain(
        p0, p1, p2, p3, p4, p5, p6, p7, h0, h1, h2, h3, h4, h5, h6, h7, salt_ptr, dim,
        salt_ptr, salt_ptr, SALTED, 0)
    store_words8(sa_ptr + inst * 8 + lane * 0, s0, s1, s2, s3, s4, s5, s6, s7, lane == 0)


@jit
def _noise_columns(q_ptr, sa_ptr, label_ptr, u_ptr, first_ptr, second_ptr, out_ptr, inst, c_begin,
                   c_end, K, u_blocks, R: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr,
                   LANES: tl.constexpr, copy_ptr=None, COPY: tl.constexpr = 0, STAGES: tl.constexpr = 1):
    """Instance `inst`, columns [c_begin, c_end) (a multiple of 8 wide): the PRNG blocks of P_A
    there and of U_A (into this program's scratch: U_A transposed, (R, BR), at u_ptr, so A' reads
    a column of it as one vector; P_A in the instance's K-long first/second), a CTA barrier,
    then A' over its BR rows × those columns in BC-wide steps
    (COPY: the clean rows also to copy_ptr, laid out like q; STAGES 2: the next step's index
    vectors and x are prefetched (cp.async) while this step gathers U)."""
    lane = tl.arange(0, LANES)
    first_inst = first_ptr + inst * K
    second_inst = second_ptr + inst * K
    p_blocks = (c_end - c_begin) // 8
    for b0 in range(0, p_blocks + u_blocks, LANES):
        b = b0 + lane
        live = b < p_blocks + u_blocks
        sparse = b < p_blocks
        block = tl.where(sparse, c_begin // 8 + b, b - p_blocks).to(tl.int64)
        w0, w1, w2, w3, w4, w5, w6, w7 = prng_block(sa_ptr + inst * 8 + lane * 0, label_ptr, block + 1,
                                                     sparse, live)
        store_sparse(first_inst, second_inst, block, K, R, live & sparse, w0, w1, w2, w3, w4, w5, w6, w7)
        store_uniform(u_ptr, block, BR * R, live & (b >= p_blocks), w0, w1, w2, w3, w4, w5, w6, w7, R, BR)
    tl.debug_barrier()  # the factors this program wrote are read back by its other threads
    rows = tl.arange(0, BR).to(tl.int64)
    for c0 in tl.range(c_begin, c_end, BC, num_stages=STAGES):
        ks = c0 + tl.arange(0, BC)
        noised_rows(q_ptr + inst * BR * K, u_ptr, first_inst, second_inst, out_ptr + inst * BR * K, rows,
                    ks, ks < K, K, R, copy_ptr + inst * BR * K, COPY, BR)


@jit
def _commit_seed_kernel(q_ptr, key_ptr, sb_ptr, salt_ptr, nodes_ptr, sa_ptr, apb_ptr,
                        words_per_instance, chunks, nodes_per_instance, dim, apb_per_instance,
                        SALTED: tl.constexpr, LANES: tl.constexpr, ZERO_BLOCK: tl.constexpr):
    """Same-launch launch 1, instance `program_id`: zero its A·P_B rows, then `_commit_seed`."""
    inst = tl.program_id(0).to(tl.int64)
    zeros = tl.arange(0, ZERO_BLOCK)
    for z0 in range(0, apb_per_instance, ZERO_BLOCK):
        at = z0 + zeros
        tl.store(apb_ptr + inst * apb_per_instance + at, tl.full((ZERO_BLOCK,), 0, tl.int32),
                 mask=at < apb_per_instance)
    _commit_seed(q_ptr, key_ptr, sb_ptr, salt_ptr, nodes_ptr, sa_ptr, inst, words_per_instance, chunks,
                 nodes_per_instance, dim, SALTED, LANES)


@jit
def _noise_apply_kernel(q_ptr, sa_ptr, label_ptr, u_ptr, first_ptr, second_ptr, out_ptr, pb_ptr,
                        apb_ptr, K, u_blocks, column_blocks,
                        R: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
                        LANES: tl.constexpr):
    """Same-launch launch 2, instance program_id(0), columns [BC·program_id(1), +BC): P_A there
    and U_A (into this program's own U_A copy), A', then the k-slice of A·P_B (pb_ptr: P_B
    K-major, (E, R, K))."""
    inst = tl.program_id(0).to(tl.int64)
    c_begin = tl.program_id(1) * BC
    u_own = u_ptr + (inst * column_blocks + tl.program_id(1)) * (BR * R)
    _noise_columns(q_ptr, sa_ptr, label_ptr, u_own, first_ptr, second_ptr, out_ptr, inst, c_begin,
                   c_begin + BC, K, u_blocks, R, BR, BC, LANES, out_ptr, 0)
    rows = tl.arange(0, BR).to(tl.int64)
    ts = tl.arange(0, R)
    steps = (tl.minimum(K, c_begin + BC) - c_begin) // BK
    acc = apb_partial(q_ptr + inst * BR * K, pb_ptr + inst * K * R, rows, ts, c_begin, steps, K, R, BK,
                      1)  # P_B K-major ((R, K) per instance), as the job stores it
    tl.atomic_add(apb_ptr + inst * BR * R + rows[:, None] * R + ts[None, :], acc,
                  sem="relaxed")  # ordered by the kernel boundary


@jit
def _hand_off(sync_ptr, inst, part, experts, SPLIT: tl.constexpr):
    """Part 0 of an instance has stored s_A; parts 1.. wait for it. sync_ptr: (2, experts) int32,
    zero between launches (flag, then count): part 0 raises the flag with release semantics, the
    others spin on it with acquire loads (one thread, then a CTA barrier, as CUTLASS's semaphore
    does); the last part through resets both, so the next launch finds zeros without a memset.
    No deadlock: part 0 has the lowest program index of its instance, so it is dispatched first
    and never waits (the interpreter runs programs in index order, so it never spins)."""
    flag = sync_ptr + inst
    count = sync_ptr + experts + inst
    tl.debug_barrier()  # s_A (stored by one lane) before the release
    if part == 0:
        tl.atomic_xchg(flag, 1, sem="release")
    else:
        while tl.atomic_add(flag, 0, sem="acquire") == 0:
            pass
    tl.debug_barrier()  # every thread reads s_A after the acquire
    if tl.atomic_add(count, 1, sem="relaxed") == SPLIT - 1:
        tl.atomic_xchg(flag, 0, sem="relaxed")
        tl.atomic_xchg(count, 0, sem="relaxed")


@jit
def _side_chain_kernel(q_words_ptr, q_ptr, key_ptr, sb_ptr, salt_ptr, nodes_ptr, sa_ptr, label_ptr,
                       u_ptr, first_ptr, second_ptr, out_ptr, copy_ptr, valid_ptr, valid_rows,
                       words_per_instance, chunks, nodes_per_instance, K, u_blocks, phase_ptr, phase_words,
                       sync_ptr, experts, part_steps,
                       SALTED: tl.constexpr, R: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr,
                       LANES: tl.constexpr, COPY: tl.constexpr, MARK: tl.constexpr, PHASED: tl.constexpr,
                       SPLIT: tl.constexpr = 1):
    """The lagged pass's whole side chain of instance program_id // SPLIT (q_words_ptr: the int7
    rows as words for the hash, q_ptr: the same rows as bytes): part 0 (program_id mod SPLIT)
    computes the commitment and s_A, then every part — after `_hand_off` when SPLIT > 1, a CTA
    barrier otherwise (s_A is read back as the PRNG key by every thread) — takes its
    part_steps·BC columns: their P_A, its own copy of U_A, and A' there in BC-wide steps.
    COPY: the clean rows also to copy_ptr; MARK: valid_rows to valid_ptr[inst] (the lagged
    state's row count), so neither needs a copy launch behind it. PHASED: out_ptr, sa_ptr,
    copy_ptr and valid_ptr are set 0 of a LagPhase pair; the chain writes the PENDING set (the
    one this launch's GEMM does not read)."""
    pending = lag_set(phase_ptr, PHASED, 1) * phase_words
    out_ptr += 4 * pending
    copy_ptr += 4 * pending
    sa_ptr += pending
    valid_ptr += pending
    inst = (tl.program_id(0) // SPLIT).to(tl.int64)
    part = tl.program_id(0) % SPLIT
    if part == 0:
        _commit_seed(q_words_ptr, key_ptr, sb_ptr, salt_ptr, nodes_ptr, sa_ptr, inst, words_per_instance,
                     chunks, nodes_per_instance, BR, SALTED, LANES)
        if MARK:
            tl.store(valid_ptr + inst, valid_rows)
    if SPLIT > 1:
        _hand_off(sync_ptr, inst, part, experts, SPLIT)
    else:
        tl.debug_barrier()
    c_begin = tl.minimum(part * part_steps * BC, K)  # a multiple of BC: the JIT keeps 16-byte vectors
    _noise_columns(q_ptr, sa_ptr, label_ptr, u_ptr + (inst * SPLIT + part) * (BR * R), first_ptr, second_ptr,
                   out_ptr, inst, c_begin, tl.minimum(c_begin + part_steps * BC, K), K, u_blocks, R, BR, BC, LANES,
                   copy_ptr, COPY, 2)


def fused_applies(rows: int, k: int, rank: int) -> bool:
    """Whether `fused_a_side` takes this shape: a power-of-two row count of FUSED_ROWS, K a
    multiple of 64 and a power-of-two rank of at most 256 (the A·P_B accumulator's width)."""
    return rows in FUSED_ROWS and k % 64 == 0 and k > 0 and rank in (32, 64, 128, 256)


def _check_inputs(q: torch.Tensor, s_b: torch.Tensor, key_words: torch.Tensor, rank: int) -> None:
    if q.dtype != torch.int8 or q.dim() != 3 or not q.is_contiguous():
        raise ASideError(f"q must be contiguous int8 (E, M, K), got {q.dtype} {tuple(q.shape)}")
    experts, rows, k = q.shape
    if not fused_applies(rows, k, rank):
        raise ASideError(f"the fused A side takes M in {FUSED_ROWS}, K a positive multiple of 64 and "
                         f"rank 32..256 (power of two); got M={rows}, K={k}, rank={rank}")
    _check_tensor("s_b", s_b, (experts, 8), torch.int32)
    _check_tensor("key_words", key_words, (1, 8), torch.int32)


def _check_tensor(name: str, t: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    if tuple(t.shape) != shape or t.dtype != dtype:
        raise ASideError(f"{name} must be {dtype} {shape}, got {t.dtype} {tuple(t.shape)}")


def _tree_scratch(q: torch.Tensor) -> tuple[torch.Tensor, dict[str, int]]:
    """The per-instance node scratch of q's trees and the hashing's size arguments."""
    experts, rows, k = q.shape
    nbytes = rows * k
    node_count = sum(level_counts(nbytes)) + 1  # leaves, parent levels, the root (a lone leaf: 1)
    nodes = torch.empty((experts, node_count, 8), dtype=torch.int32, device=q.device)
    return nodes, {"words_per_instance": nbytes // 4, "chunks": triton.cdiv(nbytes, 1024),
                   "nodes_per_instance": node_count}


def _commit_seed_launch(q: torch.Tensor, s_b: torch.Tensor, key_words: torch.Tensor, s_a: torch.Tensor,
                        apb: torch.Tensor, salted: bool) -> None:
    """Same-launch launch 1: s_A of every instance into `s_a`; zeroes `apb` for launch 2's sums."""
    experts, rows, _ = q.shape
    nodes, sizes = _tree_scratch(q)
    _commit_seed_kernel[(experts,)](
        q.view(torch.int32), key_words.contiguous(), s_b.contiguous(), constant_words(SEED_SALT_A, q.device),
        nodes, s_a, apb, sizes["words_per_instance"], sizes["chunks"], sizes["nodes_per_instance"], rows,
        apb[0].numel(), SALTED=int(salted), LANES=_LANES, ZERO_BLOCK=_ZERO_BLOCK)


def _noise_apply_launch(q: torch.Tensor, s_a: torch.Tensor, a_noised: torch.Tensor, rank: int,
                        p_b: torch.Tensor, apb: torch.Tensor) -> None:
    """Same-launch launch 2: A' into `a_noised` and the A·P_B partial sums into `apb`."""
    experts, rows, k = q.shape
    device = q.device
    block_cols = _BLOCK_BYTES // rows
    column_blocks = triton.cdiv(k, block_cols)
    uniform = torch.empty((experts, column_blocks, rank, rows), dtype=torch.int8, device=device)  # U_Aᵀ
    first = torch.empty((experts, k), dtype=torch.int32, device=device)
    second = torch.empty_like(first)
    p_b_kmajor = p_b.transpose(1, 2).contiguous()  # no copy for the job's P_B
    _noise_apply_kernel[(experts, column_blocks)](
        q, s_a, constant_words(LABEL_A, device), uniform, first, second, a_noised, p_b_kmajor, apb, k,
        rows * rank // 32, column_blocks, R=rank, BR=rows, BC=block_cols, BK=128 if k % 128 == 0 else 64,
        LANES=_LANES, num_warps=_APPLY_WARPS, num_stages=_APPLY_STAGES)


def fused_a_side(q: torch.Tensor, s_b: torch.Tensor, key_words: torch.Tensor, p_b: torch.Tensor, *,
                 rank: int, salted: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(A', A·P_B, s_A) of E dense instances from their int7 codes q (E, M, K) int8, s_B (E, 8),
    the job key (1, 8) and the job's dense P_B (E, K, r) int8: two launches, no host syncs.
    The kernel reads P_B K-major: the job's P_B (a transposed view of K-contiguous storage,
    `noise.dense_sparse_factor`) is read in place; any other layout is copied first."""
    _check_inputs(q, s_b, key_words, rank)
    experts, rows, k = q.shape
    _check_tensor("p_b", p_b, (experts, k, rank), torch.int8)
    s_a = torch.empty((experts, 8), dtype=torch.int32, device=q.device)
    apb = torch.empty((experts, rows, rank), dtype=torch.int32, device=q.device)
    a_noised = torch.empty_like(q)
    _commit_seed_launch(q, s_b, key_words, s_a, apb, salted)
    _noise_apply_launch(q, s_a, a_noised, rank, p_b, apb)
    return a_noised, apb, s_a


def side_chain_split(experts: int) -> int:
    """Programs per instance of the lagged side chain: about SIDE_PROGRAMS in all, at most
    MAX_SIDE_SPLIT (more split the columns finer than the hash part they wait for)."""
    return max(1, min(MAX_SIDE_SPLIT, SIDE_PROGRAMS // max(experts, 1)))


def check_side_chain(warps: int, split: int) -> None:
    """The side chain's launch shape: `warps` one of SIDE_WARPS_CHOICES, `split` ≥ 1 programs an
    instance (checked where a lagged pass is built, before its first launch)."""
    if warps not in SIDE_WARPS_CHOICES:
        raise ASideError(f"the side chain takes {SIDE_WARPS_CHOICES} warps, got {warps}")
    if split < 1:
        raise ASideError(f"split must be a positive number of programs per instance, got {split}")


def side_columns(rows: int, warps: int) -> int:
    """The side chain's A' step width: 32 bytes per thread of `warps` warps over `rows` rows."""
    return max(32, 32 * warps * _SIDE_STEP_BYTES_PER_THREAD // rows)


def noised_a_side(q: torch.Tensor, s_b: torch.Tensor, key_words: torch.Tensor, *, rank: int,
                  salted: bool, a_noised: torch.Tensor, s_a: torch.Tensor,
                  q_copy: torch.Tensor | None = None, valid: torch.Tensor | None = None,
                  valid_rows: int = 0, warps: int = SIDE_WARPS, lag: LagPhase | None = None,
                  split: int = 1, sync: torch.Tensor | None = None) -> None:
    """The fused A side without A·P_B, into given buffers: A' (E, M, K) int8 and s_A (E, 8) int32;
    also q into `q_copy` (E, M, K) and `valid_rows` into every entry of `valid` (E,) int32 where
    given (the lagged state, pipeline._LagState), so they need no copy launches after it.

    For the lagged pass (pipeline.MinedPass(lagged=True)): it runs on a side stream into static
    buffers beside the serving stream's GEMM. One launch of E·split programs of `warps` warps
    (`_side_chain_kernel`), so the whole chain is dispatched at once; no host syncs. lag: the four
    buffers are set 0 of a LagPhase pair and the chain writes the PENDING set. split > 1: an
    instance's noise and A' are shared by `split` programs, which wait for its s_A inside the
    kernel (a shorter chain where it outlasts a short GEMM); `sync` is their (2, E) int32 hand-off
    word pair, zero before the first launch and left zero by every launch (static for CUDA
    graphs; allocated zeroed here when not given).
    """
    _check_inputs(q, s_b, key_words, rank)
    experts, rows, k = q.shape
    _check_tensor("s_a", s_a, (experts, 8), torch.int32)
    _check_tensor("a_noised", a_noised, tuple(q.shape), torch.int8)
    if q_copy is not None:
        _check_tensor("q_copy", q_copy, tuple(q.shape), torch.int8)
    if valid is not None:
        _check_tensor("valid", valid, (experts,), torch.int32)
    if not all(t is None or t.is_contiguous() for t in (s_a, a_noised, q_copy, valid)):
        raise ASideError("s_a, a_noised, q_copy and valid must be contiguous")
    check_side_chain(warps, split)
    if lag is not None:
        check_lag(lag)
    if sync is None:
        sync = torch.zeros((2, experts), dtype=torch.int32, device=q.device)
    _check_tensor("sync", sync, (2, experts), torch.int32)
    if not sync.is_contiguous():
        raise ASideError("sync must be contiguous (the kernel resets it in place)")
    nodes, sizes = _tree_scratch(q)
    uniform = torch.empty((experts, split, rank, rows), dtype=torch.int8, device=q.device)  # U_Aᵀ per part
    first = torch.empty((experts, k), dtype=torch.int32, device=q.device)
    second = torch.empty_like(first)
    step = side_columns(rows, warps)
    _side_chain_kernel[(experts * split,)](
        q.view(torch.int32), q, key_words.contiguous(), s_b.contiguous(),
        constant_words(SEED_SALT_A, q.device), nodes, s_a, constant_words(LABEL_A, q.device), uniform, first,
        second, a_noised, a_noised if q_copy is None else q_copy, s_a if valid is None else valid, valid_rows,
        sizes["words_per_instance"], sizes["chunks"], sizes["nodes_per_instance"], k, rows * rank // 32,
        s_a if lag is None else lag.phase, 0 if lag is None else lag.words,
        sync, experts, triton.cdiv(triton.cdiv(k, split), step),
        SALTED=int(salted), R=rank, BR=rows, BC=step, LANES=32 * warps,
        COPY=int(q_copy is not None), MARK=int(valid is not None), PHASED=int(lag is not None), SPLIT=split,
        num_warps=warps, num_stages=1,
        maxnreg=_side_registers(warps))


def _side_registers(warps: int) -> int | None:
    """A register cap that keeps a side program within _SIDE_REGISTER_BUDGET (Triton 3.6 gives the
    4-warp chain exactly 128, 3.9 gives 96); None at 8 warps, which cannot fit without spilling."""
    cap = _SIDE_REGISTER_BUDGET // (32 * warps)
    return min(cap, 255) if cap >= 128 else None
