"""INT7 mining (certificates V1–V3) on the model's device with kernels.int7's pipeline.

- ``int7-dense`` (the mainnet dense-only fallback): each expert's FC1 is its own dense instance,
  A_e = the expert's routed tokens plus zero rows up to the launch's M.
- ``int7-moe``: one instance per launch over all tokens (plus zero phantom tokens, so that every
  expert lists M rows; ``miner.gpu.layout``), the routing folded into s_A.

Per job (``prepare_job``, the job thread): the weights are quantised per output column to int7
once (cached while the weights are unchanged), then kernels.int7.pipeline.prepare_job commits,
seeds and noises them on a side stream. Per launch (the serving thread): one host sync for the
expert counts, then the device-only mined pass (A side, mined GEMM, peel, winner snapshot); its
bf16 output is the layer's FC1 output.

Lagged decode (``lagged_decode``, on by default): int7-dense launches of a decode shape (the fused
A side applies: M in 16/32/64 rows per expert) take ``MinedPass(lagged=True)``: launch t serves
x_t and mines launch t−1's noised rows, the A side's hash chain running beside the GEMM
(docs/decisions.md, "Mining may lag inference by one launch"). int7-moe and prefill shapes keep
the same-launch pass. A new job takes new passes, so rows never carry over to another job.

Accounting: a launch credits the rows it actually hashed. Same-launch: its own rows. Lagged: the
previous launch's rows of the same pass (the first launch of a pass credits nothing).

Winners: the pass's doorbell is read from pinned memory without waiting (a record is visible only
once complete), so a launch's winner is reported by that launch or a later one. The pass keeps the
winning operands until ``build_proof`` (the completion thread) opens them and re-arms it (a
lagged pass retains the mined launch t−1's A, which its record names).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from kernels.int7.a_side import fused_applies
from kernels.int7.mined_gemm import lottery_tile
from kernels.int7.pipeline import MinedPass
from kernels.int7.pipeline import MiningJob as DeviceJob
from kernels.int7.pipeline import prepare_job as prepare_device_job
from miner.backend import BuiltProof, LaunchResult, WinnerRecord
from miner.gpu.layout import Layout, layout
from miner.gpu.streams import SideWork, device_exclusive
from miner.jobs import MiningJob
from miner.modes import Mode
from proof.int7 import MiningConfig, PlainProof, mining_bound, public_data, verify_plain_proof

RANK = 128  # the rank-penalty floor; needs k >= 16 · 128 = 2048
ROW_BLOCK = 16  # the pipeline's row block: M and an MoE instance's token count are multiples of it
MAX_PASSES = 8  # launch shapes kept per job (each holds static buffers)
INT7_LIMIT = 64  # operands in [-64, 64] so that A + E_A fits int8


LAGGED_MIN_WEIGHT_BYTES = 192 << 20  # the GEMM must outlast the side chain it hides (~41–67 µs)


def lagged_applies(moe: bool, rows: int, weights_shape: tuple[int, int, int]) -> bool:
    """Whether a launch of ``rows`` per expert over (E, N, K) int8 weights mines lagged: dense
    decode shapes only (the fused A side's row counts; the pipeline refuses lagged MoE), and only
    where the GEMM streams enough weight bytes to hide the side stream's hash chain. H200, eighth
    session (docs/perf/int7-h200.md): with the chain split over ~64 programs (~67 µs alone at
    GLM-5, ~41 at Qwen3) GLM-5 FC1 (805 MB) lags at 259.6 vs 274.8 µs same-launch and Qwen3-235B
    FC1 (192 MiB, a 62 µs GEMM) at 96.2 vs 111.8; smaller launches were not measured and stay
    same-launch (the one-program chain of the seventh session, ~130 µs, lost at Qwen3)."""
    experts, n, k = weights_shape
    return not moe and fused_applies(rows, k, RANK) and experts * n * k >= LAGGED_MIN_WEIGHT_BYTES


def quantize_weights(weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per output column (last-dim rows) symmetric int7: codes int8 and float32 scales, w ≈ q·s.

    scale = max|w| / 64 (1 for an all-zero row), q = round-half-even(w / scale) clamped to ±64,
    the rule the pipeline applies to activations.
    """
    values = weights.detach().float()
    amax = values.abs().amax(dim=-1)
    scales = torch.where(amax > 0, amax / INT7_LIMIT, torch.ones_like(amax))
    codes = torch.round(values / scales.unsqueeze(-1)).clamp_(-INT7_LIMIT, INT7_LIMIT).to(torch.int8)
    return codes.contiguous(), scales.contiguous()


@dataclass(frozen=True)
class _Weights:
    key: tuple[int, int, tuple[int, ...]]
    codes: torch.Tensor  # (E, N, K) int8 in [-64, 64]
    scales: torch.Tensor  # (E, N) float32


def int7_proof(job: MiningJob, proof: PlainProof) -> BuiltProof:
    """The wire form (legacy for V1) and the public data of an INT7 plain proof."""
    cert = job.cert_version
    return BuiltProof(proof.to_base64(legacy=cert == 1), public_data(job.header76, proof, cert_version=cert), cert)


def verify_int7(record: WinnerRecord, built: BuiltProof) -> tuple[bool, str]:
    """proof.int7's plain-proof verifier on the submitted bytes, at the job's difficulty."""
    proof = PlainProof.from_base64(built.proof_b64)
    return verify_plain_proof(record.job.header76, proof, bits=record.job.bits, cert_version=built.cert_version)


class GpuInt7Backend:
    """The INT7 MiningBackend of one MoE layer on its weights' device."""

    def __init__(self, mode: Mode, layer_id: int, experts: int, top_k: int, *,
                 lagged_decode: bool = True) -> None:
        if mode not in (Mode.INT7_MOE, Mode.INT7_DENSE):
            raise ValueError(f"GpuInt7Backend mines int7-moe or int7-dense, not {mode.value}")
        self.name = f"gpu-{mode.value}"
        self.mode, self.layer_id, self.experts, self.top_k = mode, layer_id, experts, top_k
        self.moe = mode == Mode.INT7_MOE
        self.lagged_decode = lagged_decode
        self._lock = threading.Lock()  # launches and job changes; proofs only read retained state
        self._weights: _Weights | None = None
        self._job: MiningJob | None = None
        self._device_job: DeviceJob | None = None
        self._side: SideWork | None = None
        self._passes: dict[tuple[int, int], MinedPass] = {}
        self._lag_credit: dict[tuple[int, int], tuple[int, int]] = {}  # lagged pass → its pending rows' credit
        self._reported: set[bytes] = set()

    def prepare_job(self, job: MiningJob, weights: torch.Tensor) -> None:
        """Quantise (once per weights) and prepare the job's B side on a side stream."""
        experts, n, k = weights.shape
        if experts != self.experts:
            raise ValueError(f"weights hold {experts} experts, the layer has {self.experts}")
        if n % ROW_BLOCK:
            raise ValueError(f"FC1 has {n} columns per expert; the mined GEMM needs a multiple of {ROW_BLOCK}")
        # contiguous lottery tiles, 2 rows × the mined GEMM's block width (2 × 128 where N allows)
        h, w = lottery_tile(n, k, RANK, moe=self.moe)
        config = MiningConfig(k, RANK, tuple(range(h)), tuple(range(w)),
                              experts if self.moe else 0, self.top_k if self.moe else 0)
        config.check_limits()
        side = SideWork(weights.device)
        with self._lock, device_exclusive(weights.device):
            if self._device_job is not None and weights.device.type == "cuda":
                # launches still in flight read the old job's tensors (allocated on a side stream):
                # let them finish before those tensors can be freed and their memory reused
                torch.cuda.current_stream(weights.device).synchronize()
            with side.run():
                cached = self._quantized(weights)
                device_job = prepare_device_job(cached.codes, cached.scales, header76=job.header76,
                                                config=config, cert_version=job.cert_version,
                                                bound=mining_bound(job.bits, config, job.cert_version),
                                                moe=self.moe, stream=side.stream)
            self._job, self._device_job, self._side = job, device_job, side
            self._passes, self._lag_credit, self._reported = {}, {}, set()

    def _quantized(self, weights: torch.Tensor) -> _Weights:
        key = (weights.data_ptr(), weights._version, tuple(weights.shape))
        if self._weights is None or self._weights.key != key:
            self._weights = _Weights(key, *quantize_weights(weights))
        return self._weights

    def mine_launch(self, activations: torch.Tensor, routing: torch.Tensor) -> LaunchResult:
        with self._lock, device_exclusive(activations.device):
            job, device_job, side = self._job, self._device_job, self._side
            if job is None or device_job is None or side is None:
                raise RuntimeError("mine_launch before prepare_job")
            side.ready()
            plan = layout(routing, self.experts, ROW_BLOCK, moe=self.moe)
            shape, mined = self._pass(device_job, plan)
            x = activations.detach()
            if self.moe:  # the phantom tokens are zero rows after the real ones
                tokens = torch.cat([x, x.new_zeros(plan.phantoms, x.shape[1])])
                out = mined.run(tokens, plan.row_token.view(self.experts, -1).to(torch.int32))
            else:  # row T is the zero row that pads each expert's instance
                rows = torch.cat([x, x.new_zeros(1, x.shape[1])]).index_select(0, plan.row_token)
                out = mined.run(rows.view(self.experts, plan.rows, -1))
            n = out.shape[-1]
            output = out.view(-1, n).index_select(0, plan.slot_of).view(*routing.shape, n).to(activations.dtype)
            winners = self._winners(job)
            h, w = device_job.config.h, device_job.config.w
            credit = (plan.credited_rows(h) * n * activations.shape[1], self.experts * (plan.rows // h) * (n // w))
            if mined.lagged:  # this launch hashed the previous launch's rows; its own are hashed next
                credit, self._lag_credit[shape] = self._lag_credit.get(shape, (0, 0)), credit
        return LaunchResult(output, winners, *credit)

    def _pass(self, device_job: DeviceJob, plan: Layout) -> tuple[tuple[int, int], MinedPass]:
        """The pass of this launch shape (rows per expert; MoE: and the instance's token count)."""
        shape = (plan.rows, plan.tokens + plan.phantoms if self.moe else 0)
        mined = self._passes.get(shape)
        if mined is None:
            if len(self._passes) >= MAX_PASSES:
                evicted = next(iter(self._passes))
                self._passes.pop(evicted)
                self._lag_credit.pop(evicted, None)
            lagged = self.lagged_decode and lagged_applies(self.moe, plan.rows, tuple(device_job.bt.shape))
            mined = MinedPass(device_job, plan.rows, tokens=shape[1] if self.moe else None, lagged=lagged)
            self._passes[shape] = mined
        return shape, mined

    def _winners(self, job: MiningJob) -> list[WinnerRecord]:
        """Records whose doorbell rang and that were not reported yet (one per held pass)."""
        found = []
        for mined in self._passes.values():
            record = mined.winner_record()
            if record is None or record["ticket"] in self._reported:
                continue
            self._reported.add(record["ticket"])
            found.append(WinnerRecord(job, self.mode.value, self.layer_id, record["instance"], record["t_rows"],
                                      record["t_cols"], record["ticket"], mined))
        return found

    def build_proof(self, record: WinnerRecord) -> BuiltProof:
        """Open the held winner from the pass's snapshot and the job's B side; re-arm the pass."""
        mined: MinedPass = record.retained
        with device_exclusive(mined.job.bt.device):
            return self._open(mined, record)

    def _open(self, mined: MinedPass, record: WinnerRecord) -> BuiltProof:
        """The proof of the record the pass still holds (the ticket must match); re-arms the pass."""
        try:
            held = mined.winner_record()
            if held is None or held["ticket"] != record.ticket:
                raise RuntimeError(f"layer {self.layer_id}: the pass no longer holds this winner")
            proof = mined.take_proof()
        finally:
            mined.slot.rearm()
        if proof is None:
            raise RuntimeError(f"layer {self.layer_id}: the winner vanished while its proof was built")
        return int7_proof(record.job, proof)

    def verify(self, record: WinnerRecord, built: BuiltProof) -> tuple[bool, str]:
        return verify_int7(record, built)
