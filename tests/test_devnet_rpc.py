"""Bad input to the devnet's two servers gets the right JSON-RPC error, and they keep serving."""
from __future__ import annotations

import base64
import http.client
import json
import socket
import subprocess

import pytest

from node_client import gateway as gw
from node_client import pearld
from node_client.devnet import start_devnet
from node_client.devnet.cpu_miner import mine_plain_proof
from node_client.devnet.rpc_gateway import OVERLONG_LINE_MESSAGE


@pytest.fixture(scope="module")
def devnet():
    with start_devnet("regtest") as running:
        yield running


# --- gateway: raw line-delimited JSON over TCP -----------------------------------------------------

class Line:
    """A raw gateway connection: send bytes, read one reply line."""

    def __init__(self, address: str) -> None:
        family, sockaddr = gw.parse_address(address)
        self.sock = socket.create_connection(sockaddr, timeout=30)
        self.reader = self.sock.makefile("rb")

    def ask(self, payload: bytes) -> dict:
        self.sock.sendall(payload)
        return json.loads(self.reader.readline())

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


def _request(method: str, params=None, ident=1) -> bytes:
    body = {"jsonrpc": "2.0", "method": method, "id": ident}
    if params is not None:
        body["params"] = params
    return json.dumps(body).encode() + b"\n"


@pytest.fixture()
def line(devnet):
    conn = Line(devnet.gateway_address)
    yield conn
    conn.close()


def _assert_serving(line: Line) -> None:
    reply = line.ask(_request("getMiningInfo", {}, ident=99))
    assert reply["id"] == 99 and len(base64.b64decode(reply["result"]["incomplete_header_bytes"])) == 76


@pytest.mark.parametrize("payload,code,ident", [
    (b"{not json\n", gw.PARSE_ERROR, None),
    (b"\xff\xfe\n", gw.PARSE_ERROR, None),
    (b'{"jsonrpc": "1.0", "method": "getMiningInfo", "id": 7}\n', gw.INVALID_REQUEST, 7),
    (b'{"jsonrpc": "2.0", "method": "getMiningInfo"}\n', gw.INVALID_REQUEST, None),
    (b'{"jsonrpc": "2.0", "method": "getMiningInfo", "id": 3, "extra": 1}\n', gw.INVALID_REQUEST, 3),
    (b'{"jsonrpc": "2.0", "method": "getMiningInfo", "params": [], "id": 4}\n', gw.INVALID_REQUEST, 4),
    (b'{"jsonrpc": "2.0", "method": 5, "id": 5}\n', gw.INVALID_REQUEST, 5),
    (b'[1, 2]\n', gw.INVALID_REQUEST, None),
    (_request("mineForMe", {}), gw.METHOD_NOT_FOUND, 1),
    (_request("getMiningInfo", {"x": 1}), gw.INVALID_PARAMS, 1),
    (_request("submitPlainProof", {"plain_proof": "AAAA"}), gw.INVALID_PARAMS, 1),
    (_request("submitPlainProof", {"plain_proof": "not base64!", "mining_job": {
        "incomplete_header_bytes": "AA==", "target": 1, "cert_version": 3}}), gw.INVALID_PARAMS, 1),
    (_request("submitPlainProof", {"plain_proof": "AAAA", "mining_job": {
        "incomplete_header_bytes": "AA==", "target": "1", "cert_version": 3}}), gw.INVALID_PARAMS, 1),
    (_request("submitPlainProof", {"plain_proof": "AAAA", "mining_job": {
        "incomplete_header_bytes": "AA==", "target": 1, "cert_version": True}}), gw.INVALID_PARAMS, 1),
])
def test_gateway_error_codes(line: Line, payload: bytes, code: int, ident) -> None:
    reply = line.ask(payload)
    assert reply["jsonrpc"] == "2.0" and reply["error"]["code"] == code and reply["id"] == ident
    if code == gw.INVALID_PARAMS:
        assert reply["error"]["message"] == "Invalid params" and reply["error"]["data"]
    _assert_serving(line)


def test_gateway_undecodable_proof_is_an_internal_error(devnet, line: Line) -> None:
    job = devnet.gateway.mining_job().to_dict()
    reply = line.ask(_request("submitPlainProof", {"plain_proof": base64.b64encode(b"junk").decode(),
                                                   "mining_job": job}))
    assert reply["error"]["code"] == gw.INTERNAL_ERROR and "plain proof does not decode" in reply["error"]["message"]
    _assert_serving(line)


