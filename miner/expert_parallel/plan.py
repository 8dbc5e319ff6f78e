"""Which rank owns which experts: contiguous blocks, as even as the counts allow.

Rank r owns experts ``[first(r), first(r + 1))`` with ``first(r) = r * E // W``; every rank owns
at least one expert. Contiguous blocks keep each rank's weights one slice of the stacked tensors.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ExpertPlan:
    num_experts: int
    world_size: int

    def __post_init__(self) -> None:
        if self.world_size <= 0:
            raise ValueError(f"world_size must be positive, got {self.world_size}")
        if self.num_experts < self.world_size:
            raise ValueError(f"{self.num_experts} experts cannot be shared by {self.world_size} ranks: "
                             "every rank must own at least one expert")

    def first(self, rank: int) -> int:
        """The first expert of ``rank`` (``first(world_size)`` is ``num_experts``)."""
        if not 0 <= rank <= self.world_size:
            raise ValueError(f"rank {rank} is outside 0..{self.world_size}")
        return rank * self.num_experts // self.world_size

    def local_count(self, rank: int) -> int:
        return self.first(rank + 1) - self.first(rank)

    def local_slice(self, rank: int) -> slice:
        return slice(self.first(rank), self.first(rank + 1))

    def boundaries(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """``first(r)`` for r = 0..W (W + 1 values), for vectorised ownership."""
        return torch.tensor([self.first(r) for r in range(self.world_size + 1)], dtype=torch.int64,
                            device=device)

    def owners(self, experts: torch.Tensor) -> torch.Tensor:
        """The owning rank of each global expert id (same shape, int64)."""
        return owners(experts, self.boundaries(experts.device))


def owners(experts: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
    """The owning rank of each expert id, given a plan's ``boundaries()`` on the same device."""
    return torch.bucketize(experts.to(torch.int64), bounds[1:], right=True)
