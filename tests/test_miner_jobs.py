"""Jobs: parsing, persistence form, and the poller's retire / backoff / recover behaviour."""
import pytest

from miner.jobs import Backoff, JobPoller, MiningJob, SourceUnavailable
from node_client.gateway import SchemaError


def job(n: int) -> MiningJob:
    return MiningJob.of(bytes([n]) * 72 + (0x1E010000).to_bytes(4, "little"), 5, 3, height=n)


class ScriptedSource:
    """Answers fetch_job from a script of jobs and exceptions."""

    def __init__(self, script: list) -> None:
        self.script = script

    def fetch_job(self) -> MiningJob:
        item = self.script.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    def submit(self, proof: str, job: MiningJob) -> str:
        raise AssertionError("not used")


def test_job_fields_and_record_round_trip() -> None:
    j = job(7)
    assert j.bits == 0x1E010000 and len(j.job_id) == 16 and j.height == 7
    assert MiningJob.from_record(j.to_record()) == j
    assert MiningJob.from_record(j.to_record()).height == 7
    assert j == MiningJob.of(j.header76, 5, 3)  # the height does not make a different job


@pytest.mark.parametrize("bad", [
    None, {"target": 1}, {**job(1).to_record(), "incomplete_header_bytes": "AAAA"},
    {**job(1).to_record(), "height": -3}, {**job(1).to_record(), "cert_version": "3"},
])
def test_malformed_job_records_are_refused(bad) -> None:
    with pytest.raises(SchemaError):
        MiningJob.from_record(bad)


def test_poller_retires_after_failures_and_recovers() -> None:
    seen = []
    source = ScriptedSource([job(1), job(1), SourceUnavailable("down"), SchemaError("junk"),
                             SourceUnavailable("down"), job(2)])
    poller = JobPoller(source, interval=1.0, stale_after=3, backoff=Backoff(0.5, 4.0))
    poller.subscribe(seen.append)
    poller.subscribe(lambda j: 1 / 0)  # a broken listener does not stop polling
    assert poller.poll_once() == 1.0 and poller.current == job(1)
    assert poller.poll_once() == 1.0  # the same job: no new notification
    assert [poller.poll_once() for _ in range(3)] == [0.5, 1.0, 2.0]  # backoff doubles
    assert poller.current is None and poller.failures == 3 and "down" in poller.last_error
    assert poller.poll_once() == 1.0 and poller.current == job(2) and poller.failures == 0
    assert seen == [job(1), None, job(2)]
    assert poller.backoff.delay == 0.5  # reset on success


def test_backoff_is_capped() -> None:
    backoff = Backoff(1.0, 5.0)
    assert [backoff.next() for _ in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]
