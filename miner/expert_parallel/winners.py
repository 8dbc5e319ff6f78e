"""Winners from every rank to the one submitter on rank 0, each exactly once.

On the rank that found it, a winner is built into a plain proof and verified by that rank's own
backend (the retained operands live there, possibly on its GPU), in a ``ProofBuilder`` thread so
serving never waits. The result, without the retained operands, becomes a ``RelayedWinner`` in
the rank's outbox; the step sync drains every outbox into rank 0, where a ``WinnerSink`` takes
each one. Draining is a swap under a lock, so a winner is sent once and never twice.

One block per header: once a rank holds a verified proof for a job, its later winners for that
job are relayed as ``REDUNDANT`` without building (no second proof of a header can make a second
block); a winner whose job is no longer current when its turn comes is relayed as ``STALE``.
"""
from __future__ import annotations

import dataclasses
import enum
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from miner.accounting import MiningStats
from miner.backend import BuiltProof, MiningBackend, WinnerRecord
from miner.events import EventBus
from miner.jobs import MiningJob

log = logging.getLogger(__name__)


class Outcome(str, enum.Enum):
    PROOF = "proof"  # built and verified on the producing rank (verdict says whether it passed)
    REDUNDANT = "redundant"  # the rank already relayed a verified proof for this job
    STALE = "stale"  # the job was no longer current when the rank reached the winner
    ERROR = "error"  # building the proof raised (the reason says what)


@dataclass(frozen=True)
class RelayedWinner:
    """A winner crossing to rank 0: the record (global expert id, no retained operands) and what
    the producing rank made of it."""

    rank: int
    record: WinnerRecord
    outcome: Outcome
    built: BuiltProof | None = None
    verdict: tuple[bool, str] = (False, "")

    @property
    def key(self) -> tuple[int, int, int, int, int, bytes]:
        """What identifies one winner: rank, layer, expert, tile and ticket."""
        r = self.record
        return (self.rank, r.layer_id, r.expert, r.tile_row, r.tile_col, r.ticket)


class ProofBuilder:
    """Per rank: takes winners from the mined layers (never blocking), builds and verifies proofs
    in a daemon thread, and keeps the results until the step sync takes them."""

    def __init__(self, rank: int, expert_offset: int, current_job: Callable[[], MiningJob | None]) -> None:
        self.rank, self.expert_offset, self.current_job = rank, expert_offset, current_job
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._outbox: list[RelayedWinner] = []
        self._proved: set[bytes] = set()  # headers this rank already holds a verified proof for
        self._pending = 0
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"ep-proofs-{rank}", daemon=True)
        self._thread.start()

    def offer(self, backend: MiningBackend, record: WinnerRecord) -> bool:
        """The mined layers' ``on_winner``: queue the record (or relay it at once if redundant)."""
        with self._cond:
            if record.job.header76 in self._proved:
                self._outbox.append(self._relayed(record, Outcome.REDUNDANT))
                return False
            self._pending += 1
        self._queue.put((backend, record))
        return True

    def take(self) -> list[RelayedWinner]:
        """Everything finished since the last call (the outbox is emptied)."""
        with self._cond:
            out, self._outbox = self._outbox, []
        return out

    def flush(self, timeout: float) -> bool:
        """Wait until every queued winner is finished; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def _relayed(self, record: WinnerRecord, outcome: Outcome, built: BuiltProof | None = None,
                 verdict: tuple[bool, str] = (False, "")) -> RelayedWinner:
        light = dataclasses.replace(record, expert=record.expert + self.expert_offset, retained=None)
        return RelayedWinner(self.rank, light, outcome, built, verdict)

    def _finish(self, backend: MiningBackend, record: WinnerRecord) -> RelayedWinner:
        job = record.job
        if job != self.current_job():
            return self._relayed(record, Outcome.STALE)
        if job.header76 in self._proved:
            return self._relayed(record, Outcome.REDUNDANT)
        try:
            built = backend.build_proof(record)
            verdict = backend.verify(record, built)
        except Exception as exc:  # one bad record must not end the thread
            log.exception("rank %d: building a proof failed", self.rank)
            return self._relayed(record, Outcome.ERROR, verdict=(False, f"{type(exc).__name__}: {exc}"))
        if verdict[0]:
            with self._cond:
                self._proved.add(job.header76)
        return self._relayed(record, Outcome.PROOF, built, verdict)

    def _run(self) -> None:
        while True:
            backend, record = self._queue.get()
            relayed = self._finish(backend, record)
            with self._cond:
                self._outbox.append(relayed)
                self._pending -= 1
                self._cond.notify_all()


class RelayedBackend:
    """What rank 0's completion thread sees for a relayed winner: the proof and verdict the
    producing rank made (only ``build_proof`` and ``verify`` of the backend boundary are used)."""

    name = "relayed"

    def build_proof(self, record: WinnerRecord) -> BuiltProof:
        relayed: RelayedWinner = record.retained
        if relayed.built is None:
            raise ValueError(f"rank {relayed.rank} relayed no proof ({relayed.outcome.value})")
        return relayed.built

    def verify(self, record: WinnerRecord, built: BuiltProof) -> tuple[bool, str]:
        relayed: RelayedWinner = record.retained
        ok, reason = relayed.verdict
        return ok, reason if ok else f"on rank {relayed.rank}: {reason}"


class WinnerSink(Protocol):
    """Rank 0's end of the relay."""

    def deliver(self, relayed: RelayedWinner) -> None: ...


class Submitter(Protocol):
    """The completion side (``miner.completion.CompletionWorker``)."""

    def offer(self, backend: MiningBackend, record: WinnerRecord) -> bool: ...


class CompletionSink:
    """Feeds relayed proofs into the completion thread (checks, rules, one submission per job);
    accounts the winners that carry no proof."""

    def __init__(self, completion: Submitter, stats: MiningStats, events: EventBus) -> None:
        self.completion, self.stats, self.events = completion, stats, events
        self.backend = RelayedBackend()

    def deliver(self, relayed: RelayedWinner) -> None:
        if relayed.outcome == Outcome.PROOF:
            self.completion.offer(self.backend,  # type: ignore[arg-type]
                                  dataclasses.replace(relayed.record, retained=relayed))
            return
        self.stats.add("winners")
        if relayed.outcome == Outcome.STALE:
            self.stats.add("dropped_stale")
        elif relayed.outcome == Outcome.ERROR:
            self.events.publish("error", f"rank {relayed.rank} layer {relayed.record.layer_id} expert "
                                         f"{relayed.record.expert}: no proof: {relayed.verdict[1]}")
