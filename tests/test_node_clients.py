"""The pearld and gateway clients on their own: retries with backoff, reply checks, schema checks."""
from __future__ import annotations

import socket
import threading

import pytest

from node_client import gateway as gw
from node_client import pearld
from proof.chain import target_from_bits


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_pearld_retries_with_exponential_backoff_then_gives_up() -> None:
    delays: list[float] = []
    client = pearld.PearldClient(f"http://127.0.0.1:{_closed_port()}", "u", "p", retries=7,
                                 backoff_initial=1.0, backoff_max=60.0, sleep=delays.append)
    with pytest.raises(pearld.PearldConnectionError, match="after 8 attempts"):
        client.getbestblockhash()
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0]


@pytest.mark.parametrize("url", ["ftp://x:1", "localhost:8332", "http://"])
def test_pearld_rejects_bad_urls(url: str) -> None:
    with pytest.raises(ValueError, match="http"):
        pearld.PearldClient(url, "u", "p")


def _template(**changes) -> dict:
    data = {
        "bits": "1e010000", "target": f"{target_from_bits(0x1E010000):064x}", "curtime": 10, "height": 5,
        "previousblockhash": "00" * 32, "version": 0x20000000, "coinbasevalue": 50, "transactions": [],
        "default_witness_commitment": "11" * 32, "mintime": 9, "maxtime": 20, "longpollid": "x-1",
    }
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


def test_block_template_parsing() -> None:
    template = pearld.BlockTemplate.from_rpc(_template())
    assert template.required_cert_version == 1  # absent → 1, as the gateway reads it
    assert template.default_witness_commitment == bytes([0x11]) * 32 and template.ancestor_headers == ()
    v4 = pearld.BlockTemplate.from_rpc(_template(requiredcertversion=4, ancestorheaders=["22" * 108]))
    assert v4.ancestor_headers == (bytes([0x22]) * 108,)


@pytest.mark.parametrize("changes,needle", [
    (dict(target="00" * 32), "does not match bits"),
    (dict(bits=None), "lacks 'bits'"),
    (dict(height="5"), "wrong type"),
    (dict(requiredcertversion=0), "requiredcertversion"),
    (dict(ancestorheaders=["22" * 107]), "108-byte"),
    (dict(bits="zz"), "malformed"),
])
def test_block_template_refuses_malformed_replies(changes, needle) -> None:
    with pytest.raises(pearld.ReplyError, match=needle):
        pearld.BlockTemplate.from_rpc(_template(**changes))


def test_mining_job_round_trip_and_schema() -> None:
    job = gw.MiningJob(bytes(76), 123, 4, (bytes(108),))
    assert gw.MiningJob.from_dict(job.to_dict()) == job
    with pytest.raises(gw.SchemaError, match="76 bytes"):
        gw.MiningJob(bytes(75), 1, 3)
    with pytest.raises(gw.SchemaError, match="target"):
        gw.MiningJob.from_dict({"incomplete_header_bytes": "", "target": -1, "cert_version": 3})
    with pytest.raises(gw.SchemaError, match="ancestor_headers"):
        gw.MiningJob.from_dict({**job.to_dict(), "ancestor_headers": "x"})


@pytest.mark.parametrize("address,expected", [
    ("tcp://127.0.0.1:8337", (socket.AF_INET, ("127.0.0.1", 8337))),
    ("127.0.0.1:9", (socket.AF_INET, ("127.0.0.1", 9))),
    ("unix:///tmp/pearlgw.sock", (socket.AF_UNIX, "/tmp/pearlgw.sock")),
    ("/run/gw.sock", (socket.AF_UNIX, "/run/gw.sock")),
])
def test_gateway_addresses(address, expected) -> None:
    assert gw.parse_address(address) == expected


def test_gateway_bad_address() -> None:
    with pytest.raises(ValueError, match="tcp://HOST:PORT"):
        gw.parse_address("nohost")


def _one_shot_server(reply: bytes) -> int:
    """A TCP server that answers one request line with ``reply`` and closes."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def serve() -> None:
        conn, _ = server.accept()
        with conn, conn.makefile("rb") as reader:
            reader.readline()
            conn.sendall(reply)
        server.close()

    threading.Thread(target=serve, daemon=True).start()
    return server.getsockname()[1]


@pytest.mark.parametrize("reply,needle", [
    (b"not json\n", "not JSON"),
    (b'{"jsonrpc": "2.0", "result": {}, "id": 77}\n', "echo the request id"),
    (b'{"jsonrpc": "2.0", "id": 1}\n', "'result' or 'error'"),
    (b'{"jsonrpc": "2.0", "error": {"code": "x", "message": "m"}, "id": 1}\n', "code"),
    (b'{"jsonrpc": "2.0", "result": {"incomplete_header_bytes": "AA==", "target": 1, "cert_version": 3}, "id": 1}\n',
     "76 bytes"),
])
def test_gateway_client_checks_replies(reply: bytes, needle: str) -> None:
    with gw.GatewayClient(f"tcp://127.0.0.1:{_one_shot_server(reply)}", timeout=10) as client:
        with pytest.raises(gw.SchemaError, match=needle):
            client.get_mining_info()


def test_gateway_client_unreachable() -> None:
    with gw.GatewayClient(f"tcp://127.0.0.1:{_closed_port()}", timeout=5) as client:
        with pytest.raises(gw.GatewayConnectionError):
            client.get_mining_info()
