"""Winner record → PlainProofV4 on the host, through proof.fp8's builder (§9.6, §12).

The record names the tile (expert-local TILE_ROW / TILE_COLUMN) and the expert (GROUP_ID); the
latch's payload holds the winning launch's A planes and routing. The A side is re-committed on
the CPU from that payload (and must reproduce the record's jackpot key), B is committed once per
job from the host copy of the weight planes, and proof.fp8.build_plain_proof opens the tile.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from proof.fp8 import lottery, transcript
from proof.fp8.miner import CommittedOperand, build_plain_proof, commit_operand, commit_routing
from proof.fp8.plain_proof import PlainProofV4
from proof.fp8.verify import derive_seeds

from .lottery import LotteryLatch, WinnerRecord
from .pipeline import MinedGemm


class WinnerError(ValueError):
    """A winner record that does not belong to the launch context it is matched with."""


@dataclass
class Winner:
    record: WinnerRecord
    proof: PlainProofV4


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().contiguous().view(torch.int16).numpy().view(np.uint16)


def commit_b(gemm: MinedGemm) -> CommittedOperand:
    """The job's B commitment on the CPU (keyB from the state's σ_d)."""
    assert gemm.job is not None
    key_b = transcript.key_b(gemm.job.ancestor_header)
    return commit_operand(key_b, gemm.b.codes.cpu().numpy(), _bits(gemm.b.scales), gemm.job.b.hash_id)


def take_winner(gemm: MinedGemm, b: CommittedOperand | None = None) -> Winner | None:
    """Read the latch; if it holds this job's winner, build its PlainProofV4 (not re-armed here)."""
    record = gemm.latch.poll()
    if record is None:
        return None
    job = gemm.job
    assert job is not None
    latch: LotteryLatch = gemm.latch
    codes = latch.payload["codes"].cpu().numpy()
    scales = _bits(latch.payload["scales"])
    key_a = transcript.key_a(gemm.header76)
    a = commit_operand(key_a, codes, scales, job.a.hash_id)
    b = b or commit_b(gemm)
    routing = None
    if job.moe is not None:
        offsets = latch.payload["offsets"].cpu().tolist()
        tokens = latch.payload["rflat"].cpu().tolist()
        routing = commit_routing(key_a, tokens, offsets, job.moe)
    seeds = derive_seeds(job, gemm.header76, a.digest, b.digest, routing.roots if routing else None)
    if transcript.jackpot_key(seeds.seed_a) != record.pow_key or seeds.seed_b != record.seed_b:
        raise WinnerError("the record's keys do not match this job's recomputed seeds")
    proof = build_plain_proof(job, a, b, lottery.tile_base(job.a.pattern, record.tile_row),
                              lottery.tile_base(job.b.pattern, record.tile_column),
                              ancestor_chain=gemm.ancestor_chain, routing=routing,
                              expert=record.group_id if job.moe is not None else None)
    return Winner(record, proof)
