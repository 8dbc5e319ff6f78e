"""The INT7 mined expert GEMM end to end: per-job B-side preparation and the per-launch A side.

Two instance layouts (ARCHITECTURE.md's mode table):
- dense (the mainnet fallback, any cert version): every expert's GEMM is its own dense instance,
  A_e = the expert's M token rows, B_e = its weights; commitments, seeds and noise per expert.
- MoE (cert V2/V3 where MoE is allowed): one instance, A = all tokens, B = the stacked experts,
  the routing (E lists of M ascending token ids, uniform M per expert) folded into s_A.
  Both need the row count of an A instance to be a multiple of 16 (the MMA's M).

`prepare_job` (per job: new header or config) hashes and noises the weights on a side stream and
records an event that the serving stream waits on before the first launch. `MinedPass.run`
(per launch) quantises, computes A·P_B for the peel, hashes A, derives s_A (one kernel),
noises A, runs the mined GEMM, snapshots a winner and publishes the record, with no host syncs,
so it captures in a CUDA graph. Dense decode shapes take the fused A side (`a_side`: quantise,
commit + seed, noise + A' + A·P_B: 3 launches); MoE and larger row counts the staged kernels (8).

Lagged (dense only, `MinedPass(lagged=True)`): launch t serves x_t and mines the noised rows of
launch t−1, so the serial A-side hash chain runs on a side stream beside the GEMM instead of in
front of it: with the fused A side as ONE kernel (`a_side.noised_a_side`) enqueued before the GEMM
(docs/kernels-int7.md, "Lagged mining").
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from proof.int7.config import MiningConfig
from proof.int7.noise import LABEL_A, LABEL_B
from proof.int7.plain_proof import MoEOpening, PlainProof
from proof.blake3tree import MerkleTree
from proof.int7.openings import open_rows
from proof.int7.plain_proof import LEAF_SIZE
from proof.int7.routing import end_offsets, expert_start, flatten, open_entries
from proof.int7.seeds import job_key, salted_for

from .a_side import (SIDE_WARPS, check_side_chain, fused_a_side, fused_applies, noised_a_side,
                     side_chain_split)
from .activations import a_times_p_b, int7_codes, prepare_rows
from .blake3 import KeyedTrees, bytes_from_words, keyed_trees, trees_from_leaves, words_from_bytes
from .codes_and_leaves import codes_and_leaves, fits as codes_and_leaves_fit
from .clean_peel import MAX_ROWS as CLEAN_ROWS, clean_peel
from .mined_gemm import TILE_WIDTHS, LagPhase, Tiling, mined_gemm
from .lag_operand import ROW_BLOCK as LAG_ROW_BLOCK, stack_lagged_rows
from .noise import dense_sparse_factor, noise_factors, noised
from .seeds import noise_seed_a, noise_seed_b
from .tile_lottery import tile_lottery
from .split_peel import digit_operands, noise_product, peel_digits, peel_operands, q_limbs
from .winner import INSTANCE, TICKET, TILE_COL, TILE_ROW, WinnerSlot, row_opening


SPLIT_PEEL_FROM_ROWS = 128  # rows per expert from which the peel is its own pass (prefill; docs/kernels-int7.md)
# The split pass on the CuTe int8 GEMM where the launch fits: A'·B' and the transcript by
# transcript_gemm, the tickets by tile_lottery, the peel by peel_gemm, instead of the Triton mined
# and peel kernels. Bit-exact on the H200 and faster (GLM-5 prefill 5085 vs 6382 µs, session 11);
# gpu_check's `cute_split` section and timing compare the two.
CUTE_SPLIT = True
# MoE on the CuTe split pass: the transcript GEMM reads A' rows through the routing (quack's
# gather_A, cp.async) instead of a copy of them into expert order. Off: the same choice for FP8
# measured the gather slower than the copy it saves (GLM-5 prefill pass 4653 vs 4240 µs, session
# 11, docs/kernels-fp8mine.md); for INT7 it is bit-exact on the H200 and not timed.
GATHER_A_ROWS = False


# The prefill A side's quantiser hashes the codes it writes (`codes_and_leaves`: one launch and one
# pass over the codes' DRAM for the quantiser and the chunk hashing, each ~310 µs at GLM-5 FC1
# prefill on the H200, both on the critical path to s_A), its codes rounded by the product (they
# differ from the quantiser's at exact ties only). Fifteenth session, H100: with the quantiser's
# tie repair it was slower (removed); a probe without it took 621 µs against 705 for the two
# launches. Restored in the sixteenth session with product codes; on since the seventeenth: H100,
# same run, GLM-5 FC1 prefill pass 4936.8 vs 5007.0 µs, Qwen3 1530.1 vs 1532.8 (the two launches
# 619.2 vs 396.3 + 312.8 µs); codes differ from the quantiser's only at exact ties (0.06 % at GLM-5 prefill).
CODES_AND_LEAVES = True


# The lagged decode pass on the CuTe int8 GEMM where it fits (`_CuteLag`): one transcript GEMM over
# [READY A' ; q] per expert (B' read once for the mined and the served rows), the tickets by
# tile_lottery, the served rows peeled by clean_peel, instead of the Triton mined kernel with its
# second MMA and in-kernel peel. Measured on the H200 (fourteenth session, same run): no faster than
# the Triton lagged pass (GLM-5 decode 263.4 vs 259.6 µs, DeepSeek-V3 295.8 vs 298.8, Qwen3 101.1
# vs 97.6; 382.4 at GLM-5 without sharing its SMs), so off; kept as the base for a lighter side chain.
CUTE_LAGGED = False
# The FP8 lagged pass's two gains (docs/kernels-fp8mine.md "Twenty-second/third session") in the
# CuTe pass: its GEMM takes its tiles from a counter that the stacking launch zeroes (quack's
# dynamic persistent scheduler), so CTAs slowed by the side chain beside them take fewer, and the
# served rows' peel follows the GEMM directly while READY's tickets are drawn beside it on the side
# stream. Measured on the H200 (twenty-fifth session, same run; docs/kernels-int7.md): exact, and
# the CuTe pass at GLM-5 decode 246.7 µs against 251.5 without it, but the Triton lagged pass
# (242.5) stays faster, so CUTE_LAGGED stays off and this switch, which acts only inside the CuTe
# pass, with it; turn both on together if the CuTe pass is ever the faster one.
CUTE_LAGGED_DYNAMIC = False
# Shared memory the lagged CuTe GEMM leaves on every SM for the side chain (with half the
# registers: `grouped_gemm_sm90.sharing`); the FP8 lagged pass measured 64 KiB best (docs/kernels-fp8mine.md).
LAGGED_SIDE_SMEM = 64 * 1024


def _transcript_config(rows: int, experts: int, n: int, k: int, gather: bool):
    """transcript_gemm.transcript_config, imported only on CUDA (the module imports cutlass)."""
    from .transcript_gemm import transcript_config
    return transcript_config(rows, experts, n, k, gather)


class PipelineError(ValueError):
    """Bad arguments to the mined pass (names what is wrong)."""


@dataclass
class _AFactors:
    """The A side's noise factors, as the split peel needs them: U_A per GEMM row (E, M, r) and
    P_A's index vectors per instance (instances, K)."""

    u_rows: torch.Tensor
    first: torch.Tensor
    second: torch.Tensor


