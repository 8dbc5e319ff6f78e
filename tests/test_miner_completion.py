"""Winners → proofs → checks → submission: one per job, stale dropped, nothing lost or sent twice."""
import json

import pytest

from miner.accounting import MiningStats
from miner.backend import BuiltProof, WinnerRecord
from miner.completion import CompletionWorker
from miner.events import EventBus
from miner.jobs import MiningJob, SourceUnavailable
from miner.persistence import Submission, SubmissionStore
from miner.sources import SubmissionRefused
from test_miner_support import wait_until

NETWORK = "regtest-fp8"  # cert V4 at every height: the rules look only at the version here


def job(n: int, cert: int = 4) -> MiningJob:
    return MiningJob.of(bytes([n]) * 76, 1, cert, height=n)


class FakeBackend:
    name = "fake"

    def __init__(self, ok: bool = True, cert: int = 4) -> None:
        self.ok, self.cert, self.built = ok, cert, 0

    def build_proof(self, record: WinnerRecord) -> BuiltProof:
        self.built += 1
        return BuiltProof(f"proof-{record.job.header76[0]}-{record.tile_row}", b"public", self.cert)

    def verify(self, record: WinnerRecord, built: BuiltProof) -> tuple[bool, str]:
        return (True, "ok") if self.ok else (False, "ticket exceeds the bound")


class FakeSource:
    def __init__(self) -> None:
        self.sent: list[tuple[str, MiningJob]] = []
        self.fail: Exception | None = None

    def fetch_job(self) -> MiningJob:
        raise SourceUnavailable("not used")

    def submit(self, proof: str, job: MiningJob) -> str:
        if self.fail is not None:
            raise self.fail
        self.sent.append((proof, job))
        return "submitted"


def record(j: MiningJob, row: int = 0) -> WinnerRecord:
    return WinnerRecord(j, "fp8-moe", 0, 1, row, 0, bytes(32), None)


class Harness:
    def __init__(self, tmp_path, current: MiningJob | None) -> None:
        self.current = current
        self.source, self.stats, self.events = FakeSource(), MiningStats(), EventBus()
        self.store = SubmissionStore(tmp_path)
        self.worker = CompletionWorker(self.source, self.store, self.stats, self.events, NETWORK,
                                       lambda: self.current)


@pytest.fixture
def h(tmp_path):
    harness = Harness(tmp_path, job(1))
    harness.worker.start()
    yield harness
    harness.worker.stop()


def test_one_proof_per_job_and_stale_records_dropped(h) -> None:
    backend = FakeBackend()
    for row in range(5):
        h.worker.offer(backend, record(job(1), row))
    h.worker.offer(backend, record(job(9)))  # a job that is not current
    wait_until(lambda: h.stats.submitted == 1 and h.stats.dropped_stale == 1, 10, "processing")
    assert [p for p, _ in h.source.sent] == ["proof-1-0"]
    assert h.stats.winners == 6
    assert h.worker.offer(backend, record(job(1), 7)) is False  # already answered: not even queued
    assert h.store.was_submitted(Submission("proof-1-0", job(1), "fp8-moe").proof_id)


def test_failed_verification_is_never_submitted(h) -> None:
    h.worker.offer(FakeBackend(ok=False), record(job(1)))
    wait_until(lambda: h.stats.verify_failed == 1, 10, "verification")
    assert not h.source.sent and h.stats.submitted == 0
    assert any(e.kind == "verify_failed" for e in h.events.recent())


def test_rules_refusal_is_never_submitted(h) -> None:
    h.worker.offer(FakeBackend(cert=3), record(job(1)))  # V3 where the network requires V4
    wait_until(lambda: h.stats.refused_by_rules == 1, 10, "rules")
    assert not h.source.sent
    assert "version-for-height" in [e for e in h.events.recent() if e.kind == "refused"][0].message


def test_refused_submission_is_rejected_with_its_reason_and_not_retried(h) -> None:
    h.source.fail = SubmissionRefused("gateway error -32602: invalid params")
    h.worker.offer(FakeBackend(), record(job(1)))
    wait_until(lambda: h.stats.rejected == 1, 10, "the refusal")
    assert h.stats.rejected_reasons == {"gateway error -32602: invalid params": 1}
    h.source.fail = None
    h.worker.offer(FakeBackend(), record(job(1), 3))
    h.worker.wake()
    assert not h.source.sent and h.stats.submitted == 0


