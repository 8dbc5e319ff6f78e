"""The control service over a real socket, its CLI clients, and the metrics endpoint."""
import json
import threading
import urllib.request

import grpc
import pytest

from miner import cli
from miner.metrics import start_metrics
from miner.service import ControlClient, serve
from miner.sources import GatewaySource
from miner.worker import Worker
from node_client.devnet import start_devnet
from test_miner_support import ServingThread, tiny_config, wait_until


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("service")
    with start_devnet("regtest", datadir=tmp / "chain") as devnet:
        source = GatewaySource(devnet.gateway_address, devnet.pearld_client(retries=0, timeout=5))
        worker = Worker(tiny_config(tmp / "data"), source)
        server, port = serve(worker, "127.0.0.1:0")
        with ServingThread(worker):
            wait_until(lambda: worker.stats.accepted >= 1, 60, "a first block")
            yield worker, f"127.0.0.1:{port}"
        server.stop(1)


def test_status_reports_live_figures(running) -> None:
    worker, address = running
    client = ControlClient(address)
    first = client.status()
    wait_until(lambda: client.status().serving.requests > first.serving.requests, 30, "more requests")
    later = client.status()
    assert later.state == "mining" and later.mode == "int7-moe" and later.network == "regtest"
    assert later.mining.accepted >= 1 and later.mining.credited_work > 0 and later.mining.tickets > 0
    assert later.serving.decode_tokens_per_s > 0 and later.height >= 1 and later.cert_version == 3
    assert later.backend == "cpu-int7-moe"
    client.close()


def test_pause_resume_and_set_mode(running) -> None:
    worker, address = running
    client = ControlClient(address)
    try:
        assert client.pause("maintenance").state == "paused"
        served = worker.generator.stats.requests
        wait_until(lambda: worker.generator.stats.requests > served, 30, "the batch in flight to end")
        mined, served = worker.stats.launches_mined, worker.generator.stats.requests
        wait_until(lambda: worker.generator.stats.requests > served + 1, 30, "serving while paused")
        assert worker.stats.launches_mined == mined
        assert client.resume().state == "mining"
        worker._mining_fault(MemoryError("test"))  # what the mined layer reports on an OOM
        assert client.status().state == "cooldown" and client.status().mining.oom_events == 1
        assert client.resume().state == "mining"  # an operator may end the cooldown
        assert client.set_mode("int7-dense").mode == "int7-dense"
        refused = client.set_mode("fp8-moe")  # cert V3: the rules refuse FP8; auto's choice stays
        assert refused.mode == "int7-moe" and "refused" in refused.mode_reason
        with pytest.raises(grpc.RpcError) as err:
            client.set_mode("warp-drive")
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert client.set_mode("auto").mode == "int7-moe"
    finally:
        client.close()


def test_the_slowdown_cap_is_set_live(running, capsys) -> None:
    worker, address = running
    client = ControlClient(address)
    try:
        assert client.set_max_slowdown(0.2).mining.max_slowdown == pytest.approx(0.2)
        assert worker.governor.max_slowdown == pytest.approx(0.2)
        with pytest.raises(grpc.RpcError) as err:
            client.set_max_slowdown(-0.5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "max_slowdown" in err.value.details()
        assert cli.main(["control", "slowdown", "0.1", "--address", address]) == 0
        assert "cap 10.0 %" in capsys.readouterr().out and worker.governor.max_slowdown == pytest.approx(0.1)
        assert cli.main(["control", "slowdown", "ten", "--address", address]) == 2
        assert "not a number" in capsys.readouterr().err
        assert cli.main(["control", "slowdown", "none", "--address", address]) == 0
        assert "cap none" in capsys.readouterr().out and worker.governor.max_slowdown is None
        assert cli.main(["control", "slowdown", "0.05", "--address", address]) == 0
        assert cli.main(["control", "slowdown", "0.0", "--address", address]) == 0  # 0 is no cap too
        assert "cap none" in capsys.readouterr().out and worker.governor.max_slowdown is None
        assert any(e.kind == "slowdown" and "10.0 %" in e.message for e in worker.events.recent())
    finally:
        client.set_max_slowdown(0.0)
        client.close()


def test_watch_events_streams_new_events(running) -> None:
    worker, address = running
    client = ControlClient(address)
    got = []
    stream = client.events(replay=True)

    def read() -> None:
        try:
            for event in stream:
                got.append(event)
                if event.kind == "paused":
                    stream.cancel()
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.CANCELLED

    reader = threading.Thread(target=read)
    reader.start()
    wait_until(lambda: any(e.kind == "job" for e in got), 10, "replayed events")
    client.pause("watch test")
    reader.join(10)
    client.resume()
    client.close()
    kinds = [e.kind for e in got]
    assert "job" in kinds and kinds[-1] == "paused"
    assert [e.seq for e in got] == sorted(e.seq for e in got)


def test_cli_status_and_control(running, capsys) -> None:
    worker, address = running
    assert cli.main(["status", "--address", address]) == 0
    text = capsys.readouterr().out
    assert "int7-moe" in text and "accepted=" in text and "tok/s" in text
    assert cli.main(["status", "--address", address, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert int(status["mining"]["accepted"]) >= 1 and int(status["serving"]["requests"]) > 0
    assert cli.main(["control", "pause", "cli", "--address", address]) == 0
    assert "state paused" in capsys.readouterr().out
    assert cli.main(["control", "resume", "--address", address]) == 0
    assert cli.main(["events", "--address", address, "--count", "2"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) >= 2


def test_cli_status_without_a_worker(capsys) -> None:
    assert cli.main(["status", "--address", "127.0.0.1:1"]) == 2
    assert "no worker answers" in capsys.readouterr().err


def test_cli_control_names_an_unknown_mode_without_a_worker(capsys) -> None:
    assert cli.main(["control", "mode", "int9", "--address", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert "'int9' is not one of auto" in err and "failed to connect" not in err


def test_metrics_endpoint(running) -> None:
    worker, _ = running
    port = start_metrics(worker.status, 0)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert "pearl_moe_credited_work_total" in body and "pearl_moe_accepted_total" in body
    assert 'pearl_moe_state{state="mining"} 1.0' in body or 'pearl_moe_state{state="paused"}' in body
    value = next(float(line.split()[-1]) for line in body.splitlines()
                 if line.startswith("pearl_moe_tickets_total"))
    assert value > 0