def test_gateway_line_over_4_mib(line: Line) -> None:
    reply = line.ask(b'{"x": "' + b"a" * gw.LINE_LIMIT + b'"}\n')
    assert reply == {"jsonrpc": "2.0", "error": {"code": gw.INTERNAL_ERROR, "message": OVERLONG_LINE_MESSAGE},
                     "id": None}
    _assert_serving(line)


def test_gateway_mining_paused(devnet) -> None:
    devnet.gateway.set_paused(True)
    try:
        with devnet.gateway_client() as client:
            with pytest.raises(gw.MiningPaused) as info:
                client.get_mining_info()
        assert info.value.code == gw.MINING_PAUSED
    finally:
        devnet.gateway.set_paused(False)


def test_gateway_client_maps_errors_and_checks_requests(devnet) -> None:
    with devnet.gateway_client() as client:
        with pytest.raises(gw.GatewayError) as info:
            client.call("mineForMe", {})
        assert info.value.code == gw.METHOD_NOT_FOUND and info.value.message == "Method mineForMe not found"
        job = client.get_mining_info()
        with pytest.raises(gw.SchemaError, match="4 MiB"):
            client.submit_plain_proof(bytes(gw.LINE_LIMIT), job)
        assert client.get_mining_info() == job


def test_gateway_unix_socket(tmp_path) -> None:
    path = str(tmp_path / "gw.sock")
    with start_devnet("regtest", gateway_socket=path) as devnet:
        assert devnet.gateway_address == f"unix://{path}"
        with devnet.gateway_client() as client:
            job = client.get_mining_info()
            assert client.submit_plain_proof(mine_plain_proof(job).to_bytes(), job) == "submitted"
        assert devnet.gateway.wait_idle() and devnet.gateway.results()[-1].status == "accepted"


# --- pearld: HTTP JSON-RPC -------------------------------------------------------------------------

def _post(devnet, body: bytes, auth: str | None = "devnet:devnet") -> tuple[int, dict, bytes]:
    host, port = devnet.pearld_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    headers = {"Content-Type": "application/json"}
    if auth is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(auth.encode()).decode()
    conn.request("POST", "/", body=body, headers=headers)
    response = conn.getresponse()
    result = response.status, dict(response.getheaders()), response.read()
    conn.close()
    return result


@pytest.mark.parametrize("auth", [None, "devnet:wrong", "nobody:devnet", "garbage-without-colon"])
def test_pearld_wrong_credentials(devnet, auth) -> None:
    status, headers, _ = _post(devnet, b'{"id":1,"method":"getblockcount","params":[]}', auth)
    assert status == 401 and headers["WWW-Authenticate"] == 'Basic realm="pearld RPC"'
    client = pearld.PearldClient(devnet.pearld_url, "devnet", "wrong", retries=0)
    with pytest.raises(pearld.PearldAuthError):
        client.getblockchaininfo()
    assert devnet.pearld_client(retries=0).getblockchaininfo()["blocks"] >= 0


@pytest.mark.parametrize("body,code", [
    (b"{broken", -32700),
    (b'{"jsonrpc":"1.0","id":1,"method":"nosuch","params":[]}', -32601),
    (b'{"jsonrpc":"1.0","id":1,"method":"getblockhash","params":["x"]}', -32602),
    (b'{"jsonrpc":"1.0","id":1,"method":"getblockhash","params":[]}', -32602),
    (b'{"jsonrpc":"1.0","id":1,"method":"getblockhash","params":[99999]}', -1),
    (b'{"jsonrpc":"1.0","id":1,"method":"getblockheader","params":["00"]}', -5),
    (b'{"jsonrpc":"1.0","id":1,"method":"getblockheader","params":["zz"]}', -22),
    (b'{"jsonrpc":"1.0","id":1,"method":"getblocktemplate","params":[{"mode":"x"}]}', -8),
    (b'{"jsonrpc":"1.0","id":1,"method":"getblocktemplate","params":[{"mode":"proposal"}]}', -3),
    (b'{"jsonrpc":"1.0","id":1,"method":"getblocktemplate","params":[{"mode":"proposal","data":"zz"}]}', -22),
    (b'{"jsonrpc":"1.0","id":1,"method":"getblocktemplate","params":[{"mode":"proposal","data":"0100"}]}', -22),
    (b'{"jsonrpc":"1.0","id":1,"method":"submitblock","params":[]}', -32602),
    (b'{"jsonrpc":"1.0","id":1,"method":"submitblock","params":[12]}', -32602),
    (b'{"jsonrpc":"1.0","id":1,"method":"submitblock","params":["xyz"]}', -22),
    (b'{"jsonrpc":"1.0","id":1,"method":"submitblock","params":["0100"]}', -22),
    (b'{"jsonrpc":"1.0","id":1,"method":"getblockcount","params":{"a":1}}', -32600),
])
def test_pearld_error_codes(devnet, body: bytes, code: int) -> None:
    status, headers, payload = _post(devnet, body)
    assert status == 200 and headers["Connection"] == "close" and payload.endswith(b"\n")
    reply = json.loads(payload)
    assert reply["result"] is None and reply["error"]["code"] == code
    assert devnet.pearld_client(retries=0).getbestblockhash()


