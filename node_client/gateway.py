"""Client for pearl-gateway's miner RPC: line-delimited JSON-RPC 2.0 over TCP or a Unix socket.

Wire format (fp8-and-integration.md §14.3, gateway schemas.py @ 4a356c31, server.py @ 2ad4bc25):
one JSON object per line, each line at most 4 MiB; methods ``getMiningInfo`` (params ``{}``) and
``submitPlainProof`` (params ``{plain_proof, mining_job}``). The schema checks here are used both by
this client (requests before sending, replies on receipt) and by the devnet's gateway server.
"""
from __future__ import annotations

import base64
import binascii
import dataclasses
import itertools
import json
import re
import socket
import threading
from typing import Any

LINE_LIMIT = 4 * 2**20
DEFAULT_TCP_PORT = 8337

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32000
MINING_PAUSED = -32001

INCOMPLETE_HEADER_SIZE = 76
HEADER_SIZE = 108
_BASE64 = re.compile(r"^[A-Za-z0-9+/]*={0,2}$")


class SchemaError(ValueError):
    """A request or reply that does not match the gateway's JSON schema; the message says where."""


class GatewayError(Exception):
    """A JSON-RPC error object returned by the gateway."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"gateway error {code}: {message}" + (f" ({data})" if data is not None else ""))
        self.code = code
        self.message = message
        self.data = data


class MiningPaused(GatewayError):
    """−32001: the gateway has no block template yet; poll again later."""


class GatewayConnectionError(ConnectionError):
    """The gateway could not be reached or closed the connection mid-reply."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _require(condition: bool, where: str, what: str) -> None:
    if not condition:
        raise SchemaError(f"{where} {what}")


def _check_object(obj: Any, where: str, required: set[str], allowed: set[str] | None) -> None:
    _require(isinstance(obj, dict), where, "must be an object")
    missing = sorted(required - set(obj))
    _require(not missing, where, f"must contain {missing}")
    if allowed is not None:
        extra = sorted(set(obj) - allowed)
        _require(not extra, where, f"must not contain additional properties {extra}")


def _check_base64(value: Any, where: str) -> None:
    _require(isinstance(value, str) and bool(_BASE64.match(value)), where, "must be a base64 string")


def decode_base64(value: str, where: str) -> bytes:
    _check_base64(value, where)
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error as exc:
        raise SchemaError(f"{where} is not valid base64: {exc}") from exc


def validate_envelope(body: Any) -> None:
    """The request envelope: exactly jsonrpc "2.0", method, optional object params, id."""
    _check_object(body, "data", {"jsonrpc", "method", "id"}, {"jsonrpc", "method", "params", "id"})
    _require(body["jsonrpc"] == "2.0", "data.jsonrpc", "must be one of ['2.0']")
    _require(isinstance(body["method"], str), "data.method", "must be string")
    _require("params" not in body or isinstance(body["params"], dict), "data.params", "must be object")
    ident = body["id"]
    _require(
        ident is None or isinstance(ident, str) or (isinstance(ident, (int, float)) and not isinstance(ident, bool)),
        "data.id", "must be string, number or null",
    )


def validate_get_mining_info_params(params: Any) -> None:
    _check_object(params, "data", set(), set())


def validate_mining_job(job: Any, where: str = "data.mining_job") -> None:
    """The mining job as submitPlainProof accepts it (and getMiningInfo returns it)."""
    _check_object(job, where, {"incomplete_header_bytes", "target", "cert_version"}, None)
    _check_base64(job["incomplete_header_bytes"], f"{where}.incomplete_header_bytes")
    _require(_is_int(job["target"]) and job["target"] >= 0, f"{where}.target", "must be an integer >= 0")
    _require(
        _is_int(job["cert_version"]) and job["cert_version"] >= 1, f"{where}.cert_version", "must be an integer >= 1"
    )
    if "ancestor_headers" in job:
        headers = job["ancestor_headers"]
        _require(isinstance(headers, list), f"{where}.ancestor_headers", "must be array")
        for i, item in enumerate(headers):
            _check_base64(item, f"{where}.ancestor_headers[{i}]")


def validate_submit_params(params: Any) -> None:
    _check_object(params, "data", {"plain_proof", "mining_job"}, {"plain_proof", "mining_job"})
    _check_base64(params["plain_proof"], "data.plain_proof")
    validate_mining_job(params["mining_job"])


@dataclasses.dataclass(frozen=True)
class MiningJob:
    """What to mine: the 76-byte incomplete header, the target, the certificate version, and for V4
    the ancestor headers (108 bytes each, parent first)."""

    incomplete_header_bytes: bytes
    target: int
    cert_version: int
    ancestor_headers: tuple[bytes, ...] = ()

    def __post_init__(self) -> None:
        if len(self.incomplete_header_bytes) != INCOMPLETE_HEADER_SIZE:
            raise SchemaError(
                f"incomplete_header_bytes must be {INCOMPLETE_HEADER_SIZE} bytes, got {len(self.incomplete_header_bytes)}"
            )
        for i, header in enumerate(self.ancestor_headers):
            if len(header) != HEADER_SIZE:
                raise SchemaError(f"ancestor_headers[{i}] must be {HEADER_SIZE} bytes, got {len(header)}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "incomplete_header_bytes": base64.b64encode(self.incomplete_header_bytes).decode(),
            "target": self.target,
            "cert_version": self.cert_version,
            "ancestor_headers": [base64.b64encode(h).decode() for h in self.ancestor_headers],
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "mining_job") -> "MiningJob":
        validate_mining_job(data, where)
        return cls(
            incomplete_header_bytes=decode_base64(data["incomplete_header_bytes"], f"{where}.incomplete_header_bytes"),
            target=data["target"],
            cert_version=data["cert_version"],
            ancestor_headers=tuple(
                decode_base64(h, f"{where}.ancestor_headers[{i}]") for i, h in enumerate(data.get("ancestor_headers", []))
            ),
        )


