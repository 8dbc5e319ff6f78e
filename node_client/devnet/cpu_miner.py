"""Mine devnet blocks with proof/'s CPU reference miner through the gateway RPC (a self-check and demo)."""
from __future__ import annotations

import struct

import numpy as np

from node_client.gateway import GatewayClient, MiningJob
from proof import int7
from proof.fp8.miner import mine_cpu as mine_fp8_cpu
from proof.fp8.plain_proof import PlainProofV4

# The Go/FFI default mining configuration (int-protocol.md §1.1): k = 2048, rank 128, 4 × 8 tiles.
DEFAULT_CONFIG = int7.MiningConfig(2048, 128, [0, 8, 64, 72], [0, 1, 8, 9, 32, 33, 40, 41])
DEFAULT_M = 80
DEFAULT_N = 48
# Enough attempts for signet's pow limit (about 2^-12 per tile, 32 tiles per attempt) to fail rarely.
MAX_ATTEMPTS = 2000


def job_bits(job: MiningJob) -> int:
    """The compact target sits at bytes 72..76 of the incomplete header."""
    return struct.unpack_from("<I", job.incomplete_header_bytes, 72)[0]


# A small FP8 launch: k = 1024 (the V4 minimum), 64 tokens, 128 output rows per expert (or dense),
# σ_d = the parent header.
FP8_SHAPE = (64, 128, 1024)
FP8_ATTEMPTS = 50


def mine_fp8_plain_proof(job: MiningJob, *, seed: int = 0, experts: int = 0) -> PlainProofV4:
    """A V4 plain proof for ``job`` on random operands: dense, or MoE over ``experts`` experts
    (top-1 routing drawn at random)."""
    if not job.ancestor_headers:
        raise ValueError("a V4 job must carry ancestor headers (the parent first)")
    m, n, k = FP8_SHAPE
    rng = np.random.default_rng(seed)
    for _ in range(FP8_ATTEMPTS):
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((n * max(experts, 1), k)).astype(np.float32)
        routing = rng.integers(0, experts, size=(m, 1)) if experts else None
        result = mine_fp8_cpu(job.incomplete_header_bytes, a, b, ancestor_header=job.ancestor_headers[0],
                              target=job.target, topk_ids=routing, experts=experts)
        if result.proof is not None:
            return result.proof
    raise RuntimeError(f"no admissible FP8 winner in {FP8_ATTEMPTS} launches")


def mine_plain_proof(job: MiningJob, *, seed: int = 0, config: int7.MiningConfig = DEFAULT_CONFIG,
                     m: int = DEFAULT_M, n: int = DEFAULT_N,
                     max_attempts: int = MAX_ATTEMPTS) -> int7.PlainProof | PlainProofV4:
    """A plain proof for ``job`` that meets its target: INT (versions 1–3, ``config``) or dense FP8 (V4)."""
    if job.cert_version == 4:
        return mine_fp8_plain_proof(job, seed=seed)
    if job.cert_version not in (1, 2, 3):
        raise ValueError(f"the CPU reference miner mines certificate versions 1-4, the job needs {job.cert_version}")
    return int7.mine_cpu(job.incomplete_header_bytes, config, m=m, n=n, bits=job_bits(job),
                         cert_version=job.cert_version, seed=seed, max_attempts=max_attempts)


def mine_one(client: GatewayClient, *, seed: int = 0) -> MiningJob:
    """Fetch a job, mine it, submit the proof; returns the job mined."""
    job = client.get_mining_info()
    client.submit_plain_proof(mine_plain_proof(job, seed=seed).to_bytes(), job)
    return job
