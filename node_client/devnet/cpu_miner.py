"""Mine devnet blocks with proof/'s CPU reference miner through the gateway RPC (a self-check and demo)."""
from __future__ import annotations

import struct

from node_client.gateway import GatewayClient, MiningJob
from proof import int7

# The Go/FFI default mining configuration (int-protocol.md §1.1): k = 2048, rank 128, 4 × 8 tiles.
DEFAULT_CONFIG = int7.MiningConfig(2048, 128, [0, 8, 64, 72], [0, 1, 8, 9, 32, 33, 40, 41])
DEFAULT_M = 80
DEFAULT_N = 48
# Enough attempts for signet's pow limit (about 2^-12 per tile, 32 tiles per attempt) to fail rarely.
MAX_ATTEMPTS = 2000


def job_bits(job: MiningJob) -> int:
    """The compact target sits at bytes 72..76 of the incomplete header."""
    return struct.unpack_from("<I", job.incomplete_header_bytes, 72)[0]


def mine_plain_proof(job: MiningJob, *, seed: int = 0, config: int7.MiningConfig = DEFAULT_CONFIG,
                     m: int = DEFAULT_M, n: int = DEFAULT_N, max_attempts: int = MAX_ATTEMPTS) -> int7.PlainProof:
    """A plain proof for ``job`` (INT versions 1–3) that meets the job's target."""
    if job.cert_version not in (1, 2, 3):
        raise ValueError(f"the CPU reference miner here mines certificate versions 1-3, the job needs {job.cert_version}")
    return int7.mine_cpu(job.incomplete_header_bytes, config, m=m, n=n, bits=job_bits(job),
                         cert_version=job.cert_version, seed=seed, max_attempts=max_attempts)


def mine_one(client: GatewayClient, *, seed: int = 0) -> MiningJob:
    """Fetch a job, mine it, submit the proof; returns the job mined."""
    job = client.get_mining_info()
    client.submit_plain_proof(mine_plain_proof(job, seed=seed).to_bytes(), job)
    return job
