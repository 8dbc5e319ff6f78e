"""Acceptance accounting against a real devnet: whether a submitted job's block is in the chain,
however far the chain has moved on."""
import dataclasses

from miner.jobs import MiningJob
from miner.sources import GatewaySource
from node_client.devnet import start_devnet
from node_client.devnet.cpu_miner import mine_one
from node_client.gateway import GatewayClient


def test_block_status_answers_for_deep_blocks_rivals_and_the_tip(tmp_path) -> None:
    with start_devnet("regtest", datadir=tmp_path / "chain") as devnet:
        client = GatewayClient(devnet.gateway_address)
        source = GatewaySource(devnet.gateway_address, devnet.pearld_client(retries=0, timeout=5))
        first = None
        for seed in range(8):  # more blocks than the 6 the first form searched back from the tip
            mined = mine_one(client, seed=seed)
            devnet.gateway.wait_idle()
            first = first or MiningJob(mined)
        assert [r.status for r in devnet.gateway.results()] == ["accepted"] * 8
        # the same parent, another header (its time field): a block that did not make the chain
        rival_header = bytearray(first.header76)
        rival_header[68] ^= 1
        rival = MiningJob(dataclasses.replace(first.wire, incomplete_header_bytes=bytes(rival_header)))
        current = MiningJob(client.get_mining_info())
        assert source.block_status(first) is True
        assert source.block_status(rival) is False
        assert source.block_status(current) is None  # its parent (the tip) has no successor yet
        assert GatewaySource(devnet.gateway_address).block_status(first) is None  # no pearld: unknown


def test_shutdown_counts_a_block_submitted_just_before_the_stop(tmp_path) -> None:
    """The poller has stopped with the submitted job still current; shutdown reads the chain once more."""
    from miner.worker import Worker
    from tests.test_miner_support import tiny_config

    with start_devnet("regtest", datadir=tmp_path / "chain") as devnet:
        client = GatewayClient(devnet.gateway_address)
        source = GatewaySource(devnet.gateway_address, devnet.pearld_client(retries=0, timeout=5))
        worker = Worker(tiny_config(tmp_path / "data"), source)
        job = MiningJob(mine_one(client, seed=3))
        devnet.gateway.wait_idle()
        worker.poller.current = job  # what a poller stopped right after the submission still holds
        worker.completion.awaiting.append(job)
        worker.check_blocks()
        assert worker.stats.snapshot()["accepted"] == 0  # the job still looks current
        worker.shutdown()
        assert worker.stats.snapshot()["accepted"] == 1 and not worker.completion.awaiting