def test_pearld_limited_user() -> None:
    with start_devnet("regtest", rpc_limit_user="pool", rpc_limit_password="limited") as devnet:
        limited = pearld.PearldClient(devnet.pearld_url, "pool", "limited", retries=0)
        assert limited.getbestblockhash() == devnet.pearld_client().getbestblockhash()
        with pytest.raises(pearld.PearldRpcError) as info:
            limited.getblocktemplate()
        assert (info.value.code, info.value.message) == (-32602, "limited user not authorized for this method")
        with pytest.raises(pearld.BlockRejected, match="already have block"):
            limited.submitblock(devnet.chain.tip.raw)


def test_pearld_truncated_blocks_fail_to_decode(devnet) -> None:
    client = devnet.pearld_client(retries=0)
    block = devnet.chain.tip.raw
    for cut in (1, 4, 40, len(block) // 2, len(block) - 1):
        with pytest.raises(pearld.PearldRpcError) as info:
            client.submitblock(block[:cut])
        assert info.value.code == -22 and info.value.message.startswith("Block decode failed: ")
    with pytest.raises(pearld.BlockRejected, match="already have block"):
        client.submitblock(block)
    proposal = client.call("getblocktemplate", [{"mode": "proposal", "data": block.hex()}])
    assert proposal == "bad-prevblk"


def test_pearld_batches_versions_and_notifications(devnet) -> None:
    body = json.dumps([
        {"jsonrpc": "2.0", "id": "a", "method": "getblockcount", "params": []},
        {"jsonrpc": "1.0", "id": 2, "method": "nosuch"},
        {"jsonrpc": "2.0", "method": "getblockcount", "params": []},
    ]).encode()
    status, _, payload = _post(devnet, body)
    first, second = json.loads(payload)
    assert first == {"jsonrpc": "2.0", "result": devnet.chain.height, "id": "a"}
    assert second["error"]["code"] == -32601 and second["id"] == 2
    status, _, payload = _post(devnet, b'{"jsonrpc":"1.0","id":null,"method":"getblockcount"}')
    assert status == 200 and payload == b""


def test_pearld_template_shape(devnet) -> None:
    raw = devnet.pearld_client(retries=0).call("getblocktemplate", [{"rules": ["segwit"]}])
    assert raw["requiredcertversion"] == 3 and raw["bits"] == "1e010000" and "ancestorheaders" not in raw
    assert raw["mintime"] <= raw["curtime"] <= raw["maxtime"] and len(raw["target"]) == 64
    assert len(bytes.fromhex(raw["default_witness_commitment"])) == 32


@pytest.fixture(scope="module")
def tls_pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "rpc.cert", folder / "rpc.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=devnet",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return str(cert), str(key)


def test_pearld_over_tls_with_a_configured_ca(tls_pair) -> None:
    cert, key = tls_pair
    with start_devnet("regtest", tls_cert=cert, tls_key=key) as devnet:
        assert devnet.pearld_url.startswith("https://")
        assert devnet.pearld_client(retries=0).getblockchaininfo()["blocks"] == 0
        untrusting = pearld.PearldClient(devnet.pearld_url, "devnet", "devnet", retries=0)
        with pytest.raises(pearld.PearldConnectionError, match="TLS verification failed"):
            untrusting.getblockchaininfo()
        plain = pearld.PearldClient(devnet.pearld_url.replace("https", "http"), "devnet", "devnet", retries=0)
        with pytest.raises(pearld.PearldError):
            plain.getblockchaininfo()
        assert devnet.pearld_client(retries=0).getbestblockhash()
