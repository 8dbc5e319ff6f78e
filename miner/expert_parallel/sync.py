"""The per-step exchange between ranks, on a gloo group (host memory, never the GPU stream).

Before every forward pass rank 0 broadcasts a ``Control`` (the current job, the mode preference,
whether mining is allowed, whether to stop) and gathers every rank's finished winners. Steps are
the lockstep points all ranks pass anyway (each forward holds all-to-alls), so one poller serves
the host: the other ranks never talk to the job source, and every rank mines the same job from
the same step on.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from miner.expert_parallel.winners import RelayedWinner
from miner.jobs import MiningJob


@dataclass(frozen=True)
class Control:
    job: MiningJob | None
    preference: str
    mining_allowed: bool
    stop: bool


class StepSync:
    def __init__(self, rank: int, world_size: int, group: dist.ProcessGroup | None = None) -> None:
        self.rank, self.world_size, self.group = rank, world_size, group

    def broadcast_control(self, control: Control | None) -> Control:
        """Rank 0 passes its Control, the others None; every rank returns rank 0's."""
        if (control is None) != (self.rank != 0):
            raise ValueError("rank 0, and only rank 0, supplies the Control")
        box: list[object] = [control]
        dist.broadcast_object_list(box, src=0, group=self.group)
        if not isinstance(box[0], Control):
            raise TypeError(f"rank 0 broadcast {type(box[0]).__name__}, not a Control")
        return box[0]

    def gather_winners(self, winners: list[RelayedWinner]) -> list[RelayedWinner]:
        """Every rank's winners to rank 0 (in rank order); the other ranks get an empty list."""
        boxes: list[object] | None = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(winners, boxes, dst=0, group=self.group)
        if boxes is None:
            return []
        return [w for box in boxes for w in box]  # type: ignore[union-attr]