def bound_words(bound: int, device: torch.device | str) -> torch.Tensor:
    """The 256-bit bound as 8 little-endian u32 words (int32 bits)."""
    if not 0 <= bound < 1 << 256:
        raise PipelineError(f"bound must be a 256-bit unsigned integer, got {bound}")
    return words_from_bytes(bound.to_bytes(32, "little"), device)


def _check_tiles(config: MiningConfig, n: int) -> None:
    """The GPU pass's lottery tiles: contiguous h × w with w a block width (see mined_gemm);
    MoE opens fewer than N columns of an expert (int-protocol.md §7)."""
    if tuple(config.rows) != tuple(range(config.h)) or tuple(config.cols) != tuple(range(config.w)):
        raise PipelineError("the GPU miner needs contiguous lottery tiles (rows 0..h−1, cols 0..w−1), "
                            f"got rows {list(config.rows)} cols {list(config.cols)}")
    if config.w not in TILE_WIDTHS or n % config.w or (config.is_moe and config.w >= n):
        raise PipelineError(f"the tile width {config.w} must be one of {TILE_WIDTHS} (the GEMM's block "
                            f"width) and divide N={n}{' (MoE: below N)' if config.is_moe else ''}")


@dataclass
class MiningJob:
    """Per-job device state: the weights' commitments, s_B, B-side noise and B'."""

    header76: bytes
    config: MiningConfig
    cert_version: int
    moe: bool
    job_key: bytes
    key_words: torch.Tensor  # (1, 8)
    bt: torch.Tensor  # (E, N, K) int8 clean weights (what the openings show)
    scale_b: torch.Tensor  # (E, N) float32
    b_trees: KeyedTrees  # dense: E instances; MoE: 1 instance (stacked)
    s_b: torch.Tensor  # (E, 8)
    u_b: torch.Tensor  # (E, N, r) int8
    p_b: torch.Tensor  # (E, K, r) int8 P_B stored dense (the A·P_B kernel's operand); MoE (1, K, r)
    bt_noised: torch.Tensor  # (E, N, K) int8
    bound: torch.Tensor  # (8,) int32
    ready: torch.cuda.Event | None

    @property
    def salted(self) -> bool:
        return salted_for(self.cert_version)


