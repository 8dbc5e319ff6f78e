"""FP8 V4 mining on the model's device with kernels.fp8mine's pipeline.

``fp8-moe``: one MoE instance per launch (routing bound into seedA); ``fp8-dense``: a layer with a
single expert is a dense V4 instance (the pipeline's one-group case).

The pipeline's ``MinedGemm`` has a static row count m, so the backend keeps one per launch size
(decode and prefill batches repeat their sizes) for as long as the backend lives; the worker's
factory keeps backends across jobs (``miner.gpu.factory``), so each gemm's B side is prepared
on the pipeline's side stream about once every 3 blocks (σ_d kept while in the state window, the
parent's state prefetched). A new job re-targets the gemms (``set_job``) on the default stream,
the serving stream: the launch constants it writes are ordered with the launches, and the
serving stream waits on the GPU (never the host) only when a B state is not ready yet.

Lagged decode (``lagged_decode``, on by default): launch sizes of at most
``LAGGED_MAX_ROWS_PER_EXPERT`` rows per expert take ``MinedGemm(lagged=True)``: launch t serves x_t
and hashes launch t−1's rows (READY) in its GEMM; their lottery runs beside launch t+1's GEMM
(docs/decisions.md, "Mining may lag inference by one launch"; the ticket of x_t's rows is now drawn
two launches later); larger launches keep the same-launch pass. ``set_job`` empties the lag buffers, so
rows hashed under one job are never mined under the next.

Accounting: a launch credits the rows whose tickets it drew. Same-launch: its own rows. Lagged:
the rows of the same gemm's launch two back (the first two launches after a job change credit
nothing).

Winners: the latch's pinned record is read without waiting; ``build_proof`` (completion thread)
re-commits the A side from the latch's payload, commits B on the CPU (once per σ_d, cached), opens
the tile with proof.fp8's builder and re-arms the latch. Launches the pipeline cannot mine (fewer
than 4 rows) serve the reference GEMM unmined.
"""
from __future__ import annotations

import threading

import torch

from kernels.fp8mine.lottery import TILE_COLS, TILE_ROWS
from kernels.fp8mine.pipeline import MinedGemm
from kernels.fp8mine.proofs import commit_b, take_winner
from miner.backend import FP8_CERT_VERSION, BuiltProof, LaunchResult, WinnerRecord, check_fp8_job
from miner.gpu.layout import routing_counts
from miner.gpu.streams import device_exclusive
from miner.jobs import MiningJob
from miner.model.moe import grouped_fc1
from proof.fp8 import CommittedOperand, evaluate_plain_proof, verify_plain_proof
from proof.fp8.lottery import credited_work_moe
from proof.fp8.verify import Rejected

MAX_GEMMS = 4  # launch sizes kept (each holds a B side of its own)
# The lagged GEMM's operand holds, per expert, launch t−1's rows and launch t's: at ≤ 32 rows per
# expert each, the combined operand stays within the grouped GEMM's 64-row decode tiles.
LAGGED_MAX_ROWS_PER_EXPERT = 32


