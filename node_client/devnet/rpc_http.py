"""A pearld-compatible HTTP JSON-RPC server (node-consensus.md §5.1), dispatching to plain callables.

Same transport as pearld: POST ``/``, HTTP Basic auth compared as SHA-256 of ``user:pass`` (401 with
``WWW-Authenticate: Basic realm="pearld RPC"``), optional TLS, JSON-RPC 1.0 and 2.0 with batches,
no reply to a request whose id is null or missing, ``Connection: close`` and a trailing newline.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import http.server
import json
import logging
import ssl
import threading
from typing import Any, Callable

log = logging.getLogger(__name__)

# btcjson error codes pearld uses.
ERR_PARSE = -32700
ERR_INVALID_REQUEST = -32600
ERR_METHOD_NOT_FOUND = -32601
ERR_INVALID_PARAMS = -32602
ERR_INTERNAL = -32603
ERR_MISC = -1
ERR_TYPE = -3
ERR_INVALID_PARAMETER = -8
ERR_BLOCK_NOT_FOUND = -5
ERR_DESERIALIZATION = -22

MAX_BODY = 16 * 2**20
REALM = 'Basic realm="pearld RPC"'
# btcd's rpcLimited (HTTP methods) as far as the devnet serves them: no getblocktemplate, so a miner
# configured with the limited credentials fails here as it would against pearld.
LIMITED_METHODS = frozenset({"getbestblockhash", "getblock", "getblockcount", "getblockhash", "getblockheader",
                             "submitblock"})


class RpcFault(Exception):
    """Raised by a method to answer with a JSON-RPC error object."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


Method = Callable[[list[Any]], Any]


def _credential_digest(user: str, password: str) -> bytes:
    return hashlib.sha256(f"{user}:{password}".encode()).digest()


class PearldRpcServer(http.server.ThreadingHTTPServer):
    """Serves ``methods`` (name → callable taking the params list) on (host, port)."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # Go's listener uses the kernel's SOMAXCONN; 5 would reset bursts

    def __init__(
        self,
        address: tuple[str, int],
        methods: dict[str, Method],
        *,
        user: str,
        password: str,
        limit_user: str | None = None,
        limit_password: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
    ) -> None:
        if not user or not password:
            raise ValueError("pearld's RPC server only starts with credentials: set a user and a password")
        self.methods = methods
        self._digest = _credential_digest(user, password)
        self._limited_digest = _credential_digest(limit_user, limit_password or "") if limit_user else None
        super().__init__(address, _Handler)
        self.tls = tls_cert is not None
        if tls_cert is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(tls_cert, tls_key)
            # The handshake runs in the request's thread, so a silent client cannot stall accept().
            self.socket = context.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)

    def role(self, header: str | None) -> str | None:
        """Who the Authorization header names: "admin", "limited", or None when refused."""
        if not header or not header.startswith("Basic "):
            return None
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return None
        digest = _credential_digest(user, password)
        if hmac.compare_digest(digest, self._digest):
            return "admin"
        if self._limited_digest is not None and hmac.compare_digest(digest, self._limited_digest):
            return "limited"
        return None

    def handle_one(self, request: Any, role: str = "admin") -> dict[str, Any] | None:
        """One JSON-RPC request object → its reply (None when it gets no reply)."""
        if not isinstance(request, dict):
            return _reply(None, None, RpcFault(ERR_INVALID_REQUEST, "Invalid request: must be an object"), "1.0")
        version = "2.0" if request.get("jsonrpc") == "2.0" else "1.0"
        ident = request.get("id")
        method = request.get("method")
        params = request.get("params", [])
        if params is None:
            params = []
        if not isinstance(method, str):
            return _reply(ident, None, RpcFault(ERR_INVALID_REQUEST, "Invalid request: method must be a string"), version)
        if not isinstance(params, list):
            return _reply(ident, None, RpcFault(ERR_INVALID_REQUEST, "Invalid request: params must be an array"), version)
        if ident is None:
            return None
        handler = self.methods.get(method)
        if handler is None:
            return _reply(ident, None, RpcFault(ERR_METHOD_NOT_FOUND, "Method not found"), version)
        if role != "admin" and method not in LIMITED_METHODS:
            fault = RpcFault(ERR_INVALID_PARAMS, "limited user not authorized for this method")
            return _reply(ident, None, fault, version)
        try:
            return _reply(ident, handler(params), None, version)
        except RpcFault as fault:
            return _reply(ident, None, fault, version)
        except Exception as exc:  # a bug must not take the server down; report it as pearld would
            log.exception("devnet RPC %s failed", method)
            return _reply(ident, None, RpcFault(ERR_INTERNAL, f"internal error: {exc}"), version)


def _reply(ident: Any, result: Any, fault: RpcFault | None, version: str) -> dict[str, Any]:
    error = None if fault is None else {"code": fault.code, "message": fault.message}
    if version == "2.0":
        body: dict[str, Any] = {"jsonrpc": "2.0"}
        body.update({"error": error} if fault is not None else {"result": result})
        body["id"] = ident
        return body
    return {"result": result, "error": error, "id": ident}


class _Handler(http.server.BaseHTTPRequestHandler):
    server: PearldRpcServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("pearld rpc: " + format, *args)

    def _send(self, status: int, body: bytes, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def do_POST(self) -> None:
        role = self.server.role(self.headers.get("Authorization"))
        if role is None:
            self._send(401, b"401 Unauthorized.\n", {"WWW-Authenticate": REALM})
            return
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self._send(411, b"411 Length Required\n")
            return
        if not 0 <= length <= MAX_BODY:
            self._send(413, b"413 Request Entity Too Large\n")
            return
        raw = self.rfile.read(length)
        try:
            request = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            fault = RpcFault(ERR_PARSE, f"Failed to parse request: {exc}")
            self._send(200, json.dumps(_reply(None, None, fault, "1.0")).encode() + b"\n")
            return
        if isinstance(request, list):
            if not request:
                fault = RpcFault(ERR_INVALID_REQUEST, "Invalid request: empty batch")
                self._send(200, json.dumps(_reply(None, None, fault, "2.0")).encode() + b"\n")
                return
            replies = [r for r in (self.server.handle_one(item, role) for item in request) if r is not None]
            self._send(200, json.dumps(replies).encode() + b"\n" if replies else b"")
            return
        reply = self.server.handle_one(request, role)
        self._send(200, json.dumps(reply).encode() + b"\n" if reply is not None else b"")

    def do_GET(self) -> None:
        self._send(405, b"405 Method Not Allowed\n", {"Allow": "POST"})


def serve_in_thread(server: http.server.HTTPServer, name: str) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name=name, daemon=True)
    thread.start()
    return thread
