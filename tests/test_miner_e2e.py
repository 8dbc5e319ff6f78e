"""End to end on the CPU: the worker serves a MoE model and mines accepted devnet blocks."""
import pytest

from miner.sources import GatewaySource
from miner.worker import Worker
from node_client.devnet import start_devnet
from test_miner_support import ServingThread, tiny_config, wait_until


@pytest.mark.parametrize("network, mode, blocks", [
    ("regtest", "int7-moe", 2),  # mainline regtest: cert V3, MoE allowed
    ("mainnet@100000", "int7-dense", 2),  # mainnet rules: dense-only fallback
    ("regtest-fp8", "fp8-moe", 1),  # the fp8-scheme build: cert V4
    ("mainnet@91000", "int7-moe", 1),  # cert V2 (legacy seeds) before dense-only
    ("signet", "int7-dense", 1),  # cert V1: legacy plain-proof form
])
def test_worker_mines_accepted_devnet_blocks(tmp_path, network: str, mode: str, blocks: int) -> None:
    with start_devnet(network, datadir=tmp_path / "chain") as devnet:
        start = devnet.chain.height
        source = GatewaySource(devnet.gateway_address, devnet.pearld_client(retries=0, timeout=5))
        worker = Worker(tiny_config(tmp_path / "data", network, max_blocks=blocks), source)
        with ServingThread(worker):
            wait_until(lambda: worker.stats.accepted >= blocks, 240, f"{blocks} accepted block(s)")
        # read the status once the worker has stopped: until then it may still submit a proof
        # for a job it was already mining, which the gateway would count and the snapshot not
        status = worker.status()
        devnet.gateway.wait_idle()
        results = devnet.gateway.results()
    assert status["mode"] == mode
    assert devnet.chain.height >= start + blocks
    accepted = [r for r in results if r.status == "accepted"]
    assert len(accepted) >= blocks
    assert all(r.status in ("accepted", "stale") for r in results), results
    # one proof per job, never the same proof twice
    assert status["mining"]["submitted"] == len(results)
    assert status["mining"]["verify_failed"] == 0 and status["mining"]["refused_by_rules"] == 0
    assert status["serving"]["requests"] > 0 and status["mining"]["credited_work"] > 0


def test_mode_switches_when_the_chain_crosses_the_dense_only_height(tmp_path) -> None:
    with start_devnet("mainnet@91628", datadir=tmp_path / "chain") as devnet:
        source = GatewaySource(devnet.gateway_address, devnet.pearld_client(retries=0, timeout=5))
        worker = Worker(tiny_config(tmp_path / "data", "mainnet@91628", max_blocks=3), source)
        with ServingThread(worker):
            wait_until(lambda: worker.stats.accepted >= 3, 120, "three accepted blocks")
        devnet.gateway.wait_idle()
        results = devnet.gateway.results()
    modes = [e.message.split(":")[0] for e in worker.events.recent() if e.kind == "mode"]
    assert modes[:2] == ["int7-moe", "int7-dense"]
    submitted = [e.message for e in worker.events.recent() if e.kind == "submitted"]
    assert "(int7-moe" in submitted[0] and "(int7-dense" in submitted[-1]
    assert [r.height for r in results if r.status == "accepted"][:3] == [91628, 91629, 91630]
    assert worker.stats.refused_by_rules == 0
