"""Mining jobs and the background poller that keeps the current one without blocking inference.

A job is what the gateway's ``getMiningInfo`` returns (node-consensus / fp8-and-integration §14.3):
the 76-byte incomplete header, the integer target, the required certificate version and, for V4,
the ancestor headers (parent first). Sources that know the height (pearld, the devnet) add it.
"""
from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from node_client import gateway

log = logging.getLogger(__name__)


class SourceUnavailable(ConnectionError):
    """The job source (gateway, pearld, devnet) could not be reached or answered badly."""


@dataclass(frozen=True)
class MiningJob:
    """A gateway job (``node_client.gateway.MiningJob``) plus the height when the source knows it."""

    wire: gateway.MiningJob
    height: int | None = field(default=None, compare=False)

    @classmethod
    def of(cls, header76: bytes, target: int, cert_version: int,
           ancestor_headers: tuple[bytes, ...] = (), height: int | None = None) -> MiningJob:
        return cls(gateway.MiningJob(header76, target, cert_version, tuple(ancestor_headers)), height)

    @property
    def header76(self) -> bytes:
        return self.wire.incomplete_header_bytes

    @property
    def target(self) -> int:
        return self.wire.target

    @property
    def cert_version(self) -> int:
        return self.wire.cert_version

    @property
    def ancestor_headers(self) -> tuple[bytes, ...]:
        return self.wire.ancestor_headers

    @property
    def bits(self) -> int:
        """The compact target from the header (its last four bytes, little-endian)."""
        return int.from_bytes(self.header76[72:76], "little")

    @property
    def job_id(self) -> str:
        """A short stable name: the first 8 bytes of SHA256 of the header, hex."""
        return hashlib.sha256(self.header76).hexdigest()[:16]

    def to_record(self) -> dict[str, Any]:
        """JSON form for the data directory (the gateway form plus the height)."""
        return {**self.wire.to_dict(), "height": self.height}

    @classmethod
    def from_record(cls, data: Any) -> MiningJob:
        """Parse a persisted record (raises gateway.SchemaError when malformed)."""
        if not isinstance(data, dict):
            raise gateway.SchemaError("job record must be an object")
        height = data.get("height")
        if height is not None and (not isinstance(height, int) or height < 0):
            raise gateway.SchemaError(f"job record height must be a non-negative integer, got {height!r}")
        fields = {k: v for k, v in data.items() if k != "height"}
        return cls(gateway.MiningJob.from_dict(fields, "record"), height)


class JobSource(Protocol):
    """Where jobs come from and proofs go (the gateway, or the devnet's gateway)."""

    def fetch_job(self) -> MiningJob:
        """The current job; raises SourceUnavailable (or gateway.SchemaError for a malformed reply)."""
        ...

    def submit(self, plain_proof_b64: str, job: MiningJob) -> str:
        """Hand a plain proof over; returns the source's answer, raises on refusal."""
        ...


class Backoff:
    """Exponential reconnect delay: ``initial`` doubling up to ``maximum``, reset on success."""

    def __init__(self, initial: float = 0.5, maximum: float = 30.0) -> None:
        self.initial, self.maximum = initial, maximum
        self.delay = initial

    def next(self) -> float:
        delay = self.delay
        self.delay = min(self.maximum, self.delay * 2)
        return delay

    def reset(self) -> None:
        self.delay = self.initial


JobListener = Callable[["MiningJob | None"], None]


# what a job source raises when it cannot answer (the poller retries; shutdown gives up)
POLL_ERRORS = (SourceUnavailable, gateway.SchemaError, OSError)


class JobPoller:
    """Polls a source in a daemon thread; the current job is read without locks by inference.

    After ``stale_after`` consecutive failures the job is retired (``None``: mining pauses while
    inference keeps serving); polling continues with exponential backoff until the source is back.
    """

    def __init__(self, source: JobSource, interval: float = 1.0, stale_after: int = 3,
                 backoff: Backoff | None = None) -> None:
        self.source, self.interval, self.stale_after = source, interval, stale_after
        self.backoff = backoff or Backoff()
        self.current: MiningJob | None = None
        self.failures = 0
        self.last_error = ""
        self._listeners: list[JobListener] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="job-poller", daemon=True)

    def subscribe(self, listener: JobListener) -> None:
        self._listeners.append(listener)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:  # a worker may stop before it started
            self._thread.join(timeout=10)

    def poll_once(self) -> float:
        """One poll; returns how long to wait before the next."""
        try:
            job = self.source.fetch_job()
        except POLL_ERRORS as exc:
            self.failures += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("job poll failed (%d in a row): %s", self.failures, self.last_error)
            if self.failures >= self.stale_after and self.current is not None:
                self._set(None)
            return self.backoff.next()
        self.failures, self.last_error = 0, ""
        self.backoff.reset()
        if job != self.current:
            self._set(job)
        return self.interval

    def _set(self, job: MiningJob | None) -> None:
        self.current = job
        for listener in self._listeners:
            try:
                listener(job)
            except Exception:  # a listener's bug must not stop polling
                log.exception("job listener failed")

    def _run(self) -> None:
        while not self._stop.is_set():
            self._stop.wait(self.poll_once())
