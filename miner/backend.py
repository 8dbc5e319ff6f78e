"""The MiningBackend boundary: what a mined layer asks of whatever computes and mines its GEMM.

A backend is created per mined layer and per mode. The CPU backends (``miner.cpu_int7``,
``miner.cpu_fp8``) compute the expert GEMM with torch reference ops and mine with the protocol's
CPU pieces in ``proof/``; the GPU backends (``kernels/``) implement the same four methods.

- ``prepare_job(job, weights)``: per job (per block), the B side: commit the weights, derive the
  B seed and noise. Runs off the serving path (the job thread); launches before it finishes serve
  unmined.
- ``mine_launch(activations, routing)``: the layer's FC1 for the routed tokens, with mining inside;
  returns the output and the winners found (records that retain the operands needed for a proof).
- ``build_proof(record)``: the plain proof and its public data, from the retained operands.
- ``verify(built)``: the protocol's own plain-proof verifier, run before anything is submitted.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from miner.jobs import MiningJob


@dataclass(frozen=True)
class WinnerRecord:
    """A winning lottery tile and what is needed to open it later.

    ``retained`` is backend-specific (the quantised A operand, the routing, the prepared B side);
    the completion thread hands the record back to the backend that produced it.
    """

    job: MiningJob
    mode: str
    layer_id: int
    expert: int
    tile_row: int
    tile_col: int
    ticket: bytes
    retained: Any = field(repr=False, compare=False)


@dataclass(frozen=True)
class BuiltProof:
    """A plain proof ready for checks: base64 for the gateway, public data for the rules."""

    proof_b64: str
    public_data: bytes
    cert_version: int


@dataclass
class LaunchResult:
    output: torch.Tensor
    winners: list[WinnerRecord]
    credited_work: int
    tickets: int


class MiningBackend(Protocol):
    name: str

    def prepare_job(self, job: MiningJob, weights: torch.Tensor) -> None: ...

    def mine_launch(self, activations: torch.Tensor, routing: torch.Tensor) -> LaunchResult: ...

    def build_proof(self, record: WinnerRecord) -> BuiltProof: ...

    def verify(self, record: WinnerRecord, built: BuiltProof) -> tuple[bool, str]: ...


def expert_token_lists(topk_ids: torch.Tensor, experts: int) -> list[list[int]]:
    """Routing R: for each expert, the ascending tokens routed to it (the stable sort of top-k)."""
    ids = topk_ids.to(torch.int64)
    return [torch.nonzero((ids == e).any(dim=1)).flatten().tolist() for e in range(experts)]


FP8_CERT_VERSION = 4


def check_fp8_job(job: MiningJob, weights: torch.Tensor, experts: int) -> tuple[int, int, int]:
    """The checks every FP8 (V4) backend makes on a new job and its weights; returns (e, n, k).

    V4 needs the ancestor headers because the B seed is keyed by the chosen ancestor σ_d.
    """
    if job.cert_version != FP8_CERT_VERSION:
        raise ValueError(f"FP8 mining needs a cert V4 job, got V{job.cert_version}")
    if not job.ancestor_headers:
        raise ValueError("a V4 job must carry its ancestor headers (σ_d = the parent)")
    found, n, k = weights.shape
    if found != experts:
        raise ValueError(f"weights hold {found} experts, the layer has {experts}")
    return found, n, k
