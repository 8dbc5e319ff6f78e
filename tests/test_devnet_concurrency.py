"""50 concurrent submissions lose nothing and create no duplicate block."""
from __future__ import annotations

import base64
import threading
from collections import Counter

from node_client.devnet import start_devnet
from node_client.devnet.chain import Chain
from node_client.devnet.gateway_service import DevnetGateway
from node_client.devnet.node import DevnetNode
from node_client.forks import get_params
from proof.chain import Block
from node_client.devnet.cpu_miner import mine_plain_proof
from node_client.pearld import BlockRejected

SUBMISSIONS = 50
DISTINCT = 5


def _run_concurrently(worker, count: int) -> list:
    results: list = [None] * count
    barrier = threading.Barrier(count)

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = worker(i)
        except Exception as exc:  # recorded, so a lost reply shows up as a failure
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def test_50_concurrent_gateway_submissions() -> None:
    with start_devnet("regtest") as devnet:
        with devnet.gateway_client() as client:
            job = client.get_mining_info()
        proofs = [mine_plain_proof(job, seed=s).to_bytes() for s in range(DISTINCT)]

        def submit(i: int) -> str:
            with devnet.gateway_client() as client:
                return client.submit_plain_proof(proofs[i % DISTINCT], job)

        replies = _run_concurrently(submit, SUBMISSIONS)
        assert replies == ["submitted"] * SUBMISSIONS
        assert devnet.gateway.wait_idle(60)
        outcomes = devnet.gateway.results()
        assert sorted(o.index for o in outcomes) == list(range(SUBMISSIONS))
        assert Counter(o.status for o in outcomes) == {"accepted": 1, "stale": SUBMISSIONS - 1}
        assert devnet.chain.height == 1


def _competing_block(seed: int) -> bytes:
    """A valid block on regtest's genesis, built by a scratch chain and gateway (no sockets)."""
    scratch = DevnetGateway(DevnetNode(Chain(get_params("regtest"))))
    try:
        job = scratch.mining_job()
        scratch.submit_plain_proof(base64.b64encode(mine_plain_proof(job, seed=seed).to_bytes()).decode(), job)
        assert scratch.wait_idle() and scratch.node.chain.height == 1
        return scratch.node.chain.tip.raw
    finally:
        scratch.close()


def test_50_concurrent_submitblock_calls() -> None:
    with start_devnet("regtest") as devnet:
        with devnet.gateway_client() as client:
            job = client.get_mining_info()
        blocks = [_competing_block(seed) for seed in range(DISTINCT)]
        assert all(Block.from_bytes(b).header.incomplete_bytes()[4:36] == job.incomplete_header_bytes[4:36]
                   for b in blocks)

        def submit(i: int) -> str | None:
            try:
                devnet.pearld_client(retries=0).submitblock(blocks[i % DISTINCT])
            except BlockRejected as exc:
                return exc.reason
            return None

        replies = _run_concurrently(submit, SUBMISSIONS)
        assert not any(isinstance(r, Exception) for r in replies), replies
        assert replies.count(None) == 1
        assert all(r.startswith(("already have block", "previous block")) for r in replies if r is not None)
        assert devnet.chain.height == 1
        assert devnet.pearld_client(retries=0).getblockchaininfo()["blocks"] == 1
