"""The data directory: unsent proofs survive a restart, and no proof is ever submitted twice.

Layout: ``pending/<proof id>.json`` holds one built, verified, not yet submitted proof with its job;
``submitted.log`` lists the ids already handed to the source (one per line, appended before the
pending file is removed, so a crash in between errs on the side of not resubmitting).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from miner.jobs import MiningJob
from node_client.gateway import SchemaError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Submission:
    """A proof ready to hand over: the plain proof (base64) and the job it answers."""

    proof_b64: str
    job: MiningJob
    mode: str
    layer_id: int = 0

    @property
    def proof_id(self) -> str:
        return hashlib.sha256(self.proof_b64.encode()).hexdigest()[:32]

    def to_record(self) -> dict[str, Any]:
        return {"proof": self.proof_b64, "job": self.job.to_record(), "mode": self.mode,
                "layer_id": self.layer_id}

    @classmethod
    def from_record(cls, data: Any) -> Submission:
        if not isinstance(data, dict) or not isinstance(data.get("proof"), str):
            raise SchemaError("pending record must be an object with a base64 'proof'")
        return cls(data["proof"], MiningJob.from_record(data.get("job")), str(data.get("mode", "")),
                   int(data.get("layer_id", 0)))


class SubmissionStore:
    def __init__(self, data_dir: Path) -> None:
        self.pending_dir = Path(data_dir) / "pending"
        self.pending_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = Path(data_dir) / "submitted.log"
        self._lock = threading.Lock()
        self._submitted = set(self.log_path.read_text().split()) if self.log_path.exists() else set()

    def was_submitted(self, proof_id: str) -> bool:
        with self._lock:
            return proof_id in self._submitted

    def mark_submitted(self, sub: Submission) -> None:
        with self._lock:
            self._submitted.add(sub.proof_id)
            with self.log_path.open("a") as fh:
                fh.write(sub.proof_id + "\n")
                fh.flush()
                os.fsync(fh.fileno())
        self.forget(sub)

    def persist(self, sub: Submission) -> None:
        path = self.pending_dir / f"{sub.proof_id}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(sub.to_record()))
        os.replace(tmp, path)

    def forget(self, sub: Submission) -> None:
        (self.pending_dir / f"{sub.proof_id}.json").unlink(missing_ok=True)

    def load_pending(self) -> list[Submission]:
        """Every persisted submission that was not already submitted; unreadable files are kept
        aside (renamed ``.bad``) with a log line rather than lost or retried forever."""
        out = []
        for path in sorted(self.pending_dir.glob("*.json")):
            try:
                sub = Submission.from_record(json.loads(path.read_text()))
            except (OSError, ValueError) as exc:
                log.error("pending proof %s is unreadable (%s); moved aside", path.name, exc)
                path.rename(path.with_suffix(".bad"))
                continue
            if self.was_submitted(sub.proof_id):
                path.unlink(missing_ok=True)
            else:
                out.append(sub)
        return out
