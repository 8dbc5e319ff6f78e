"""The mined layer: the FC1 launcher installed in each MoE block.

It serves every launch; a launch mines when a backend is prepared for the current job, mining
is not paused or cooling down after an OOM, the launch has enough tokens to fill tiles and the
slowdown budget (`miner.governor`) admits it. Anything else, or any failure inside mining (out of
host or device memory included), serves the same GEMM unmined; a failure is reported to the
worker, which cools mining down. Every launch is timed for the governor.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from miner.accounting import MiningStats
from miner.backend import MiningBackend, WinnerRecord
from miner.governor import SlowdownGovernor
from miner.model.moe import grouped_fc1

log = logging.getLogger(__name__)


class MinedLayer:
    def __init__(self, layer_id: int, stats: MiningStats, may_mine: Callable[[], bool],
                 on_winner: Callable[[MiningBackend, WinnerRecord], object],
                 on_fault: Callable[[Exception], None], min_tokens: int,
                 governor: SlowdownGovernor | None = None) -> None:
        self.layer_id, self.stats = layer_id, stats
        self.may_mine, self.on_winner, self.on_fault = may_mine, on_winner, on_fault
        self.min_tokens = min_tokens
        self.governor = governor or SlowdownGovernor()  # shared by a worker's layers: one budget
        self.backend: MiningBackend | None = None  # swapped in by the job thread once prepared

    def launch(self, x: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor) -> torch.Tensor:
        backend = self.backend
        tokens = x.shape[0]
        if backend is None or tokens < self.min_tokens or not self.may_mine():
            return self._unmined(x, topk_ids, w13)
        reserved = self.governor.admit(tokens)
        if reserved is None:
            self.stats.add("launches_held")
            return self._unmined(x, topk_ids, w13)
        try:
            with self.governor.timed(x, tokens, mined=True, reserved=reserved):
                result = backend.mine_launch(x, topk_ids)
        except Exception as exc:  # mining must never take inference down: serve unmined
            log.warning("layer %d: mining failed: %s", self.layer_id, exc)
            self.on_fault(exc)
            return self._unmined(x, topk_ids, w13)
        self.stats.credit(result.credited_work, result.tickets)
        for record in result.winners:
            self.on_winner(backend, record)
        return result.output

    def _unmined(self, x: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor) -> torch.Tensor:
        self.stats.add("launches_unmined")
        with self.governor.timed(x, x.shape[0], mined=False):
            return grouped_fc1(x, topk_ids, w13)