def lagged_applies(tokens: int, top_k: int, experts: int) -> bool:
    """Whether a launch of ``tokens`` is a decode size that mines lagged: rows per expert
    (tokens·top_k / experts, rounded up) of at most LAGGED_MAX_ROWS_PER_EXPERT."""
    return -(-tokens * top_k // experts) <= LAGGED_MAX_ROWS_PER_EXPERT


class GpuFp8Backend:
    """The FP8 (V4) MiningBackend of one layer on its weights' device."""

    def __init__(self, layer_id: int, experts: int, top_k: int, *, lagged_decode: bool = True) -> None:
        if experts == 1 and top_k != 1:
            raise ValueError(f"a dense layer routes each token once, got top_k={top_k}")
        self.mode = "fp8-dense" if experts == 1 else "fp8-moe"
        self.name = f"gpu-{self.mode}"
        self.layer_id, self.experts, self.top_k = layer_id, experts, top_k
        self.lagged_decode = lagged_decode
        self._lock = threading.Lock()  # launches and job changes
        self._proof_lock = threading.Lock()  # a proof reads the gemm's job: not while it changes
        self._weights: torch.Tensor | None = None
        self._job: MiningJob | None = None
        self._gemms: dict[int, MinedGemm] = {}
        # lagged gemm → the credits of its last two launches' rows (oldest first), not drawn yet
        self._lag_credit: dict[int, tuple[tuple[int, int], tuple[int, int]]] = {}
        self._reported: set[bytes] = set()
        self._b_commits: dict[bytes, CommittedOperand] = {}

    def prepare_job(self, job: MiningJob, weights: torch.Tensor) -> None:
        """Adopt the job: re-target (and re-arm) every kept gemm."""
        experts, n, k = check_fp8_job(job, weights, self.experts)
        if n % TILE_COLS:
            raise ValueError(f"FC1 has {n} columns per expert; the FP8 lottery needs a multiple of {TILE_COLS}")
        with self._lock, self._proof_lock, device_exclusive(weights.device):
            if self._weights is None or self._weights.shape != weights.shape or \
                    self._weights.device != weights.device:
                self._weights, self._gemms = weights.detach().to(torch.bfloat16).contiguous(), {}
            for gemm in self._gemms.values():
                gemm.latch.reset()
                gemm.set_job(job.header76, list(job.ancestor_headers), job.target)
            self._job, self._reported, self._lag_credit = job, set(), {}
            window = {bytes(h) for h in job.ancestor_headers}
            self._b_commits = {h: c for h, c in self._b_commits.items() if h in window}

    def mine_launch(self, activations: torch.Tensor, routing: torch.Tensor) -> LaunchResult:
        with self._lock, device_exclusive(activations.device):
            job, weights = self._job, self._weights
            if job is None or weights is None:
                raise RuntimeError("mine_launch before prepare_job")
            tokens = activations.shape[0]
            counts = routing_counts(routing, self.experts)
            if tokens < TILE_ROWS:
                output = grouped_fc1(activations, routing, weights.to(activations.dtype))
                return LaunchResult(output, self._winners(job), 0, 0)
            gemm = self._gemm(job, weights, tokens)
            result = gemm.forward(activations.detach().to(torch.bfloat16),
                                  routing.to(torch.int64) if self.experts > 1 else None)
            n = result.out.shape[1]
            order = torch.sort(routing.reshape(-1).to(torch.int64), stable=True).indices
            output = torch.empty_like(result.out).index_copy_(0, order, result.out)
            winners = self._winners(job)
            credit = (credited_work_moe(counts, n, activations.shape[1], TILE_ROWS),
                      sum(c // TILE_ROWS for c in counts) * (n // TILE_COLS))
            if gemm.lagged:  # this launch drew the tickets of the rows of the launch two back
                older, newer = self._lag_credit.get(tokens, ((0, 0), (0, 0)))
                credit, self._lag_credit[tokens] = older, (newer, credit)
        return LaunchResult(output.view(*routing.shape, n).to(activations.dtype), winners, *credit)

    def _gemm(self, job: MiningJob, weights: torch.Tensor, tokens: int) -> MinedGemm:
        """The gemm for this launch size (made on first use, on the serving stream)."""
        gemm = self._gemms.get(tokens)
        if gemm is None:
            if len(self._gemms) >= MAX_GEMMS:
                evicted = next(iter(self._gemms))
                self._gemms.pop(evicted)
                self._lag_credit.pop(evicted, None)
            lagged = self.lagged_decode and lagged_applies(tokens, self.top_k, self.experts)
            gemm = MinedGemm(weights, m=tokens, top_k=self.top_k, layer_id=self.layer_id, lagged=lagged)
            gemm.set_job(job.header76, list(job.ancestor_headers), job.target)
            self._gemms[tokens] = gemm
        return gemm

    def _winners(self, job: MiningJob) -> list[WinnerRecord]:
        found = []
        for gemm in self._gemms.values():
            record = gemm.latch.poll()
            if record is None or record.ticket in self._reported:
                continue
            self._reported.add(record.ticket)
            found.append(WinnerRecord(job, self.mode, self.layer_id, record.group_id, record.tile_row,
                                      record.tile_column, record.ticket, gemm))
        return found

    def build_proof(self, record: WinnerRecord) -> BuiltProof:
        """The PlainProofV4 of the latched winner and its public data; re-arms the latch."""
        gemm: MinedGemm = record.retained
        with self._proof_lock, device_exclusive(gemm.b.device):
            if gemm.header76 != record.job.header76:
                raise RuntimeError(f"layer {self.layer_id}: the gemm moved on to another job")
            try:
                sigma = gemm.state.ancestor_header if gemm.state is not None else b""
                b = self._b_commits.get(sigma)
                if b is None:
                    b = self._b_commits[sigma] = commit_b(gemm)
                winner = take_winner(gemm, b)
            finally:
                gemm.latch.reset()
        if winner is None or winner.record.ticket != record.ticket:
            raise RuntimeError(f"layer {self.layer_id}: the latch no longer holds this winner")
        try:
            public = evaluate_plain_proof(record.job.header76, winner.proof).to_bytes()
        except Rejected:  # inadmissible tile (jackpot policy): verify() names the reason
            public = b""
        return BuiltProof(winner.proof.to_base64(), public, FP8_CERT_VERSION)

    def verify(self, record: WinnerRecord, built: BuiltProof) -> tuple[bool, str]:
        return verify_plain_proof(record.job.header76, built.proof_b64, target=record.job.target,
                                  public_data=built.public_data)
