"""The mined layer: the FC1 launcher installed in each MoE block.

It serves every launch; a launch mines when a backend is prepared for the current job, mining
is not paused or cooling down after an OOM, and the launch has enough tokens to fill tiles.
Anything else, or any failure inside mining (out of host or device memory included), serves the
same GEMM unmined and is reported to the worker, which cools mining down.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from miner.accounting import MiningStats
from miner.backend import MiningBackend, WinnerRecord
from miner.model.moe import grouped_fc1

log = logging.getLogger(__name__)


class MinedLayer:
    def __init__(self, layer_id: int, stats: MiningStats, may_mine: Callable[[], bool],
                 on_winner: Callable[[MiningBackend, WinnerRecord], object],
                 on_fault: Callable[[Exception], None], min_tokens: int) -> None:
        self.layer_id, self.stats = layer_id, stats
        self.may_mine, self.on_winner, self.on_fault = may_mine, on_winner, on_fault
        self.min_tokens = min_tokens
        self.backend: MiningBackend | None = None  # swapped in by the job thread once prepared

    def launch(self, x: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor) -> torch.Tensor:
        backend = self.backend
        if backend is None or x.shape[0] < self.min_tokens or not self.may_mine():
            self.stats.add("launches_unmined")
            return grouped_fc1(x, topk_ids, w13)
        try:
            result = backend.mine_launch(x, topk_ids)
        except Exception as exc:  # mining must never take inference down: serve unmined
            log.warning("layer %d: mining failed: %s", self.layer_id, exc)
            self.on_fault(exc)
            self.stats.add("launches_unmined")
            return grouped_fc1(x, topk_ids, w13)
        self.stats.credit(result.credited_work, result.tickets)
        for record in result.winners:
            self.on_winner(backend, record)
        return result.output
