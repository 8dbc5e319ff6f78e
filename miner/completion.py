"""The completion thread: winner records → plain proof → local verification → rules → submission.

One daemon thread takes (backend, record) pairs from a bounded queue, in order:
1. drop the record if its job is no longer current (a stale job's block can never be accepted);
2. skip it when a proof for the same job was already handed over (one block per header);
3. build the plain proof from the retained operands and verify it with ``proof/``;
4. ask ``node_client.rules`` whether the node would accept the certificate at this height;
5. submit; an unreachable source keeps the proof in the data directory for a later retry.

Accounting goes to MiningStats, and every step is an event.
"""
from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from node_client import rules

from miner.accounting import MiningStats
from miner.backend import MiningBackend, WinnerRecord
from miner.events import EventBus
from miner.jobs import JobSource, MiningJob, SourceUnavailable
from miner.modes import job_height
from miner.persistence import Submission, SubmissionStore
from miner.sources import SubmissionRefused

log = logging.getLogger(__name__)

_STOP = object()


class CompletionWorker:
    def __init__(self, source: JobSource, store: SubmissionStore, stats: MiningStats, events: EventBus,
                 network: str, current_job: Callable[[], MiningJob | None], max_queue: int = 256) -> None:
        self.source, self.store, self.stats, self.events = source, store, stats, events
        self.network, self.current_job = network, current_job
        self._queue: queue.Queue = queue.Queue(max_queue)
        self._answered: set[bytes] = set()  # job headers already holding a submitted proof
        self._held: set[bytes] = set()  # job headers whose proof waits in the data directory
        self.awaiting: list[MiningJob] = []  # submitted jobs whose block status is not yet known
        self._retry: list[Submission] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="mining-completion", daemon=True)

    @property
    def pending(self) -> int:
        with self._lock:
            return self._queue.qsize() + len(self._retry)

    def start(self) -> None:
        self._thread.start()

    def offer(self, backend: MiningBackend, record: WinnerRecord) -> bool:
        """Queue a winner (never blocks the serving thread); False when it was not taken."""
        self.stats.add("winners")
        if self._has_proof(record.job):
            return False
        try:
            self._queue.put_nowait((backend, record))
        except queue.Full:
            # Never block serving; the backlog already holds many winners (one proof per job is
            # all a header can use), but say so rather than lose one silently.
            self.stats.add("dropped_backlog")
            log.warning("completion backlog full (%d pending): winner of layer %d for job %s not queued",
                        self._queue.qsize(), record.layer_id, record.job.job_id)
            return False
        return True

    def retry_later(self, subs: list[Submission]) -> None:
        """Persisted submissions from an earlier run; sent once their job is the current one."""
        with self._lock:
            self._retry.extend(subs)
        self._held.update(sub.job.header76 for sub in subs)
        self._queue.put(None)  # wake the thread

    def wake(self) -> None:
        """Re-examine retries (called on every job change)."""
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            try:
                self._flush_retries()
                if item is not None:
                    self._process(*item)
            except Exception as exc:  # one bad record must not end the thread
                log.exception("completion failed")
                self.events.publish("error", f"completion failed: {exc}")

    def _has_proof(self, job: MiningJob) -> bool:
        """One proof per job is enough: a header makes at most one block."""
        return job.header76 in self._answered or job.header76 in self._held

    def _process(self, backend: MiningBackend, record: WinnerRecord) -> None:
        job = record.job
        if job != self.current_job():
            self.stats.add("dropped_stale")
            return
        if self._has_proof(job):
            return
        sub = self.prepare(backend, record)
        if sub is not None:
            self.submit(sub)

    def prepare(self, backend: MiningBackend, record: WinnerRecord) -> Submission | None:
        """Build, verify and rule-check one record; None (with an event) if it must not be sent."""
        job = record.job
        built = backend.build_proof(record)
        self.stats.add("proofs_built")
        ok, reason = backend.verify(record, built)
        if not ok:
            self.stats.add("verify_failed")
            self.events.publish("verify_failed", f"layer {record.layer_id} expert {record.expert}: {reason}")
            return None
        height = job_height(job, self.network)
        try:
            if height is None:
                raise rules.RuleViolation("version-for-height",
                                          f"{self.network} never requires cert version {job.cert_version}")
            rules.check_certificate(self.network, height, built.cert_version, built.public_data, job.bits)
        except rules.RuleViolation as exc:
            self.stats.add("refused_by_rules")
            self.events.publish("refused", f"not submitted: {exc}")
            return None
        return Submission(built.proof_b64, job, record.mode, record.layer_id)

    def submit(self, sub: Submission) -> None:
        """Hand one proof to the source, at most once; persist it if the source is unreachable."""
        if self.store.was_submitted(sub.proof_id) or sub.job.header76 in self._answered:
            return
        try:
            answer = self.source.submit(sub.proof_b64, sub.job)
        except SourceUnavailable as exc:
            with self._lock:
                self._retry.append(sub)
            if sub.job.header76 not in self._held:  # first failure: keep it on disk
                self.store.persist(sub)
                self._held.add(sub.job.header76)
                self.stats.add("persisted")
                self.events.publish("persisted", f"source unreachable, proof {sub.proof_id[:12]} kept: {exc}")
            return
        except SubmissionRefused as exc:
            self.store.mark_submitted(sub)
            self._answered.add(sub.job.header76)
            self._held.discard(sub.job.header76)
            self.stats.reject(str(exc))
            self.events.publish("rejected", f"proof {sub.proof_id[:12]} rejected: {exc}")
            return
        self.store.mark_submitted(sub)
        self._answered.add(sub.job.header76)
        self._held.discard(sub.job.header76)
        with self._lock:
            self.awaiting.append(sub.job)
        self.stats.add("submitted")
        self.events.publish("submitted", f"proof {sub.proof_id[:12]} for job {sub.job.job_id} "
                                         f"({sub.mode}, layer {sub.layer_id}): {answer}")

    def resolve(self, current: MiningJob | None,
                block_status: Callable[[MiningJob], bool | None] | None) -> list[tuple[MiningJob, bool]]:
        """Submitted jobs the chain has moved past, each with whether its block is in the chain.

        A job stays awaited while it is current or while its status cannot be read.
        """
        with self._lock:
            awaiting = list(self.awaiting)
        resolved = []
        for job in awaiting:
            if current is None or job == current:
                continue
            status = block_status(job) if block_status is not None else None
            if status is None:
                continue
            with self._lock:
                self.awaiting.remove(job)
            resolved.append((job, status))
        return resolved

    def account_blocks(self, current: MiningJob | None) -> None:
        """Count the blocks of submitted jobs the chain has moved past as accepted or not."""
        for job, included in self.resolve(current, getattr(self.source, "block_status", None)):
            if included:
                self.stats.add("accepted")
                self.events.publish("accepted", f"block for job {job.job_id} accepted")
            else:
                self.stats.reject("not included in the chain")
                self.events.publish("rejected", f"block for job {job.job_id} not included in the chain")

    def _flush_retries(self) -> None:
        """Send persisted proofs whose job is current; drop those whose job has passed."""
        current = self.current_job()
        if current is None:
            return
        with self._lock:
            retry, self._retry = self._retry, []
        for sub in retry:
            if sub.job == current:
                self.stats.add("resubmitted")
                self.submit(sub)
            else:
                self.store.forget(sub)
                self._held.discard(sub.job.header76)
                self.stats.add("dropped_stale")
                self.events.publish("dropped", f"persisted proof {sub.proof_id[:12]}: job {sub.job.job_id} "
                                               "is no longer current")

    def stop(self, timeout: float = 30.0) -> list[Submission]:
        """Drain: finish the in-flight record, then build and persist every queued one unsent.

        Returns the submissions persisted for the next run.
        """
        leftovers = []
        while True:
            try:
                leftovers.append(self._queue.get_nowait())
            except queue.Empty:
                break
        if self._thread.ident is not None:  # started
            self._queue.put(_STOP)
            self._thread.join(timeout)
        with self._lock:
            kept, self._retry = self._retry, []  # already in the data directory
        fresh: list[Submission] = []
        for item in leftovers:
            if item is None or item is _STOP:
                continue
            backend, record = item
            job = record.job
            if self._has_proof(job) or job != self.current_job() or any(s.job == job for s in fresh):
                continue
            sub = self.prepare(backend, record)
            if sub is not None:
                self.store.persist(sub)
                fresh.append(sub)
        if fresh:
            self.stats.add("persisted", len(fresh))
        if kept or fresh:
            self.events.publish("persisted", f"{len(kept) + len(fresh)} unsent proof(s) kept for the next run")
        return kept + fresh