def test_unreachable_source_keeps_the_proof_and_sends_it_once_back(h) -> None:
    h.source.fail = SourceUnavailable("connection refused")
    backend = FakeBackend()
    h.worker.offer(backend, record(job(1)))
    wait_until(lambda: h.stats.persisted == 1, 10, "persisting")
    assert len(list(h.store.pending_dir.glob("*.json"))) == 1
    h.worker.offer(backend, record(job(1), 2))  # the job already has a kept proof
    h.source.fail = None
    h.worker.wake()
    wait_until(lambda: h.stats.submitted == 1, 10, "the retry")
    assert [p for p, _ in h.source.sent] == ["proof-1-0"] and h.stats.resubmitted == 1
    assert backend.built == 1 and not list(h.store.pending_dir.glob("*.json"))


def test_kept_proof_of_a_passed_job_is_dropped(h) -> None:
    h.source.fail = SourceUnavailable("down")
    h.worker.offer(FakeBackend(), record(job(1)))
    wait_until(lambda: h.stats.persisted == 1, 10, "persisting")
    h.source.fail = None
    h.current = job(2)
    h.worker.wake()
    wait_until(lambda: h.stats.dropped_stale == 1, 10, "dropping")
    assert not h.source.sent and not list(h.store.pending_dir.glob("*.json"))


def test_stop_builds_and_persists_queued_winners(tmp_path) -> None:
    h = Harness(tmp_path, job(1))  # thread never started: records stay queued
    backend = FakeBackend()
    h.worker.offer(backend, record(job(1)))
    h.worker.offer(backend, record(job(1), 1))  # same job: one proof is kept
    h.worker.offer(backend, record(job(4)))  # stale: not kept
    kept = h.worker.stop()
    assert [s.proof_b64 for s in kept] == ["proof-1-0"]
    files = list(h.store.pending_dir.glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["proof"] == "proof-1-0"
    # the next run loads it; once submitted it is never loaded again
    store = SubmissionStore(tmp_path)
    (pending,) = store.load_pending()
    assert pending.job == job(1)
    store.mark_submitted(pending)
    assert SubmissionStore(tmp_path).load_pending() == []


def test_unreadable_pending_files_are_moved_aside(tmp_path) -> None:
    store = SubmissionStore(tmp_path)
    (store.pending_dir / "broken.json").write_text("{not json")
    (store.pending_dir / "wrong.json").write_text(json.dumps({"proof": "x", "job": {"target": 1}}))
    assert store.load_pending() == []
    assert sorted(p.name for p in store.pending_dir.iterdir()) == ["broken.bad", "wrong.bad"]


def test_resolve_reports_included_and_missing_blocks(tmp_path) -> None:
    h = Harness(tmp_path, job(1))
    h.worker.offer(FakeBackend(), record(job(1)))
    h.worker.start()
    wait_until(lambda: h.stats.submitted == 1, 10, "submission")
    assert h.worker.resolve(job(1), lambda j: True) == []  # still current
    assert h.worker.resolve(job(2), lambda j: None) == []  # status unknown: keep waiting
    assert h.worker.resolve(job(2), lambda j: True) == [(job(1), True)]
    assert h.worker.resolve(job(3), lambda j: False) == []  # already resolved
    h.worker.stop()


def test_a_full_backlog_counts_the_winner_it_cannot_queue(tmp_path) -> None:
    harness = Harness(tmp_path, job(1))  # not started: nothing drains the queue
    harness.worker = CompletionWorker(harness.source, harness.store, harness.stats, harness.events,
                                      NETWORK, lambda: harness.current, max_queue=2)
    backend = FakeBackend()
    taken = [harness.worker.offer(backend, record(job(n))) for n in (1, 2, 3)]
    assert taken == [True, True, False]
    assert harness.stats.winners == 3 and harness.stats.dropped_backlog == 1
    assert harness.stats.snapshot()["dropped_backlog"] == 1
