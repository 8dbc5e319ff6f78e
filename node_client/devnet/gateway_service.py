"""The devnet's pearl-gateway side: mining jobs from the node's template, plain proofs → blocks.

Like pearl-gateway (fp8-and-integration.md §14.3) it builds the coinbase itself, keeps one job per
tip, answers ``submitPlainProof`` at once and processes proofs one at a time on a worker thread:
a proof for a header that is no longer current is dropped as stale; otherwise the plain proof is
verified with ``proof/`` (in place of the ZK prover), its public data and a placeholder certificate
are built, and the block goes through the node's submitblock path. Every submission's outcome is
recorded, in order, for tests and the CLI.
"""
from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import logging
import queue
import threading

from node_client import gateway as gw
from node_client.devnet.node import DevnetNode
from node_client.devnet.placeholder import ProofRejected, build_certificate, decode_plain_proof, public_data_for
from node_client.devnet.rpc_gateway import MiningPausedError
from node_client.pearld import BlockTemplate
from proof.certificate import CertificateError, proof_commitment
from proof.chain import (
    Block,
    BlockHeader,
    Transaction,
    coinbase_transaction,
    display_hex,
    from_display_hex,
    merkle_root,
    p2tr_script,
)

log = logging.getLogger(__name__)

DEFAULT_PAYOUT_SCRIPT = p2tr_script(hashlib.sha256(b"pearl-moe devnet payout").digest())
COINBASE_FLAGS = b"/pearl-moe devnet/"


@dataclasses.dataclass(frozen=True)
class Submission:
    """The outcome of one submitPlainProof: ``status`` is accepted, rejected, stale or invalid."""

    index: int
    status: str
    detail: str
    block_hash: str | None = None
    height: int | None = None


@dataclasses.dataclass(frozen=True)
class _Work:
    template: BlockTemplate
    coinbase_bytes: bytes
    header76: bytes
    tip_hash: str


class DevnetGateway:
    """Implements the miner RPC backend over a DevnetNode."""

    def __init__(self, node: DevnetNode, *, payout_script: bytes = DEFAULT_PAYOUT_SCRIPT) -> None:
        self.node = node
        self.payout_script = payout_script
        self._lock = threading.Lock()
        self._work: _Work | None = None
        self._paused = False
        self._queue: queue.Queue[tuple[int, bytes, gw.MiningJob] | None] = queue.Queue()
        self._results: list[Submission] = []
        self._received = 0
        self._done = threading.Condition(self._lock)
        self._worker = threading.Thread(target=self._run, name="devnet-gateway-worker", daemon=True)
        self._worker.start()

    # --- jobs --------------------------------------------------------------------------------------

    def set_paused(self, paused: bool) -> None:
        """While paused the gateway has no template, as before its first one (answers −32001)."""
        with self._lock:
            self._paused = paused

    def _current_work(self) -> _Work:
        """The job for the current tip, built once per tip (under the lock, so never a stale one)."""
        with self._lock:
            if self._paused:
                raise MiningPausedError("mining_paused: no block template available")
            tip_hash = display_hex(self.node.chain.tip.hash)
            if self._work is None or self._work.tip_hash != tip_hash:
                self._work = self._build_work()
            return self._work

    def _build_work(self) -> _Work:
        template = BlockTemplate.from_rpc(self.node.template())
        coinbase = coinbase_transaction(
            template.height, template.coinbase_value, self.payout_script,
            template.default_witness_commitment, flags=COINBASE_FLAGS,
        )
        header = BlockHeader(
            template.version, from_display_hex(template.previous_block_hash),
            merkle_root([coinbase.txid()]), template.curtime, template.bits,
        )
        return _Work(template, coinbase.to_bytes(), header.incomplete_bytes(), template.previous_block_hash)

    def mining_job(self) -> gw.MiningJob:
        work = self._current_work()
        return gw.MiningJob(
            incomplete_header_bytes=work.header76,
            target=work.template.target,
            cert_version=work.template.required_cert_version,
            ancestor_headers=work.template.ancestor_headers,
        )

    # --- submissions -------------------------------------------------------------------------------

    def submit_plain_proof(self, plain_proof_b64: str, job: gw.MiningJob) -> None:
        try:
            plain = base64.b64decode(plain_proof_b64, validate=True)
        except binascii.Error as exc:
            raise ValueError(f"plain_proof is not valid base64: {exc}") from exc
        try:
            decode_plain_proof(job.cert_version, plain)
        except ProofRejected as exc:
            raise ValueError(str(exc)) from exc
        with self._lock:
            index = self._received
            self._received += 1
        self._queue.put((index, plain, job))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            index, plain, job = item
            try:
                result = self._process(index, plain, job)
            except Exception as exc:  # record, never lose a submission
                log.exception("devnet gateway: submission %d failed", index)
                result = Submission(index, "invalid", f"internal error: {exc}")
            with self._lock:
                self._results.append(result)
                self._done.notify_all()

    def _process(self, index: int, plain: bytes, job: gw.MiningJob) -> Submission:
        try:
            work = self._current_work()
        except MiningPausedError as exc:
            return Submission(index, "stale", str(exc))
        if job.incomplete_header_bytes != work.header76:
            return Submission(index, "stale", "header is not the current template")
        template = work.template
        version = template.required_cert_version
        try:
            public_data = public_data_for(version, work.header76, plain)
            commitment = proof_commitment(version, public_data)
            header = BlockHeader.from_incomplete_bytes(work.header76, commitment)
            certificate = build_certificate(version, header.block_hash(), public_data, plain, self.node.chain.proofs)
        except (ProofRejected, CertificateError) as exc:
            return Submission(index, "invalid", str(exc))
        block = Block(certificate, header, (Transaction.from_bytes(work.coinbase_bytes),))
        outcome = self.node.submit_block_bytes(block.to_bytes())
        block_hash = display_hex(header.block_hash())
        if outcome is None:
            return Submission(index, "accepted", "", block_hash, template.height)
        return Submission(index, "rejected", outcome, block_hash, template.height)

    def results(self) -> list[Submission]:
        with self._lock:
            return list(self._results)

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Wait until every received submission has an outcome."""
        with self._lock:
            return self._done.wait_for(lambda: len(self._results) == self._received, timeout)

    def close(self) -> None:
        self._queue.put(None)
        self._worker.join(timeout=10)