def encode_line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def parse_address(address: str) -> tuple[int, Any]:
    """``tcp://HOST:PORT``, ``HOST:PORT``, ``unix:///path`` or ``/path`` → (socket family, sockaddr)."""
    if address.startswith("unix://"):
        return socket.AF_UNIX, address[len("unix://"):]
    if address.startswith("/"):
        return socket.AF_UNIX, address
    hostport = address[len("tcp://"):] if address.startswith("tcp://") else address
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"gateway address must be tcp://HOST:PORT or unix:///PATH, got {address!r}")
    return socket.AF_INET, (host, int(port))


class GatewayClient:
    """A blocking, thread-safe client holding one connection; it reconnects once when the gateway
    closed the previous connection."""

    def __init__(self, address: str, *, timeout: float = 30.0) -> None:
        self._family, self._sockaddr = parse_address(address)
        self.address = address
        self._timeout = timeout
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._sock: socket.socket | None = None
        self._reader: Any = None

    def __enter__(self) -> "GatewayClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            self._disconnect()

    def _disconnect(self) -> None:
        if self._reader is not None:
            self._reader.close()
        if self._sock is not None:
            self._sock.close()
        self._sock = self._reader = None

    def _connect(self) -> None:
        sock = socket.socket(self._family, socket.SOCK_STREAM)
        sock.settimeout(self._timeout)
        try:
            sock.connect(self._sockaddr)
        except OSError as exc:
            sock.close()
            raise GatewayConnectionError(f"cannot connect to gateway at {self.address}: {exc}") from exc
        self._sock = sock
        self._reader = sock.makefile("rb")

    def _exchange(self, line: bytes) -> bytes:
        if self._sock is None:
            self._connect()
        assert self._sock is not None
        self._sock.sendall(line)
        reply = self._reader.readline(LINE_LIMIT + 1)
        if not reply:
            raise GatewayConnectionError(f"gateway at {self.address} closed the connection")
        if len(reply) > LINE_LIMIT or not reply.endswith(b"\n"):
            self._disconnect()  # the rest of that line would be read as the next reply
            raise SchemaError("gateway reply exceeds the 4 MiB line limit or is truncated")
        return reply

    def call(self, method: str, params: dict[str, Any]) -> Any:
        """Send one request and return its result; raises GatewayError / MiningPaused / SchemaError."""
        with self._lock:
            ident = next(self._ids)
            request = {"jsonrpc": "2.0", "method": method, "params": params, "id": ident}
            validate_envelope(request)
            line = encode_line(request)
            if len(line) > LINE_LIMIT:
                raise SchemaError(f"request of {len(line)} bytes exceeds the gateway's 4 MiB line limit")
            try:
                reply = self._exchange(line)
            except (OSError, GatewayConnectionError):
                self._disconnect()
                try:
                    reply = self._exchange(line)
                except OSError as exc:
                    self._disconnect()
                    raise GatewayConnectionError(f"gateway at {self.address}: {exc}") from exc
        return _parse_reply(reply, ident)

    def get_mining_info(self) -> MiningJob:
        return MiningJob.from_dict(self.call("getMiningInfo", {}), "result")

    def submit_plain_proof(self, plain_proof: bytes | str, job: MiningJob) -> str:
        """Submit a plain proof (bincode bytes or their base64) for ``job``; returns "submitted"."""
        encoded = plain_proof if isinstance(plain_proof, str) else base64.b64encode(plain_proof).decode()
        params = {"plain_proof": encoded, "mining_job": job.to_dict()}
        validate_submit_params(params)
        result = self.call("submitPlainProof", params)
        if result != "submitted":
            raise SchemaError(f"submitPlainProof result must be 'submitted', got {result!r}")
        return result


def _parse_reply(reply: bytes, ident: int) -> Any:
    try:
        body = json.loads(reply)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SchemaError(f"gateway reply is not JSON: {exc}") from exc
    _require(isinstance(body, dict), "reply", "must be an object")
    _require(body.get("jsonrpc") == "2.0", "reply.jsonrpc", "must be '2.0'")
    if body.get("error") is not None:
        error = body["error"]
        _check_object(error, "reply.error", {"code", "message"}, {"code", "message", "data"})
        _require(_is_int(error["code"]), "reply.error.code", "must be an integer")
        cls = MiningPaused if error["code"] == MINING_PAUSED else GatewayError
        raise cls(error["code"], str(error["message"]), error.get("data"))
    _require(body.get("id") == ident, "reply.id", f"must echo the request id {ident}, got {body.get('id')!r}")
    _require("result" in body, "reply", "must contain 'result' or 'error'")
    return body["result"]
