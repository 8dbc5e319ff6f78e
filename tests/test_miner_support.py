"""Shared pieces of the miner tests (no tests here): a small worker and a line-level gateway proxy.

The proxy sits between the worker and the devnet's gateway on 127.0.0.1 (ephemeral port, kept
across restarts) so a test can take the gateway down, bring it back, refuse submissions or answer
with malformed replies.
"""
from __future__ import annotations

import json
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from pathlib import Path

from miner.model import preset
from miner.worker import Worker, WorkerConfig

# The smallest model the INT7 protocol mines: k = 2048 (16 · rank 128), one layer.
TINY = dict(hidden_size=2048, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=64, vocab_size=512,
            num_experts=8, expert_intermediate=128, max_seq_len=128)


def tiny_config(data_dir: Path, network: str = "regtest", **overrides) -> WorkerConfig:
    values = dict(model=preset("qwen3_moe", **TINY), network=network, data_dir=data_dir, batch_size=2,
                  prompt_len=32, max_new_tokens=2, poll_interval=0.1, backoff_initial_s=0.05,
                  backoff_max_s=0.5)
    values.update(overrides)
    return WorkerConfig(**values)


class ServingThread:
    """Runs ``worker.serve()`` in a thread until ``stop()``."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.thread = threading.Thread(target=worker.serve, name="serving", daemon=True)

    def __enter__(self) -> "ServingThread":
        self.worker.start()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.worker.stop_requested.set()
        self.thread.join(timeout=60)
        self.worker.shutdown()


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


class GatewayProxy:
    """Forwards gateway JSON-RPC lines to ``upstream``; ``behaviour(method, line)`` may instead
    return bytes to answer with (malformed replies), or ``None`` to close the connection."""

    FORWARD = b"forward"

    def __init__(self, upstream: str) -> None:
        host, _, port = upstream.removeprefix("tcp://").rpartition(":")
        self.upstream = (host, int(port))
        self.behaviour: Callable[[str, bytes], bytes | None] = lambda method, line: self.FORWARD
        self.requests: list[str] = []
        self.port = 0
        self._server: socketserver.ThreadingTCPServer | None = None
        self._connections: set[socket.socket] = set()

    @property
    def address(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def start(self) -> None:
        proxy = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                proxy._connections.add(self.connection)
                upstream = socket.create_connection(proxy.upstream, timeout=30)
                up_reader = upstream.makefile("rb")
                try:
                    for line in self.rfile:
                        try:
                            method = json.loads(line).get("method", "")
                        except ValueError:
                            method = ""
                        proxy.requests.append(method)
                        answer = proxy.behaviour(method, line)
                        if answer is None:
                            return
                        if answer == proxy.FORWARD:
                            upstream.sendall(line)
                            answer = up_reader.readline()
                        self.wfile.write(answer)
                        self.wfile.flush()
                except OSError:
                    pass  # cut by stop()
                finally:
                    proxy._connections.discard(self.connection)
                    up_reader.close()
                    upstream.close()

        class Server(socketserver.ThreadingTCPServer):
            allow_reuse_address = True
            daemon_threads = True

        self._server = Server(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        """Take the gateway down: stop listening and cut open connections."""
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()
        self._server = None
        for conn in list(self._connections):
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
