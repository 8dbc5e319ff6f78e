"""A pearl-gateway-compatible miner RPC server: line-delimited JSON-RPC 2.0 over TCP or a Unix socket.

Behaviour copied from the gateway (server.py @ 2ad4bc25, schemas.py @ 4a356c31): −32700 for a line
that is not JSON, −32600 for an envelope that breaks the schema, −32601 for an unknown method,
−32602 for params that break the method's schema, −32001 while mining is paused, −32000 for any other
failure (including a line over 4 MiB, after which the connection keeps serving). submitPlainProof
answers "submitted" once the proof decodes; the rest happens asynchronously in the backend.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import socketserver
import threading
from typing import Any, Protocol

from node_client import gateway as gw

log = logging.getLogger(__name__)

OVERLONG_LINE_MESSAGE = "Separator is not found, and chunk exceed the limit"


class MiningPausedError(Exception):
    """The backend has no template to hand out: −32001, message ``mining_paused[: details]``
    (pearl_gateway/comm/dataclasses.py @ 4a356c31)."""


class GatewayBackend(Protocol):
    def mining_job(self) -> gw.MiningJob:
        """The current job; raises MiningPausedError when there is none."""

    def submit_plain_proof(self, plain_proof_b64: str, job: gw.MiningJob) -> None:
        """Decode the proof (raising ValueError when it does not) and queue it for processing."""


def _error(code: int, message: str, ident: Any, data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "error": error, "id": ident}


def process_line(backend: GatewayBackend, line: bytes) -> dict[str, Any]:
    """One request line → one reply object, never raising."""
    try:
        body = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return _error(gw.PARSE_ERROR, "Parse error", None, str(exc))
    try:
        gw.validate_envelope(body)
    except gw.SchemaError as exc:
        ident = body.get("id") if isinstance(body, dict) else None
        return _error(gw.INVALID_REQUEST, "Invalid Request", ident, str(exc))
    method, ident = body["method"], body["id"]
    params = body.get("params", {})
    try:
        if method == "getMiningInfo":
            try:
                gw.validate_get_mining_info_params(params)
            except gw.SchemaError as exc:
                return _error(gw.INVALID_PARAMS, "Invalid params", ident, str(exc))
            return {"jsonrpc": "2.0", "result": backend.mining_job().to_dict(), "id": ident}
        if method == "submitPlainProof":
            try:
                gw.validate_submit_params(params)
                job = gw.MiningJob.from_dict(params["mining_job"], "data.mining_job")
            except gw.SchemaError as exc:
                return _error(gw.INVALID_PARAMS, "Invalid params", ident, str(exc))
            backend.submit_plain_proof(params["plain_proof"], job)
            return {"jsonrpc": "2.0", "result": "submitted", "id": ident}
        return _error(gw.METHOD_NOT_FOUND, f"Method {method} not found", ident)
    except MiningPausedError as exc:
        return _error(gw.MINING_PAUSED, str(exc), ident)
    except Exception as exc:  # the gateway answers every other failure with −32000 and keeps serving
        log.debug("gateway request %s failed: %s", method, exc)
        return _error(gw.INTERNAL_ERROR, str(exc), ident)


class _Handler(socketserver.StreamRequestHandler):
    server: "_TcpServer | _UnixServer"

    def handle(self) -> None:
        with self.server.connections_lock:  # type: ignore[union-attr]
            self.server.connections.add(self.connection)  # type: ignore[union-attr]
        try:
            self._serve()
        finally:
            with self.server.connections_lock:  # type: ignore[union-attr]
                self.server.connections.discard(self.connection)  # type: ignore[union-attr]

    def _serve(self) -> None:
        while True:
            try:
                line = self.rfile.readline(gw.LINE_LIMIT + 1)
            except OSError:
                return
            if not line:
                return
            if len(line) > gw.LINE_LIMIT and not line.endswith(b"\n"):
                reply = _error(gw.INTERNAL_ERROR, OVERLONG_LINE_MESSAGE, None)
                if not self._discard_rest_of_line():
                    self._write(reply)
                    return
            else:
                reply = process_line(self.server.backend, line)
            if not self._write(reply):
                return

    def _discard_rest_of_line(self) -> bool:
        """Skip to the end of an overlong line; False when the client closed before it ended."""
        while True:
            chunk = self.rfile.readline(gw.LINE_LIMIT)
            if not chunk:
                return False
            if chunk.endswith(b"\n"):
                return True

    def _write(self, reply: dict[str, Any]) -> bool:
        try:
            self.wfile.write(gw.encode_line(reply))
            self.wfile.flush()
        except OSError:
            return False
        return True


class _TcpServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # asyncio.start_server's default backlog is 100
    backend: GatewayBackend


class _UnixServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    request_queue_size = 128
    backend: GatewayBackend


class GatewayRpcServer:
    """The miner RPC on TCP 127.0.0.1:``port`` (0 = ephemeral) or, with ``socket_path``, a Unix socket."""

    def __init__(self, backend: GatewayBackend, *, host: str = "127.0.0.1", port: int = 0,
                 socket_path: str | None = None) -> None:
        if socket_path is not None:
            if os.path.exists(socket_path):
                os.unlink(socket_path)
            self._server: socketserver.BaseServer = _UnixServer(socket_path, _Handler)
            os.chmod(socket_path, 0o600)
            self.address = f"unix://{socket_path}"
        else:
            self._server = _TcpServer((host, port), _Handler)
            bound_host, bound_port = self._server.server_address[:2]
            self.address = f"tcp://{bound_host}:{bound_port}"
        self._server.backend = backend  # type: ignore[attr-defined]
        self._server.connections = set()  # type: ignore[attr-defined]
        self._server.connections_lock = threading.Lock()  # type: ignore[attr-defined]
        self._socket_path = socket_path
        self._thread = threading.Thread(target=self._server.serve_forever, name="devnet-gateway", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop accepting, and end open connections so clients reconnect to whatever serves next."""
        self._server.shutdown()
        self._server.server_close()
        with self._server.connections_lock:  # type: ignore[attr-defined]
            for conn in list(self._server.connections):  # type: ignore[attr-defined]
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        if self._socket_path is not None and os.path.exists(self._socket_path):
            os.unlink(self._socket_path)
