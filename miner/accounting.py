"""Counters of the mining side, shared by the serving loop, the completion thread and the service."""
from __future__ import annotations

import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field


# Every integer total of MiningStats, in the order the status display, the gRPC message and the
# Prometheus collector show them (one list, so a new counter cannot be left out of one of them).
COUNTERS = ("credited_work", "tickets", "launches_mined", "launches_unmined", "launches_held", "winners",
            "proofs_built", "verify_failed", "refused_by_rules", "submitted", "accepted",
            "rejected", "persisted", "resubmitted", "dropped_stale", "dropped_backlog", "oom_events",
            "mining_errors")
# Counted where a layer's GEMM runs (every expert-parallel rank) vs where winners are handled.
LAUNCH_COUNTERS = ("credited_work", "tickets", "launches_mined", "launches_unmined", "launches_held",
                   "oom_events", "mining_errors")
SUBMISSION_COUNTERS = tuple(name for name in COUNTERS if name not in LAUNCH_COUNTERS)


@dataclass
class MiningStats:
    """Thread-safe totals; ``hashrate`` is credited work per second over a sliding window.

    Credited work is m·n·k per mined launch (difficulty-normalised, as the official miner counts);
    tickets are the lottery tiles hashed.
    """

    window_s: float = 30.0
    credited_work: int = 0
    tickets: int = 0
    launches_mined: int = 0
    launches_unmined: int = 0
    launches_held: int = 0  # of the unmined: eligible, but held back by the slowdown budget
    winners: int = 0
    proofs_built: int = 0
    verify_failed: int = 0
    refused_by_rules: int = 0
    submitted: int = 0
    accepted: int = 0
    rejected: int = 0
    persisted: int = 0
    resubmitted: int = 0
    dropped_stale: int = 0
    dropped_backlog: int = 0
    oom_events: int = 0
    mining_errors: int = 0
    rejected_reasons: Counter = field(default_factory=Counter)
    _recent: deque = field(default_factory=deque, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def credit(self, work: int, tickets: int) -> None:
        now = time.monotonic()
        with self._lock:
            self.credited_work += work
            self.tickets += tickets
            self.launches_mined += 1
            self._recent.append((now, work))
            while self._recent and self._recent[0][0] < now - self.window_s:
                self._recent.popleft()

    def add(self, name: str, amount: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + amount)

    def reject(self, reason: str) -> None:
        with self._lock:
            self.rejected += 1
            self.rejected_reasons[reason] += 1

    @property
    def hashrate(self) -> float:
        now = time.monotonic()
        with self._lock:
            recent = [(t, w) for t, w in self._recent if t >= now - self.window_s]
        if not recent:
            return 0.0
        span = max(now - recent[0][0], 1.0)
        return sum(w for _, w in recent) / span

    def snapshot(self) -> dict[str, object]:
        with self._lock:
            out = {name: getattr(self, name) for name in COUNTERS}
            out["rejected_reasons"] = dict(self.rejected_reasons)
        out["hashrate"] = self.hashrate
        return out
