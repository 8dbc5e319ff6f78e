"""Client for pearld's HTTP JSON-RPC (node-consensus.md §5): templates, block submission, chain state.

HTTP POST to ``/`` with Basic auth; TLS (pearld's default) when the URL is ``https://``, verified
against a configurable CA file (pearld's self-signed ``rpc.cert``). Transport failures are retried
with exponential backoff; RPC errors and ``"rejected: …"`` results become typed exceptions carrying
the node's own text.
"""
from __future__ import annotations

import base64
import dataclasses
import http.client
import itertools
import json
import ssl
import threading
import time
import urllib.parse
from typing import Any, Callable

from proof.chain import target_from_bits

GBT_CAPABILITIES = ("coinbasevalue", "workid", "coinbase/append")
GBT_RULES = ("segwit",)
HEADER_SIZE = 108


class PearldError(Exception):
    """Base class of the pearld client's errors."""


class PearldConnectionError(PearldError):
    """pearld could not be reached (after the retries)."""


class PearldAuthError(PearldError):
    """HTTP 401: the RPC credentials were refused."""


class PearldRpcError(PearldError):
    """A JSON-RPC error object returned by pearld (``code`` and the node's ``message``)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"pearld RPC error {code}: {message}")
        self.code = code
        self.message = message


class BlockRejected(PearldError):
    """submitblock's ``"rejected: <text>"`` result; ``reason`` is the node's text after the prefix."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"rejected: {reason}")
        self.reason = reason


class ReplyError(PearldError):
    """A reply that is not the JSON-RPC shape pearld sends."""


