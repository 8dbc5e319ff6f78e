"""Job sources: pearl-gateway (or the devnet's gateway), with pearld for height and block status.

The gateway gives jobs and takes plain proofs; it answers ``submitPlainProof`` with "submitted"
at once and proves asynchronously, so whether a block was accepted is read from pearld (when one
is configured): the block is ours when the chain holds a header whose first 76 bytes are the
job's incomplete header.
"""
from __future__ import annotations

from node_client import gateway
from node_client.pearld import PearldClient, PearldError

from miner.jobs import MiningJob, SourceUnavailable


class SubmissionRefused(Exception):
    """The source answered a submission with an error: the proof is rejected, not retried."""


class GatewaySource:
    """``JobSource`` over the gateway's line-delimited JSON-RPC; ``pearld`` is optional."""

    def __init__(self, gateway_address: str, pearld: PearldClient | None = None,
                 timeout: float = 10.0) -> None:
        self.client = gateway.GatewayClient(gateway_address, timeout=timeout)
        self.pearld = pearld

    def fetch_job(self) -> MiningJob:
        try:
            wire = self.client.get_mining_info()
        except gateway.MiningPaused as exc:
            raise SourceUnavailable(f"gateway has no template yet: {exc.message}") from exc
        except (gateway.GatewayConnectionError, OSError) as exc:
            raise SourceUnavailable(str(exc)) from exc
        except gateway.GatewayError as exc:
            raise SourceUnavailable(f"gateway error: {exc}") from exc
        return MiningJob(wire, self._height(wire.incomplete_header_bytes))

    def _height(self, header76: bytes) -> int | None:
        """The job's height from pearld when its tip is the job's parent (else None: unknown)."""
        if self.pearld is None:
            return None
        try:
            best = self.pearld.getbestblockhash()
            if bytes.fromhex(best)[::-1] != header76[4:36]:
                return None
            info = self.pearld.getblockheader(best, True)
        except (PearldError, OSError, ValueError):
            return None
        height = info.get("height") if isinstance(info, dict) else None
        return height + 1 if isinstance(height, int) and height >= 0 else None

    def submit(self, plain_proof_b64: str, job: MiningJob) -> str:
        try:
            return self.client.submit_plain_proof(plain_proof_b64, job.wire)
        except (gateway.GatewayConnectionError, OSError) as exc:
            raise SourceUnavailable(str(exc)) from exc
        except (gateway.GatewayError, gateway.SchemaError) as exc:
            raise SubmissionRefused(str(exc)) from exc

    def block_status(self, job: MiningJob) -> bool | None:
        """Whether the main chain's block on the job's parent was mined on ``job``: True or False
        once the parent has a successor (False too when the parent left the main chain), None
        while it has none or pearld cannot tell.

        The parent's `nextblockhash` answers however far the chain has moved on. (The first
        form searched the tip's last 6 blocks: on a devnet at its pow limit, where blocks come
        every second, included blocks fell out of that window and were counted as rejected.)"""
        if self.pearld is None:
            return None
        try:
            parent = self.pearld.getblockheader(job.header76[4:36][::-1].hex(), True)
            if not isinstance(parent, dict):
                return None
            if isinstance(parent.get("confirmations"), int) and parent["confirmations"] < 0:
                return False  # pearld marks a block off the main chain with −1 confirmations
            successor = parent.get("nextblockhash")
            if not isinstance(successor, str):
                return None
            raw = self.pearld.getblockheader(successor, False)
        except (PearldError, OSError, ValueError):
            return None
        return isinstance(raw, bytes) and raw[:76] == job.header76

    def close(self) -> None:
        self.client.close()
