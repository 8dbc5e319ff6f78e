"""INT7 mining on the CPU (certificates V1–V3): the MoE form and the dense-only fallback.

The expert GEMM is computed from the committed int7 operands: activations quantised per token
and weights per output column to [-64, 64], multiplied exactly (float32 is exact here:
64·64·k <= 2^24 for k <= 4096) and scaled back. That integer product is what the peel recovers
from A'·B', so the served output is the mined product. Everything protocol-side is proof.int7:
``commit_instance`` (commitments, seeds, noise), ``instance_tickets`` (transcripts, tickets),
``build_proof`` and ``public_data`` from the retained instance, ``verify_plain_proof``.

- ``int7-moe``: one instance per launch over all routed tokens (routing folded into s_A),
  tiles over each expert's positions (int-protocol.md §7).
- ``int7-dense``: the dense-only fallback; each expert's GEMM is its own dense instance
  (A = that expert's tokens, B = that expert's FC1); V3 salting binds each instance's m and n.

On the CPU the B side is committed and noised with each launch's instance (proof.int7 does both
together); ``prepare_job`` fixes the job's configuration, quantised weights and bound.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from miner.backend import BuiltProof, LaunchResult, WinnerRecord, expert_token_lists
from miner.jobs import MiningJob
from miner.modes import Mode
from proof.int7 import (MiningConfig, PlainProof, build_proof, commit_instance,
                        instance_tickets, mining_bound, public_data, ticket_value, verify_plain_proof)

RANK = 128
ROWS = (0, 1, 2, 3)  # contiguous 4-row tiles: an expert with 4 routed tokens already mines
COLS = (0, 1, 8, 9, 32, 33, 40, 41)  # Pearl's default column pattern (period 64)
QMAX = 64


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-row int7 codes in [-64, 64] and their float32 scales (x ≈ codes · scale)."""
    x = np.asarray(x, dtype=np.float32)
    scale = np.abs(x).max(axis=1) / QMAX
    scale[scale == 0] = 1.0
    codes = np.clip(np.rint(x / scale[:, None]), -QMAX, QMAX).astype(np.int8)
    return codes, scale.astype(np.float32)


def int_product(a_codes: np.ndarray, bt_codes: np.ndarray) -> torch.Tensor:
    """A·Bᵀ of int7 codes (float32, exact for k <= 4096)."""
    return torch.from_numpy(a_codes.astype(np.float32)) @ torch.from_numpy(bt_codes.astype(np.float32)).T


@dataclass(frozen=True)
class _Prepared:
    job: MiningJob
    config: MiningConfig
    bound: int
    bt_codes: np.ndarray  # (experts · n_out, k) int8
    b_scales: np.ndarray  # (experts · n_out,) float32
    n_out: int


class CpuInt7Backend:
    """The INT7 MiningBackend on the CPU for one MoE layer."""

    def __init__(self, mode: Mode, layer_id: int, experts: int, top_k: int) -> None:
        if mode not in (Mode.INT7_MOE, Mode.INT7_DENSE):
            raise ValueError(f"CpuInt7Backend mines int7-moe or int7-dense, not {mode.value}")
        self.name = f"cpu-{mode.value}"
        self.mode, self.layer_id, self.experts, self.top_k = mode, layer_id, experts, top_k
        self.prepared: _Prepared | None = None

    def prepare_job(self, job: MiningJob, weights: torch.Tensor) -> None:
        """Fix the job's configuration and bound; quantise FC1 (experts, n_out, k) per column."""
        experts, n_out, k = weights.shape
        if experts != self.experts:
            raise ValueError(f"weights hold {experts} experts, the layer has {self.experts}")
        moe = self.mode == Mode.INT7_MOE
        config = MiningConfig(k, RANK, ROWS, COLS, experts if moe else 0, self.top_k if moe else 0)
        config.check_limits()
        codes, scales = quantize_rows(weights.detach().reshape(experts * n_out, k).float().numpy())
        self.prepared = _Prepared(job, config, mining_bound(job.bits, config, job.cert_version),
                                  codes, scales, n_out)

    def mine_launch(self, activations: torch.Tensor, routing: torch.Tensor) -> LaunchResult:
        prep = self.prepared
        if prep is None:
            raise RuntimeError("mine_launch before prepare_job")
        a_codes, a_scales = quantize_rows(activations.detach().float().numpy())
        tokens = expert_token_lists(routing, self.experts)
        if self.mode == Mode.INT7_MOE:
            groups = [(None, commit_instance(prep.job.header76, prep.config, a_codes, prep.bt_codes,
                                             cert_version=prep.job.cert_version, routing=tokens))]
        else:
            groups = [(e, commit_instance(prep.job.header76, prep.config, a_codes[toks],
                                          prep.bt_codes[e * prep.n_out:(e + 1) * prep.n_out],
                                          cert_version=prep.job.cert_version))
                      for e, toks in enumerate(tokens) if len(toks) >= len(ROWS)]
        winners: list[WinnerRecord] = []
        tickets = 0
        for expert, instance in groups:
            for win in instance_tickets(instance):
                tickets += 1
                if ticket_value(win.ticket) <= prep.bound:
                    win_expert = win.expert if expert is None else expert
                    winners.append(WinnerRecord(prep.job, self.mode.value, self.layer_id, win_expert,
                                                win.t_rows, win.t_cols, win.ticket, (instance, win)))
        return LaunchResult(self._output(prep, activations, routing, tokens, a_codes, a_scales),
                            winners, self._credited(prep, tokens), tickets)

    def _credited(self, prep: _Prepared, tokens: list[list[int]]) -> int:
        """Work credited: every expert's rows that form whole lottery tiles, × n_out × k."""
        period = prep.config.rows_pattern.period
        rows = sum(len(t) - len(t) % period for t in tokens)
        return rows * prep.n_out * prep.config.common_dim

    def _output(self, prep: _Prepared, activations: torch.Tensor, routing: torch.Tensor,
                tokens: list[list[int]], a_codes: np.ndarray, a_scales: np.ndarray) -> torch.Tensor:
        output = activations.new_zeros(routing.shape[0], routing.shape[1], prep.n_out)
        for e, toks in enumerate(tokens):
            if not toks:
                continue
            cols = slice(e * prep.n_out, (e + 1) * prep.n_out)
            product = int_product(a_codes[toks], prep.bt_codes[cols])
            product *= torch.from_numpy(a_scales[toks])[:, None] * torch.from_numpy(prep.b_scales[cols])
            tok = torch.tensor(toks)
            slot = (routing[tok] == e).to(torch.int64).argmax(dim=1)
            output[tok, slot] = product.to(output.dtype)
        return output

    def build_proof(self, record: WinnerRecord) -> BuiltProof:
        """Open the winning tile from the retained instance: PlainProof plus its public data."""
        instance, win = record.retained
        proof = build_proof(instance, win)
        cert = record.job.cert_version
        return BuiltProof(proof.to_base64(legacy=cert == 1),
                          public_data(record.job.header76, proof, cert_version=cert), cert)

    def verify(self, record: WinnerRecord, built: BuiltProof) -> tuple[bool, str]:
        proof = PlainProof.from_base64(built.proof_b64)
        return verify_plain_proof(record.job.header76, proof, bits=record.job.bits,
                                  cert_version=built.cert_version)
