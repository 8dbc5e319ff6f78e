"""FP8 MoE mining on the CPU (certificate V4), with proof.fp8's reference miner.

Each mined launch runs ``proof.fp8.mine_cpu`` over the launch's activations and the stacked FC1
weights (B = experts · n_out rows, σ_d = the parent header, Hopper's device model): it
pre-quantises and commits both operands, binds the routing, noises, multiplies on the bit-exact
FP8 model, folds and hashes every tile and returns the first admissible winner's PlainProofV4
already checked by its own verifier (the GPU's first-winner latch keeps one per launch too).
On the CPU the B side is rebuilt with every launch; the GPU backend prepares it once per job.

The served output is the product of the committed operands' opened values (RNE_bf16(q·s)),
which is what the peel and unscale recover on the GPU.
"""
from __future__ import annotations

import numpy as np
import torch

from miner.backend import FP8_CERT_VERSION, BuiltProof, LaunchResult, WinnerRecord, check_fp8_job
from miner.jobs import MiningJob
from miner.modes import Mode
from proof.fp8 import Device, mine_cpu, open_values, prequantize, verify_plain_proof
from proof.fp8.bf16 import bf16_to_f32



def opened(values: np.ndarray) -> np.ndarray:
    """The committed operand as float32: pre-quantised, then opened as the verifier opens it."""
    return bf16_to_f32(open_values(*prequantize(values)))


class CpuFp8Backend:
    """The FP8 (V4) MiningBackend on the CPU for one MoE layer."""

    def __init__(self, layer_id: int, experts: int, device: Device = Device.HOPPER) -> None:
        self.name = f"cpu-{Mode.FP8_MOE.value}"
        self.layer_id, self.experts, self.device = layer_id, experts, device
        self.job: MiningJob | None = None
        self.b_values: np.ndarray | None = None
        self.b_opened: np.ndarray | None = None

    def prepare_job(self, job: MiningJob, weights: torch.Tensor) -> None:
        experts, n_out, k = check_fp8_job(job, weights, self.experts)
        self.b_values = weights.detach().reshape(experts * n_out, k).float().numpy()
        self.b_opened = opened(self.b_values)
        self.job = job

    def mine_launch(self, activations: torch.Tensor, routing: torch.Tensor) -> LaunchResult:
        job, b_values, b_opened = self.job, self.b_values, self.b_opened
        if job is None or b_values is None or b_opened is None:
            raise RuntimeError("mine_launch before prepare_job")
        a_values = activations.detach().float().numpy()
        ids = routing.detach().numpy()
        result = mine_cpu(job.header76, a_values, b_values, ancestor_header=job.ancestor_headers[0],
                          device=self.device, target=job.target, topk_ids=ids, experts=self.experts)
        winners = []
        if result.proof is not None and result.public_data is not None:
            statement = result.public_data
            expert = statement.moe.w if statement.moe is not None else 0
            winners.append(WinnerRecord(job, Mode.FP8_MOE.value, self.layer_id, expert, statement.t_a,
                                        statement.t_b, statement.jackpot, (result.proof, statement)))
        return LaunchResult(self._output(a_values, ids, b_opened), winners, result.work, result.tiles)

    def _output(self, a_values: np.ndarray, ids: np.ndarray, b_opened: np.ndarray) -> torch.Tensor:
        a = torch.from_numpy(opened(a_values))
        b = torch.from_numpy(b_opened).view(self.experts, -1, b_opened.shape[1])
        out = torch.zeros(ids.shape[0], ids.shape[1], b.shape[1])
        for e in np.unique(ids).tolist():
            tok, slot = np.nonzero(ids == e)
            out[tok, slot] = a[tok] @ b[e].T
        return out

    def build_proof(self, record: WinnerRecord) -> BuiltProof:
        proof, statement = record.retained
        return BuiltProof(proof.to_base64(), statement.to_bytes(), FP8_CERT_VERSION)

    def verify(self, record: WinnerRecord, built: BuiltProof) -> tuple[bool, str]:
        return verify_plain_proof(record.job.header76, built.proof_b64, target=record.job.target,
                                  public_data=built.public_data)