def prepare_job(weights: torch.Tensor, scale_b: torch.Tensor, *, header76: bytes,
                config: MiningConfig, cert_version: int, bound: int, moe: bool,
                stream: torch.cuda.Stream | None = None) -> MiningJob:
    """B side of a job: commit the int7 weights (E, N, K) under the job key, s_B, noise, B'.

    `bound` is the ticket bound to mine against (the rank-penalised one where the node applies it).
    On CUDA the work runs on `stream` (a side stream by default) and `job.ready` marks completion.
    """
    config.check_limits()
    if weights.dtype != torch.int8 or weights.dim() != 3 or not weights.is_contiguous():
        raise PipelineError(f"weights must be contiguous int8 (E, N, K), got {weights.dtype} "
                            f"{tuple(weights.shape)}")
    experts, n, k = weights.shape
    _check_tiles(config, n)
    if k != config.common_dim:
        raise PipelineError(f"weights have K={k} but the config's common_dim is {config.common_dim}")
    if moe != config.is_moe or (moe and config.experts != experts):
        raise PipelineError(f"config experts={config.experts} does not fit a "
                            f"{'MoE' if moe else 'dense'} job of {experts} experts")
    if tuple(scale_b.shape) != (experts, n) or scale_b.dtype != torch.float32:
        raise PipelineError(f"scale_b must be float32 ({experts}, {n}), got {scale_b.dtype} "
                            f"{tuple(scale_b.shape)}")
    key = job_key(header76, config)
    cuda = weights.device.type == "cuda"
    side = stream if stream is not None else (torch.cuda.Stream(weights.device) if cuda else None)
    if side is not None:
        side.wait_stream(torch.cuda.current_stream(weights.device))
    with torch.cuda.stream(side) if side is not None else _nullcontext():
        key_words = words_from_bytes(key, weights.device).view(1, 8)
        rank = config.rank
        salted = salted_for(cert_version)
        instances = 1 if moe else experts  # MoE: one instance, the stacked experts
        trees = keyed_trees(key_words, weights.view(instances, -1))
        s_b = noise_seed_b(key_words, trees.roots, salted_seeds=salted, n=n)
        u_b, first, second = noise_factors(s_b, LABEL_B, experts * n // instances, k, rank)
        bt_noised = noised(weights.view(instances, -1, k), u_b, first, second).view(experts, n, k)
        job = MiningJob(bytes(header76), config, cert_version, moe, key, key_words, weights,
                        scale_b, trees, s_b.expand(experts, 8).contiguous() if moe else s_b,
                        u_b.view(experts, n, rank), dense_sparse_factor(first, second, rank), bt_noised,
                        bound_words(bound, weights.device), None)
        if side is not None:
            job.ready = torch.cuda.Event()
            job.ready.record(side)
    return job


class _nullcontext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@dataclass
class _LagState:
    """One side of the lag (ready or pending) in one flat byte buffer: the noised rows A', the
    int7 rows A they came from (retained for a winner's opening), s_A, and per instance the count
    of rows that may hold lottery tiles (0: nothing is mined)."""

    flat: torch.Tensor
    a_noised: torch.Tensor  # (E, M, K) int8
    q: torch.Tensor  # (E, M, K) int8
    s_a: torch.Tensor  # (E, 8) int32
    valid: torch.Tensor  # (E,) int32

    @staticmethod
    def nbytes(experts: int, rows: int, k: int) -> int:
        """A state's size, padded to 64 bytes: the next state's views are as aligned as this one's
        (LagPhase.words a multiple of 16)."""
        return -(-(2 * experts * rows * k + experts * 9 * 4) // 64) * 64

    @classmethod
    def within(cls, flat: torch.Tensor, experts: int, rows: int, k: int) -> _LagState:
        """The state's views of `flat` (nbytes uint8)."""
        size = experts * rows * k  # a multiple of 4: the int32 views after it stay aligned
        words = flat[2 * size:].view(torch.int32)
        return cls(flat, flat[:size].view(torch.int8).view(experts, rows, k),
                   flat[size:2 * size].view(torch.int8).view(experts, rows, k),
                   words[:experts * 8].view(experts, 8), words[experts * 8:experts * 9])


@dataclass
class _LagPair:
    """Both lag states in one allocation (states[1] starts `stride` bytes after states[0]) and the
    phase word: at a launch, states[phase] is READY (read by the GEMM and the retain) and
    states[1 − phase] PENDING (written by the side chain); the launch flips the phase at its end.
    CUDA graphs bake pointers, so the kernels get states[0] and add the shift themselves
    (`mined_gemm.LagPhase`) instead of a 6.3 MB READY ← PENDING copy in front of the GEMM."""

    flat: torch.Tensor  # both states' bytes, (2 · stride,) uint8
    states: tuple[_LagState, _LagState]
    lag: LagPhase

    @classmethod
    def zeros(cls, experts: int, rows: int, k: int, device: torch.device) -> _LagPair:
        """Both states zeroed (nothing is mineable at the first launch), phase 0."""
        stride = _LagState.nbytes(experts, rows, k)
        flat = torch.zeros(2 * stride, dtype=torch.uint8, device=device)
        states = (_LagState.within(flat[:stride], experts, rows, k),
                  _LagState.within(flat[stride:], experts, rows, k))
        return cls(flat, states, LagPhase(torch.zeros(1, dtype=torch.int32, device=device), stride // 4))

    def write_pending(self, state: _LagState) -> None:
        """Copy a state's bytes into PENDING (states[1 − phase]) by a device-side index: the staged
        A side's outputs, with no host sync."""
        self.flat.view(2, -1).index_copy_(0, 1 - self.lag.phase.long(), state.flat.view(1, -1))

    def flip(self) -> None:
        """PENDING becomes READY (a one-word device op, no host sync)."""
        self.lag.phase.bitwise_xor_(1)


@contextmanager
def _on_side(side: torch.cuda.Stream | None, main: torch.cuda.Stream | None) -> Iterator[None]:
    """Run the block on `side` after the work queued on `main` so far (inline without streams)."""
    if side is None:
        yield
        return
    side.wait_stream(main)
    with torch.cuda.stream(side):
        yield


def _wanted(asked: bool | None, default: bool) -> bool:
    """A constructor's switch: None takes the module default."""
    return default if asked is None else asked


@dataclass
class _CuteLag:
    """The lagged CuTe pass's static buffers: the stacked operand (E, 2M, K), its row bounds, A·B'
    of both row sets (E, 2M, N) int32, the tile words, READY's s_A and row counts as the lottery
    reads them, the GEMM's config, the events that order A·P_B before the peel and the GEMM before
    the side stream's lottery, and the dynamic GEMM's tile counter."""

    config: object  # GroupedGemmConfig (the CuTe modules import lazily)
    stacked: torch.Tensor
    bounds: torch.Tensor
    raw: torch.Tensor
    words: torch.Tensor
    s_a: torch.Tensor
    valid: torch.Tensor
    apb_ready: torch.cuda.Event | None
    gemm_done: torch.cuda.Event | None
    tile_counter: torch.Tensor

    @classmethod
    def build(cls, job: MiningJob, rows: int) -> _CuteLag | None:
        """The buffers where the launch fits the CuTe pass, else None."""
        experts, n, k = job.bt.shape
        device = job.bt.device
        if (device.type != "cuda" or job.config.rank != 128 or (job.config.h, job.config.w) != (2, 128)
                or k % 128 or n % 128 or rows % LAG_ROW_BLOCK or rows > CLEAN_ROWS):
            return None
        from .transcript_gemm import sharing_config
        config = sharing_config(experts * 2 * rows, experts, n, k)
        if config is None:
            return None
        return cls(config, torch.empty((experts, 2 * rows, k), dtype=torch.int8, device=device),
                   torch.arange(experts + 1, device=device, dtype=torch.int32) * 2 * rows,
                   torch.empty((experts, 2 * rows, n), dtype=torch.int32, device=device),
                   torch.empty((experts * rows, n // 128, 16), dtype=torch.int32, device=device),
                   torch.zeros((experts, 8), dtype=torch.int32, device=device),
                   torch.zeros(experts, dtype=torch.int32, device=device), torch.cuda.Event(), torch.cuda.Event(),
                   torch.zeros(1, dtype=torch.int32, device=device))


class MinedPass:
    """The per-launch A side and the mined GEMM for one job and one static shape.

    rows: tokens per expert (M). MoE: tokens = the number of distinct tokens (E·M / top_k).
    Buffers are static so `run` can be captured in a CUDA graph and replayed.
    fused_a: the dense A side through `a_side.fused_a_side` (3 launches instead of 8); None picks
    it wherever it applies (decode row counts), False keeps the staged kernels.
    lagged (dense only): launch t outputs A_t·B but mines the noised rows of launch t−1, whose
    commitment, s_A and A' a side stream computed during launch t−1 (so they leave the critical
    path); the first launch mines nothing. A winner record then names an instance of launch t−1
    and the retained A (the proof's opening) is A_{t−1}. The pending rows never cross jobs: the
    job key, s_B and the bound live in the job, and a new job takes a new MinedPass.
    side_warps (lagged, fused A side): warps of each side-chain program (`a_side.SIDE_WARPS_CHOICES`);
    fewer leave the GEMM's programs their SM slots, more shorten the chain (docs/kernels-int7.md).
    side_split (lagged, fused A side): programs an instance's side chain is shared by
    (`a_side.noised_a_side(split=)`); None picks `a_side.side_chain_split(E)` (measured per E).
    split_peel: the mined GEMM writes A'·B' and `split_peel` peels it in its own pass (no second MMA
    over the weights); None picks it from SPLIT_PEEL_FROM_ROWS rows per expert (prefill), where
    the stacked peel's second MMA doubles a compute-bound GEMM. Not with the fused or lagged A side.
    cute_split (split peel only): the split pass on the CuTe int8 GEMM: A'·B' and the transcript
    words by `transcript_gemm`, the tickets by `tile_lottery`, and (without write_i32, whose exact
    in-place A·B the Triton peel writes) the peel by `peel_gemm`; None uses it where CUTE_SPLIT is
    on and the launch fits (CUDA, rank 128, 2 × 128 tiles, K a multiple of 128).
    cute_lag (lagged only): the lagged pass on the CuTe int8 GEMM (`_CuteLag`); None uses it where
    CUTE_LAGGED is on and the launch fits.
    """

    def __init__(self, job: MiningJob, rows: int, *, tokens: int | None = None,
                 tiling: Tiling | None = None, write_i32: bool = False,
                 fused_a: bool | None = None, lagged: bool = False, side_warps: int = SIDE_WARPS,
                 split_peel: bool | None = None, side_split: int | None = None,
                 cute_split: bool | None = None, cute_lag: bool | None = None) -> None:
        if job.ready is not None:  # the job's B side ran on a side stream: order it before us
            torch.cuda.current_stream(job.bt.device).wait_event(job.ready)
        self.job = job
        self.rows = rows
        self.tiling = tiling
        experts, n, k = job.bt.shape
        self.tokens = tokens if job.moe else rows
        if lagged and job.moe:
            raise PipelineError("lagged mining is dense only: an MoE launch's s_A folds in its routing "
                                "and its rows are gathered by it, so mining launch t−1's rows would "
                                "also need its routing kept; MoE keeps the same-launch pass")
        if job.moe and (tokens is None or tokens * job.config.top_k != experts * rows):
            raise PipelineError(f"MoE needs tokens·top_k = E·M; got tokens={tokens}, "
                                f"top_k={job.config.top_k}, E={experts}, M={rows}")
        if rows < job.config.h:
            raise PipelineError(f"{rows} rows per expert hold no {job.config.h}-row tile")
        device = job.bt.device
        retained = {"a": self.tokens * k // 4}  # the winning instance's int7 activations
        if job.moe:
            retained["routing"] = experts * rows
        self.slot = WinnerSlot(device, retained)
        self.out = torch.empty((experts, rows, n), dtype=torch.bfloat16, device=device)
        self.out_i32 = (torch.empty((experts, rows, n), dtype=torch.int32, device=device)
                        if write_i32 else None)
        valid = rows - rows % job.config.h
        self.rows_valid = torch.full((experts,), valid, dtype=torch.int32, device=device)
        # the experts' row bounds (E + 1): the CuTe GEMMs' group offsets; the end offsets after the
        # leading 0 are what MoE commits in s_A
        self.row_bounds = torch.arange(experts + 1, device=device, dtype=torch.int32) * rows
        self.offsets = self.row_bounds[1:]
        self.dump: torch.Tensor | None = None
        applies = not job.moe and fused_applies(rows, k, job.config.rank)
        if fused_a and not applies:
            raise PipelineError(f"the fused A side needs a dense job with M in (16, 32, 64); got "
                                f"{'MoE' if job.moe else 'dense'} M={rows}, K={k}")
        if split_peel and (fused_a or lagged):
            raise PipelineError("the split peel needs the staged A side's noise factors: not with "
                                "fused_a=True or lagged=True")
        self.split_peel = (rows >= SPLIT_PEEL_FROM_ROWS and not lagged and not fused_a
                           if split_peel is None else split_peel)
        self.fused_a = applies and not self.split_peel if fused_a is None else fused_a
        if self.split_peel:  # A'·B' (the exact A·B after the peel, in place), and Qᵀ = B'·P_A
            self._raw = self.out_i32 if write_i32 else torch.empty((experts, rows, n), dtype=torch.int32,
                                                                   device=device)
            self._q_t = torch.empty((experts, n, job.config.rank), dtype=torch.int32, device=device)
            self._peel_operands = peel_operands(experts, rows, n, job.config.rank, k, device)
            # Qᵀ = B'·P_A streams the weights while the compute-bound mined GEMM runs beside it
            self._q_stream = torch.cuda.Stream(device, priority=-1) if device.type == "cuda" else None
        self._gather = job.moe and GATHER_A_ROWS  # decided once: the transcript config depends on it
        self._transcript = self._transcript_buffers(cute_split)
        self.lagged = lagged
        self.side_warps = side_warps
        self.side_split = side_chain_split(experts) if side_split is None else side_split
        check_side_chain(side_warps, self.side_split)
        if lagged:
            self._lag = _LagPair.zeros(experts, rows, k, device)
            # the one-kernel side chain's hand-off words (left zero by each launch); staged: none
            self._side_sync = torch.zeros((2, experts), dtype=torch.int32, device=device) if self.fused_a else None
            # the staged A side writes PENDING through a copy of this (its kernels take no phase)
            self._staging = (_LagState.within(torch.zeros(4 * self._lag.lag.words, dtype=torch.uint8, device=device),
                                              experts, rows, k) if not self.fused_a else None)
            cuda = device.type == "cuda"
            # high priority: the side chain's blocks are placed as soon as a GEMM program retires
            self._side = torch.cuda.Stream(device, priority=-1) if cuda else None
            self._retained = torch.cuda.Event() if cuda else None
        if cute_lag and not lagged:
            raise PipelineError("cute_lag=True is the lagged pass on the CuTe GEMM: it needs lagged=True")
        self._cute_lag = _CuteLag.build(job, rows) if lagged and _wanted(cute_lag, CUTE_LAGGED) else None
        if cute_lag and self._cute_lag is None:
            raise PipelineError(f"the lagged CuTe pass needs CUDA, rank 128, 2 × 128 tiles, K and N multiples "
                                f"of 128 and {LAG_ROW_BLOCK}..{CLEAN_ROWS} rows an expert in multiples of "
                                f"{LAG_ROW_BLOCK}; got {rows} rows × {tuple(job.bt.shape)}, rank {job.config.rank}, "
                                f"tile {job.config.h} × {job.config.w}")

    def run(self, x: torch.Tensor, routing: torch.Tensor | None = None) -> torch.Tensor:
        """The mined pass on floating activations (quantised to int7 per row); bf16 output.

        Dense: x (E, M, K). MoE: x (tokens, K) and routing (E, M) int32, each expert's token ids
        ascending, every token in exactly top_k lists (not checked on the device).
        """
        return self._run(x, None, routing)

    def run_quantized(self, q: torch.Tensor, scale_a: torch.Tensor,
                      routing: torch.Tensor | None = None) -> torch.Tensor:
        """The mined pass on int7 codes q with their row scales."""
        return self._run(q, scale_a, routing)

    def _run(self, x: torch.Tensor, scale: torch.Tensor | None,
             routing: torch.Tensor | None) -> torch.Tensor:
        job = self.job
        experts, _, k = job.bt.shape
        rank = job.config.rank
        if job.moe:
            if x.shape != (self.tokens, k) or routing is None or routing.shape != (experts, self.rows):
                raise PipelineError(f"MoE pass needs activations ({self.tokens}, {k}) and routing "
                                    f"({experts}, {self.rows})")
            index = routing.long()
            q, scale, apb, a_trees = self._codes_apb_trees(x, scale, self.tokens, index)
            flat_routing = routing.to(torch.int32).contiguous().view(1, -1)
            r_trees = keyed_trees(job.key_words, flat_routing.view(torch.int8))
            o_trees = keyed_trees(job.key_words, self.offsets.view(1, -1).view(torch.int8))
            s_a1 = noise_seed_a(job.s_b[:1], a_trees.roots, salted_seeds=job.salted, m=self.tokens,
                                routing_hash=r_trees.roots, offsets_hash=o_trees.roots)
            u_a, first_a, second_a = noise_factors(s_a1, LABEL_A, self.tokens, k, rank)
            a_noised = noised(q.view(1, self.tokens, k), u_a, first_a, second_a)[0]
            a_idx = flat_routing.view(-1)  # the CuTe transcript GEMM may read A' rows through it
            if self._transcript is None or not self._gather:  # else A' in expert order
                a_noised, a_idx = a_noised[index], None
            a_clean = None if self.split_peel else q[index]  # the split pass never reads the clean rows
            scale = scale[index]
            s_a = s_a1.expand(experts, 8).contiguous()
            factors = _AFactors(u_a[0][index], first_a, second_a)
        else:
            if x.shape != (experts, self.rows, k):
                raise PipelineError(f"dense pass needs activations ({experts}, {self.rows}, {k}), "
                                    f"got {tuple(x.shape)}")
            if self.lagged:
                return self._run_lagged(x, scale)
            factors = None
            if self.fused_a:
                q, scale = int7_codes(x, scale)
                a_noised, apb, s_a = fused_a_side(q.contiguous(), job.s_b, job.key_words, job.p_b,
                                                  rank=rank, salted=job.salted)
            else:
                q, scale, apb, a_trees = self._codes_apb_trees(x, scale, self.rows)
                a_noised, s_a, factors = self._staged_noise(q, a_trees)
            a_clean, a_idx = q, None
        if self.split_peel:
            self._gemm_split(a_noised, apb, s_a, scale, factors, a_idx)
        else:
            self._gemm(a_noised, a_clean, apb, s_a, scale, self.rows_valid)
        self.slot.retain("a", q.contiguous().view(1 if job.moe else experts, -1).view(torch.int32),
                         by_instance=not job.moe)
        if job.moe:
            self.slot.retain("routing", flat_routing, by_instance=False)
        self.slot.publish()
        return self.out

    def _codes_apb_trees(self, x: torch.Tensor, scale: torch.Tensor | None, rows_per_instance: int,
                         index: torch.Tensor | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, KeyedTrees]:
        """(q, scale, A·P_B, A's trees over instances of rows_per_instance rows), A·P_B's rows
        taken by `index` (MoE: into expert order)."""
        job = self.job
        if CODES_AND_LEAVES and scale is None and codes_and_leaves_fit(x, rows_per_instance):  # it computes the scales
            q, scale, leaves = codes_and_leaves(x, job.key_words, rows_per_instance=rows_per_instance)
            apb = a_times_p_b(q, job.p_b, rows_per_instance=rows_per_instance)
            trees = trees_from_leaves(job.key_words, leaves)
        else:
            q, scale, apb = prepare_rows(x, job.p_b, rows_per_instance=rows_per_instance, scale=scale)
            trees = keyed_trees(job.key_words, q.reshape(-1, rows_per_instance * x.shape[-1]))
        return q, scale, apb if index is None else apb[index], trees

    def _run_lagged(self, x: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        """Serve x_t, mine the ready rows of launch t−1, and compute launch t's pending rows on the
        side stream. The launch ends with the serving stream joined to the side stream, so it is
        self-contained (one CUDA graph; every replay rotates the state once, by the phase word: on
        the H200 the GEMM then starts ~21 µs earlier than behind a 6.3 MB READY ← PENDING copy)."""
        if self._cute_lag is not None:
            return self._run_lagged_cute(x, scale)
        side = self._side
        main = torch.cuda.current_stream(x.device) if side is not None else None
        lag = self._lag.lag
        ready = self._lag.states[0]  # set 0: the kernels shift to states[phase]

        def fork(q: torch.Tensor) -> None:
            """The side chain, enqueued once q_t is (before A·P_B): its E programs are dispatched
            while A·P_B runs, so they hold their SM slots before the GEMM fills the machine. It
            writes PENDING's A', s_A, A and row count itself (no copy launches behind it)."""
            with _on_side(side, main):
                self._noise_into(q.contiguous())

        q, scale, apb = prepare_rows(x, self.job.p_b, rows_per_instance=self.rows, scale=scale, after_codes=fork)
        self._gemm(ready.a_noised, q, apb, ready.s_a, scale, ready.valid, lag, after_apb=True)
        return self._end_lagged(main)

    def _run_lagged_cute(self, x: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        """`_run_lagged` on the CuTe GEMM: the side stream computes A·P_B (the served rows' peel
        term) and then launch t's pending rows; the serving stream stacks READY's A' on q_t, runs
        the transcript GEMM beside the side chain (SM-sharing variant), draws READY's tickets and
        peels the served rows once A·P_B is there (CUTE_LAGGED_DYNAMIC: the GEMM's tiles from a
        counter, and the tickets drawn on the side stream beside the peel)."""
        job, lag, side = self.job, self._lag.lag, self._side
        cute, ready = self._cute_lag, self._lag.states[0]
        main = torch.cuda.current_stream(x.device) if side is not None else None
        q, scale = int7_codes(x, scale)
        q = q.contiguous()
        with _on_side(side, main):
            apb = a_times_p_b(q, job.p_b, rows_per_instance=self.rows)
            if side is not None:
                cute.apb_ready.record(side)
            self._noise_into(q)
        beside = CUTE_LAGGED_DYNAMIC and main is not None  # READY's tickets on the side stream
        counter = cute.tile_counter if CUTE_LAGGED_DYNAMIC else None
        stack_lagged_rows(ready.a_noised, ready.s_a, ready.valid, lag, q, cute.stacked, cute.s_a, cute.valid,
                          tile_counter=counter)
        from .transcript_gemm import transcript_gemm
        experts, n, k = job.bt.shape
        transcript_gemm(cute.stacked.view(-1, k), job.bt_noised, cute.bounds, cute.raw.view(-1, n), cute.words,
                        cute.config, side_smem=LAGGED_SIDE_SMEM, tile_counter=counter)
        if beside:
            cute.gemm_done.record(main)
        else:
            self._draw_stacked(cute)
        if main is not None:
            main.wait_event(cute.apb_ready)
        clean_peel(cute.raw, self.rows, apb, job.u_b, scale.float().contiguous(), job.scale_b, self.out, self.out_i32)
        if beside:
            side.wait_event(cute.gemm_done)
            with torch.cuda.stream(side):
                self._draw_stacked(cute)
            main.wait_stream(side)  # the retain reads the record the lottery may have written
        return self._end_lagged(main)

    def _draw_stacked(self, cute: _CuteLag) -> None:
        """READY's tickets from the stacked GEMM's transcript words (its first M rows an expert)."""
        job = self.job
        tile_lottery(cute.words, cute.s_a, job.bound, cute.valid, self.slot.record, rows=2 * self.rows,
                     tile_h=job.config.h, tile_w=job.config.w)

    def _end_lagged(self, main: torch.cuda.Stream | None) -> torch.Tensor:
        """A lagged launch's end: retain READY's rows (the opening of a winner among them), flip
        the phase, publish the record, and join the side stream (one self-contained graph)."""
        ready = self._lag.states[0]
        self.slot.retain("a", ready.q.view(ready.q.shape[0], -1).view(torch.int32), by_instance=True,
                         lag=self._lag.lag)
        self._flip_after_retain(main)
        self.slot.publish()
        if self._side is not None:
            main.wait_stream(self._side)
        return self.out

    def _flip_after_retain(self, main: torch.cuda.Stream | None) -> None:
        """Flip the phase once the side chain (side stream order) and the GEMM and retain (the
        event) have read it: on the side stream, beside the record's publication on main."""
        side = self._side
        if side is None:
            self._lag.flip()
            return
        self._retained.record(main)
        side.wait_event(self._retained)
        with torch.cuda.stream(side):
            self._lag.flip()

    def _noise_into(self, q: torch.Tensor) -> None:
        """s_A, A', the rows q and (last) the mineable row count into PENDING: the one-kernel side
        chain writes all four into states[1 − phase] itself; staged, the kernels' outputs are
        copied in by the phase."""
        job = self.job
        valid = self.rows - self.rows % job.config.h
        lag = self._lag.lag
        target = self._lag.states[0]
        if self.fused_a:
            noised_a_side(q, job.s_b, job.key_words, rank=job.config.rank, salted=job.salted,
                          a_noised=target.a_noised, s_a=target.s_a, q_copy=target.q, valid=target.valid,
                          valid_rows=valid, warps=self.side_warps, lag=lag, split=self.side_split,
                          sync=self._side_sync)
            return
        staged = self._staging
        a_noised, s_a, _ = self._staged_noise(q)
        staged.a_noised.copy_(a_noised)
        staged.s_a.copy_(s_a)
        staged.q.copy_(q)
        staged.valid.fill_(valid)
        self._lag.write_pending(staged)

    def _staged_noise(self, q: torch.Tensor, a_trees: KeyedTrees | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor, _AFactors]:
        """(A', s_A, the noise factors) of dense int7 rows q (E, M, K) through the staged kernels;
        a_trees: q's trees when the quantiser already built their leaves."""
        job = self.job
        experts, _, k = q.shape
        rank = job.config.rank
        if a_trees is None:
            a_trees = keyed_trees(job.key_words, q.view(experts, -1))
        s_a = noise_seed_a(job.s_b, a_trees.roots, salted_seeds=job.salted, m=self.rows)
        u_a, first_a, second_a = noise_factors(s_a, LABEL_A, self.rows, k, rank)
        return noised(q, u_a, first_a, second_a), s_a, _AFactors(u_a, first_a, second_a)

    def _gemm(self, a_noised: torch.Tensor, a_clean: torch.Tensor, apb: torch.Tensor, s_a: torch.Tensor,
              scale: torch.Tensor, rows_valid: torch.Tensor, lag: LagPhase | None = None,
              after_apb: bool = False) -> None:
        job = self.job
        config = job.config
        mined_gemm(a_noised.contiguous(), a_clean.contiguous(), job.bt_noised, apb.contiguous(),
                   job.u_b, s_a, job.bound, rows_valid, self.slot.record,
                   scale.float().contiguous(), job.scale_b, rank=config.rank, tile_h=config.h,
                   tile_w=config.w, out=self.out, out_i32=self.out_i32, dump=self.dump,
                   tiling=self.tiling, lag=lag, after_apb=after_apb)

    def _transcript_buffers(self, wanted: bool | None) -> torch.Tensor | None:
        """The CuTe transcript GEMM's tile words when the split pass uses it (else None)."""
        job = self.job
        experts, n, k = job.bt.shape
        config = (_transcript_config(experts * self.rows, experts, n, k, self._gather)
                  if self.split_peel and job.bt.device.type == "cuda" else None)
        fits = (config is not None and job.config.rank == 128 and (job.config.h, job.config.w) == (2, 128)
                and self.rows % 2 == 0)
        if wanted and not fits:
            raise PipelineError(f"the CuTe split pass needs the split peel on CUDA, rank 128, 2 × 128 tiles "
                                f"and a config that fits; got {self.rows} rows × {tuple(job.bt.shape)}, "
                                f"tile {job.config.h} × {job.config.w}")
        if not (fits and _wanted(wanted, CUTE_SPLIT)):
            return None
        return torch.empty((experts * self.rows // 2, n // 128, 16), dtype=torch.int32, device=job.bt.device)

    def _gemm_split(self, a_noised: torch.Tensor, apb: torch.Tensor, s_a: torch.Tensor, scale: torch.Tensor,
                    factors: _AFactors, a_idx: torch.Tensor | None) -> None:
        """The mined GEMM writing A'·B', then Qᵀ = B'·P_A over the weights and the peel pass.
        a_idx (MoE, CuTe GEMM, GATHER_A_ROWS): a_noised holds the token rows and the GEMM reads
        them through it."""
        job = self.job
        config = job.config
        experts, n, k = job.bt.shape
        instances = factors.first.shape[0]  # MoE: one instance over the stacked experts
        scale = scale.float().contiguous()
        main = torch.cuda.current_stream(a_noised.device) if self._q_stream is not None else None
        left, right = self._peel_operands
        with _on_side(self._q_stream, main):  # memory-bound, beside the compute-bound GEMM
            p_a_t = dense_sparse_factor(factors.first, factors.second, config.rank).transpose(1, 2)
            noise_product(job.bt_noised.view(instances, -1, k), p_a_t, self._q_t.view(instances, -1, config.rank))
            digit_operands(factors.u_rows.contiguous(), apb.contiguous(), self._q_t, job.u_b,
                           digits=q_limbs(k), left=left, right=right)
        if self._transcript is not None:
            from .transcript_gemm import transcript_gemm
            transcript_gemm(a_noised.contiguous().view(-1, k), job.bt_noised, self.row_bounds, self._raw.view(-1, n),
                            self._transcript, a_idx=a_idx)
            tile_lottery(self._transcript, s_a, job.bound, self.rows_valid, self.slot.record, rows=self.rows,
                         tile_h=config.h, tile_w=config.w, dump=self.dump)
        else:
            mined_gemm(a_noised.contiguous(), None, job.bt_noised, None, None, s_a, job.bound, self.rows_valid,
                       self.slot.record, None, None, rank=config.rank, tile_h=config.h, tile_w=config.w,
                       out=None, out_i32=self._raw, dump=self.dump, tiling=self.tiling, peel=False)
        if main is not None:
            main.wait_stream(self._q_stream)
        if self._transcript is not None and self.out_i32 is None:
            from .peel_gemm import peel_gemm
            peel_gemm(left.view(-1, left.shape[-1]), right, self.row_bounds, self._raw.view(-1, n),
                      scale.view(-1), job.scale_b.contiguous(), self.out.view(-1, n))
        else:
            peel_digits(self._raw, left, right, scale, job.scale_b, rank=config.rank, out=self.out,
                        exact_in_place=self.out_i32 is not None)

    def winner_record(self) -> dict[str, int] | None:
        """The published record if the doorbell rang (call after the launch completed).
        Lagged: the instance and tile are those of the rows launch t−1 served."""
        if not self.slot.rang():
            return None
        record = self.slot.host_record.tolist()
        return {"instance": record[INSTANCE], "t_rows": record[TILE_ROW], "t_cols": record[TILE_COL],
                "ticket": b"".join((w & 0xFFFFFFFF).to_bytes(4, "little")
                                   for w in record[TICKET:TICKET + 8])}

    def take_proof(self) -> PlainProof | None:
        """The plain proof of the published winner (None without one); re-arms the slot.

        A and the routing come from the retained snapshot and are re-hashed on the host (small);
        the weights' openings read the job's kept device tree levels.
        """
        record = self.winner_record()
        if record is None:
            return None
        proof = self._build_proof(record)
        self.slot.rearm()
        return proof

    def _build_proof(self, record: dict[str, int]) -> PlainProof:
        job = self.job
        config = job.config
        experts, n, k = job.bt.shape
        e = record["instance"]
        inner = [record["t_rows"] + p for p in range(config.h)]
        local_cols = [record["t_cols"] + q for q in range(config.w)]
        a_tree = MerkleTree(job.job_key, bytes_from_words(self.slot.retained["a"]), LEAF_SIZE)
        moe = None
        if job.moe:
            routing = self.slot.retained["routing"].cpu().view(experts, self.rows).tolist()
            rows = [routing[e][i] for i in inner]
            offsets = end_offsets(routing)
            routing_tree = MerkleTree(job.job_key, flatten(routing), LEAF_SIZE)
            moe = MoEOpening(config.experts, config.top_k, e, tuple(offsets), tuple(inner),
                             open_entries(routing_tree, expert_start(offsets, e), inner))
            b_flat, b_levels, b_root = job.bt.view(-1), [lv[0] for lv in job.b_trees.levels], job.b_trees.roots[0]
            b_rows = [e * n + c for c in local_cols]
        else:
            rows = inner
            b_flat, b_levels, b_root = job.bt[e].reshape(-1), [lv[e] for lv in job.b_trees.levels], job.b_trees.roots[e]
            b_rows = local_cols
        return PlainProof(self.tokens, n, k, config.rank, open_rows(a_tree, rows, k),
                          row_opening(b_flat, b_levels, b_root, b_rows, k), moe)
