"""Rank 0's share of the host: the one job poller, the one submitter, and the control state.

The other ranks learn the job, the mode preference, pause and when to stop from the ``Control``
rank 0 broadcasts at every step (``sync``); their winners arrive through the relay (``winners``)
and go to the same completion thread a single-process worker uses (checks, rules, one proof per
job, persistence of unsent proofs); their figures arrive with every step, so rank 0 can report
the whole host live.
"""
from __future__ import annotations

import threading
import time
from collections import Counter, deque

from miner.accounting import MiningStats
from miner.completion import CompletionWorker
from miner.events import EventBus
from miner.expert_parallel.sync import Control
from miner.expert_parallel.winners import CompletionSink, RelayedWinner, WinnerSink
from miner.governor import check_cap, slowdown_cap_text
from miner.jobs import JobPoller, JobSource, MiningJob
from miner.modes import CHOICES
from miner.persistence import SubmissionStore
from miner.worker import WorkerConfig


class HostSide:
    def __init__(self, config: WorkerConfig, source: JobSource, stats: MiningStats,
                 sink: WinnerSink | None = None) -> None:
        self.config, self.source, self.stats = config, source, stats
        self.events = EventBus()
        self.store = SubmissionStore(config.data_dir)
        self.poller = JobPoller(source, interval=config.poll_interval)
        self.completion = CompletionWorker(source, self.store, stats, self.events, config.network,
                                           lambda: self.poller.current)
        self.sink: WinnerSink = sink or CompletionSink(self.completion, stats, self.events)
        self.relayed_by_rank: Counter[int] = Counter()
        self.fleet: list[dict[str, int]] = []  # every rank's latest figures
        self._work: deque[tuple[float, int]] = deque()  # (time, credited work of all ranks)
        self.paused = ""
        self.preference = config.mode
        self.max_slowdown = config.max_slowdown
        self.stop_requested = threading.Event()
        self.started = time.monotonic()
        self.poller.subscribe(self._on_job)

    def _on_job(self, job: MiningJob | None) -> None:
        if job is None:
            self.events.publish("source_down", f"job retired, mining paused: {self.poller.last_error}")
        else:
            self.events.publish("job", f"job {job.job_id} cert V{job.cert_version}")
        self.completion.wake()

    def control(self) -> Control:
        """What every rank applies at this step."""
        return Control(self.poller.current, self.preference, bool(self.paused), self.finished(), self.max_slowdown)

    def finished(self) -> bool:
        c = self.config
        if self.stop_requested.is_set():
            return True
        if c.duration_s is not None and time.monotonic() - self.started >= c.duration_s:
            return True
        return c.max_blocks is not None and self.stats.accepted >= c.max_blocks

    def deliver(self, relayed: list[RelayedWinner]) -> None:
        for winner in relayed:
            self.relayed_by_rank[winner.rank] += 1
            self.sink.deliver(winner)

    def record_figures(self, fleet: list[dict[str, int]]) -> None:
        """The ranks' figures of this step; keeps the work totals of the last ``stats.window_s``."""
        self.fleet = fleet
        now = time.monotonic()
        self._work.append((now, sum(rank["credited_work"] for rank in fleet)))
        while self._work[0][0] < now - self.stats.window_s:
            self._work.popleft()

    def total(self, name: str) -> int:
        return sum(rank[name] for rank in self.fleet)

    @property
    def hashrate(self) -> float:
        """Credited work per second of all ranks over the window (as ``MiningStats.hashrate``)."""
        if len(self._work) < 2:
            return 0.0
        (first, work0), (last, work1) = self._work[0], self._work[-1]
        return (work1 - work0) / max(last - first, 1.0)

    # -- control (the gRPC service on rank 0) -------------------------------------------------
    def pause(self, reason: str) -> None:
        self.paused = reason or "paused"
        self.events.publish("paused", self.paused)

    def resume(self) -> None:
        self.paused = ""
        self.events.publish("resumed", "mining resumed")

    def set_mode(self, mode: str) -> None:
        if mode not in CHOICES:
            raise ValueError(f"mode {mode!r} is not one of {CHOICES}")
        self.preference = mode
        self.events.publish("mode_preference", f"mode preference set to {mode}")

    def set_max_slowdown(self, max_slowdown: float | None) -> None:
        """Every rank's new slowdown cap (None: none), from the next step's Control."""
        check_cap(max_slowdown)
        self.max_slowdown = max_slowdown
        self.events.publish("slowdown", slowdown_cap_text(max_slowdown))

    def check_blocks(self) -> None:
        """Account the blocks of submitted jobs the chain has moved past (accepted or not)."""
        self.completion.account_blocks(self.poller.current)

    def start(self) -> None:
        pending = self.store.load_pending()
        if pending:
            self.completion.retry_later(pending)
        self.completion.start()
        self.poller.start()

    def shutdown(self) -> int:
        """Stop polling, drain the completion thread; returns how many proofs were persisted."""
        self.poller.stop()
        kept = self.completion.stop()
        self.check_blocks()
        self.events.publish("stopped", f"expert-parallel host stopped; {len(kept)} proof(s) persisted")
        return len(kept)