def _field(data: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    if name not in data:
        raise ReplyError(f"getblocktemplate result lacks {name!r}")
    value = data[name]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ReplyError(f"getblocktemplate field {name!r} has the wrong type: {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class BlockTemplate:
    """The getblocktemplate fields a miner uses (§5.2); ``raw`` keeps the whole reply."""

    version: int
    height: int
    previous_block_hash: str
    bits: int
    target: int
    curtime: int
    mintime: int
    maxtime: int
    coinbase_value: int
    default_witness_commitment: bytes | None
    transactions: tuple[dict[str, Any], ...]
    required_cert_version: int
    ancestor_headers: tuple[bytes, ...]
    longpollid: str
    raw: dict[str, Any] = dataclasses.field(repr=False, compare=False)

    @classmethod
    def from_rpc(cls, data: Any) -> "BlockTemplate":
        if not isinstance(data, dict):
            raise ReplyError(f"getblocktemplate result must be an object, got {type(data).__name__}")
        try:
            bits = int(_field(data, "bits", str), 16)
            target = int(_field(data, "target", str), 16)
            commitment = data.get("default_witness_commitment")
            witness = bytes.fromhex(commitment) if commitment else None
            ancestors = tuple(bytes.fromhex(h) for h in data.get("ancestorheaders") or [])
        except ValueError as exc:
            raise ReplyError(f"getblocktemplate hex field is malformed: {exc}") from exc
        if target != target_from_bits(bits):
            raise ReplyError(f"getblocktemplate target {target:064x} does not match bits {bits:08x}")
        if any(len(h) != HEADER_SIZE for h in ancestors):
            raise ReplyError("getblocktemplate ancestorheaders must be 108-byte headers")
        required = data.get("requiredcertversion", 1)
        if not isinstance(required, int) or isinstance(required, bool) or required < 1:
            raise ReplyError(f"getblocktemplate requiredcertversion is invalid: {required!r}")
        transactions = _field(data, "transactions", list)
        return cls(
            version=_field(data, "version", int),
            height=_field(data, "height", int),
            previous_block_hash=_field(data, "previousblockhash", str),
            bits=bits,
            target=target,
            curtime=_field(data, "curtime", int),
            mintime=_field(data, "mintime", int),
            maxtime=_field(data, "maxtime", int),
            coinbase_value=_field(data, "coinbasevalue", int),
            default_witness_commitment=witness,
            transactions=tuple(transactions),
            required_cert_version=required,
            ancestor_headers=ancestors,
            longpollid=str(data.get("longpollid", "")),
            raw=data,
        )


class PearldClient:
    """A blocking, thread-safe pearld RPC client (one HTTP connection per call, as pearld closes them)."""

    def __init__(
        self,
        url: str,
        user: str,
        password: str,
        *,
        cafile: str | None = None,
        timeout: float = 30.0,
        retries: int = 5,
        backoff_initial: float = 1.0,
        backoff_max: float = 60.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"pearld URL must be http(s)://HOST:PORT, got {url!r}")
        if retries < 0 or backoff_initial < 0 or backoff_max < backoff_initial:
            raise ValueError("retries must be >= 0 and 0 <= backoff_initial <= backoff_max")
        self.url = url
        self._host = parsed.hostname
        self._port = parsed.port or (443 if parsed.scheme == "https" else 80)
        self._tls = ssl.create_default_context(cafile=cafile) if parsed.scheme == "https" else None
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        self._auth = f"Basic {token}"
        self._timeout = timeout
        self._retries = retries
        self._backoff = (backoff_initial, backoff_max)
        self._sleep = sleep
        self._ids = itertools.count(1)
        self._id_lock = threading.Lock()

    def _post_once(self, body: bytes) -> tuple[int, bytes]:
        if self._tls is not None:
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                self._host, self._port, timeout=self._timeout, context=self._tls
            )
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
        try:
            conn.request("POST", "/", body=body, headers={
                "Authorization": self._auth, "Content-Type": "application/json",
            })
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def _post(self, body: bytes) -> tuple[int, bytes]:
        delay, delay_max = self._backoff
        failure: Exception | None = None
        for attempt in range(self._retries + 1):
            if attempt:
                self._sleep(delay)
                delay = min(delay_max, delay * 2)
            try:
                return self._post_once(body)
            except ssl.SSLCertVerificationError as exc:
                raise PearldConnectionError(f"pearld at {self.url}: TLS verification failed: {exc}") from exc
            except (OSError, http.client.HTTPException) as exc:
                failure = exc
        raise PearldConnectionError(
            f"pearld at {self.url} unreachable after {self._retries + 1} attempts: {failure}"
        ) from failure

    def call(self, method: str, params: list[Any] | None = None) -> Any:
        """One JSON-RPC call; returns ``result`` or raises PearldRpcError / PearldAuthError."""
        with self._id_lock:
            ident = next(self._ids)
        body = json.dumps({"jsonrpc": "1.0", "id": ident, "method": method, "params": params or []}).encode()
        status, payload = self._post(body)
        if status == 401:
            raise PearldAuthError(f"pearld at {self.url} refused the RPC credentials (HTTP 401)")
        try:
            reply = json.loads(payload)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ReplyError(f"pearld replied HTTP {status} with non-JSON body: {payload[:200]!r}") from exc
        if not isinstance(reply, dict):
            raise ReplyError(f"pearld reply must be an object, got {type(reply).__name__}")
        error = reply.get("error")
        if error is not None:
            if not isinstance(error, dict) or "code" not in error:
                raise ReplyError(f"pearld error object is malformed: {error!r}")
            raise PearldRpcError(int(error["code"]), str(error.get("message", "")))
        if status != 200:
            raise ReplyError(f"pearld replied HTTP {status}")
        if reply.get("id") != ident:
            raise ReplyError(f"pearld reply id {reply.get('id')!r} does not match request id {ident}")
        return reply.get("result")

    def getblocktemplate(self) -> BlockTemplate:
        request = {"capabilities": list(GBT_CAPABILITIES), "rules": list(GBT_RULES)}
        return BlockTemplate.from_rpc(self.call("getblocktemplate", [request]))

    def submitblock(self, block: bytes | str) -> None:
        """Submit a serialized block; returns on acceptance, raises BlockRejected with the node's text."""
        block_hex = block if isinstance(block, str) else block.hex()
        result = self.call("submitblock", [block_hex])
        if result is None:
            return
        if isinstance(result, str) and result.startswith("rejected: "):
            raise BlockRejected(result[len("rejected: "):])
        raise BlockRejected(str(result))

    def getblockchaininfo(self) -> dict[str, Any]:
        result = self.call("getblockchaininfo")
        if not isinstance(result, dict) or not isinstance(result.get("blocks"), int):
            raise ReplyError(f"getblockchaininfo result is malformed: {result!r}")
        return result

    def getbestblockhash(self) -> str:
        result = self.call("getbestblockhash")
        if not isinstance(result, str) or len(result) != 64:
            raise ReplyError(f"getbestblockhash result is malformed: {result!r}")
        return result

    def getblockheader(self, block_hash: str, verbose: bool = True) -> dict[str, Any] | bytes:
        """The header as pearld's JSON object, or (verbose=False) its 108 raw bytes."""
        result = self.call("getblockheader", [block_hash, verbose])
        if verbose:
            if not isinstance(result, dict):
                raise ReplyError(f"getblockheader result is malformed: {result!r}")
            return result
        try:
            raw = bytes.fromhex(result)
        except (TypeError, ValueError) as exc:
            raise ReplyError(f"getblockheader hex is malformed: {result!r}") from exc
        if len(raw) != HEADER_SIZE:
            raise ReplyError(f"getblockheader returned {len(raw)} bytes, expected {HEADER_SIZE}")
        return raw
