"""Shared pieces of the expert-parallel tests (no tests here): spawning ranks on 127.0.0.1 with
gloo, a mining job, and a backend that plants known winners."""
from __future__ import annotations

import itertools
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from miner.backend import BuiltProof, LaunchResult, WinnerRecord
from miner.expert_parallel.distributed import EPContext, connect, disconnect
from miner.jobs import MiningJob
from miner.model.moe import grouped_fc1
from proof.chain import sha256d, target_from_bits

REGTEST_BITS = 0x207FFFFF  # every ticket wins: planted-difficulty winners on the CPU


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, body: Callable[..., Any], args: tuple[Any, ...]) -> None:
    torch.set_num_threads(1)  # the ranks share two cores
    ctx = connect(rank, world, "cpu", f"tcp://127.0.0.1:{port}", timeout_s=120)
    try:
        body(ctx, *args)
    finally:
        disconnect()


def run_ranks(world: int, body: Callable[..., Any], *args: Any) -> None:
    """Run ``body(ctx, *args)`` on ``world`` spawned ranks (a module-level function)."""
    mp.spawn(_entry, args=(world, free_port(), body, args), nprocs=world, join=True)


def job(nonce: int = 0, cert_version: int = 3, height: int = 10) -> MiningJob:
    header = bytes([nonce]) * 72 + REGTEST_BITS.to_bytes(4, "little")
    return MiningJob.of(header, target_from_bits(REGTEST_BITS), cert_version, height=height)


def fp8_job(height: int = 10) -> MiningJob:
    """A cert V4 job whose header builds on its (all-zero) parent header."""
    parent = bytes(108)
    header = bytes(4) + sha256d(parent) + bytes(36) + REGTEST_BITS.to_bytes(4, "little")
    return MiningJob.of(header, target_from_bits(REGTEST_BITS), 4, (parent,), height=height)


class PlantedBackend:
    """Computes FC1 with the reference op and plants one winner per local expert with rows in
    every launch, each with a ticket no other planted winner of the process has; ``emitted``
    lists what it planted (expert ids local to the rank)."""

    name = "planted"
    serials = itertools.count()

    def __init__(self, layer_id: int) -> None:
        self.layer_id = layer_id
        self.job: MiningJob | None = None
        self.weights: torch.Tensor | None = None
        self.launches = 0
        self.emitted: list[WinnerRecord] = []

    def prepare_job(self, job: MiningJob, weights: torch.Tensor) -> None:
        self.job, self.weights = job, weights

    def mine_launch(self, activations: torch.Tensor, routing: torch.Tensor) -> LaunchResult:
        assert self.job is not None and self.weights is not None
        self.launches += 1
        winners = [WinnerRecord(self.job, "planted", self.layer_id, expert, self.launches, expert,
                                next(self.serials).to_bytes(32, "little"), None)
                   for expert in torch.unique(routing).tolist()]
        self.emitted.extend(winners)
        return LaunchResult(grouped_fc1(activations, routing, self.weights), winners, 1, len(winners))

    def build_proof(self, record: WinnerRecord) -> BuiltProof:
        return BuiltProof("proof-" + record.ticket.hex(), b"", record.job.cert_version)

    def verify(self, record: WinnerRecord, built: BuiltProof) -> tuple[bool, str]:
        return True, "ok"


def save(path: Path, rank: int, value: Any) -> None:
    torch.save(value, path / f"rank{rank}.pt")


def load_all(path: Path, world: int) -> list[Any]:
    return [torch.load(path / f"rank{r}.pt", weights_only=False) for r in range(world)]


__all__ = ["EPContext", "PlantedBackend", "fp8_job", "free_port", "job", "load_all", "run_ranks", "save"]
