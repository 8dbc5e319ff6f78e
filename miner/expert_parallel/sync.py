"""The per-step exchange between ranks, on a gloo group (host memory, never a GPU stream).

Before every forward pass rank 0 hands every rank its ``Control`` (the current job, the mode
preference, whether mining is paused, whether to stop) and every rank hands rank 0 its finished
winners and its running figures (tokens served, work credited, ...). Steps are lockstep points all
ranks pass anyway (each forward holds all-to-alls), so one poller serves the host: the other
ranks never talk to the job source, and every rank mines the same job from the same step on.

A step costs one small all-gather of an int64 header per rank (rank 0's Control serial, the
rank's winner count, the rank's figures); the Control itself is broadcast only when its serial
moved, and the winners are gathered only when some rank has any. Every rank reads the same
headers, so every rank makes the same collective calls.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from miner.expert_parallel.winners import RelayedWinner
from miner.jobs import MiningJob


@dataclass(frozen=True)
class Control:
    job: MiningJob | None
    preference: str  # the mode preference (auto, off or a mode)
    paused: bool
    stop: bool
    max_slowdown: float | None = None  # every rank's slowdown cap (miner.governor); None: none


class StepSync:
    def __init__(self, rank: int, world_size: int, group: dist.ProcessGroup | None = None) -> None:
        self.rank, self.world_size, self.group = rank, world_size, group
        self.control: Control | None = None  # the last Control broadcast
        self.seen = 0  # its serial (the same on every rank)
        self.serial = 0  # rank 0: the serial of the Control it supplies

    def exchange(self, control: Control | None, winners: list[RelayedWinner],
                 figures: list[int]) -> tuple[Control, list[RelayedWinner], list[list[int]]]:
        """Rank 0 passes its Control, the others None; every rank passes its figures (the same
        number of integers on every rank). Returns rank 0's Control, on rank 0 every rank's
        winners in rank order (an empty list elsewhere), and every rank's figures."""
        if (control is None) != (self.rank != 0):
            raise ValueError("rank 0, and only rank 0, supplies the Control")
        if control is not None and control != self.control:
            self.serial += 1
        header = torch.tensor([self.serial, len(winners), *figures], dtype=torch.int64)
        headers = [torch.empty_like(header) for _ in range(self.world_size)]
        dist.all_gather(headers, header, group=self.group)
        serial = int(headers[0][0])
        if serial != self.seen:
            self.control, self.seen = self._broadcast(control), serial
        if self.control is None:
            raise RuntimeError("no Control was ever broadcast")
        gathered = self._gather(winners) if any(int(h[1]) for h in headers) else []
        return self.control, gathered, [h[2:].tolist() for h in headers]

    def _broadcast(self, control: Control | None) -> Control:
        box: list[object] = [control]
        dist.broadcast_object_list(box, src=0, group=self.group)
        if not isinstance(box[0], Control):
            raise TypeError(f"rank 0 broadcast {type(box[0]).__name__}, not a Control")
        return box[0]

    def _gather(self, winners: list[RelayedWinner]) -> list[RelayedWinner]:
        boxes: list[object] | None = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(winners, boxes, dst=0, group=self.group)
        if boxes is None:
            return []
        return [w for box in boxes for w in box]  # type: ignore[union-attr]
