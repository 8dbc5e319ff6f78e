"""Start a devnet in-process: the chain, pearld's HTTP JSON-RPC and the gateway's miner RPC, in threads."""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

from node_client import forks
from node_client.devnet.chain import Chain
from node_client.devnet.gateway_service import DEFAULT_PAYOUT_SCRIPT, DevnetGateway
from node_client.devnet.node import DevnetNode
from node_client.devnet.rpc_gateway import GatewayRpcServer
from node_client.devnet.rpc_http import PearldRpcServer, serve_in_thread
from node_client.gateway import GatewayClient
from node_client.pearld import PearldClient

DEFAULT_RPC_USER = "devnet"
DEFAULT_RPC_PASSWORD = "devnet"


class Devnet:
    """A running devnet; ``pearld_url`` and ``gateway_address`` are what clients connect to."""

    def __init__(
        self,
        network: str | forks.NetworkParams = "regtest",
        *,
        datadir: str | Path | None = None,
        bits: int | None = None,
        host: str = "127.0.0.1",
        rpc_port: int = 0,
        rpc_user: str = DEFAULT_RPC_USER,
        rpc_password: str = DEFAULT_RPC_PASSWORD,
        rpc_limit_user: str | None = None,
        rpc_limit_password: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        gateway_port: int = 0,
        gateway_socket: str | None = None,
        payout_script: bytes = DEFAULT_PAYOUT_SCRIPT,
    ) -> None:
        self.params = forks.get_params(network)
        self.rpc_user, self.rpc_password = rpc_user, rpc_password
        self.tls_cert = tls_cert
        self.chain = Chain(self.params, bits=bits, datadir=datadir)
        self.node = DevnetNode(self.chain)
        self.gateway = DevnetGateway(self.node, payout_script=payout_script)
        try:
            self._http = PearldRpcServer(
                (host, rpc_port), self.node.methods(), user=rpc_user, password=rpc_password,
                limit_user=rpc_limit_user, limit_password=rpc_limit_password, tls_cert=tls_cert, tls_key=tls_key,
            )
            self._gateway_rpc = GatewayRpcServer(self.gateway, host=host, port=gateway_port, socket_path=gateway_socket)
        except Exception:
            self.gateway.close()
            self.chain.close()
            raise
        bound_host, bound_port = self._http.server_address[:2]
        scheme = "https" if tls_cert else "http"
        self.pearld_url = f"{scheme}://{bound_host}:{bound_port}"
        self.gateway_address = self._gateway_rpc.address
        serve_in_thread(self._http, "devnet-pearld")
        self._gateway_rpc.start()

    def pearld_client(self, **kwargs: object) -> PearldClient:
        """A client with this devnet's credentials (and its certificate as the CA when TLS is on)."""
        kwargs.setdefault("cafile", self.tls_cert)
        return PearldClient(self.pearld_url, self.rpc_user, self.rpc_password, **kwargs)  # type: ignore[arg-type]

    def gateway_client(self, timeout: float = 30.0) -> GatewayClient:
        return GatewayClient(self.gateway_address, timeout=timeout)

    def wait_for_height(self, height: int, timeout: float = 30.0) -> bool:
        with self.chain.tip_changed:
            return self.chain.tip_changed.wait_for(lambda: self.chain.height >= height, timeout)

    def close(self) -> None:
        self._gateway_rpc.close()
        self._http.shutdown()
        self._http.server_close()
        self.gateway.close()
        self.chain.close()

    def __enter__(self) -> "Devnet":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def start_devnet(network: str | forks.NetworkParams = "regtest", **kwargs: object) -> Iterator[Devnet]:
    """Run a devnet for the duration of a ``with`` block (binds 127.0.0.1, ephemeral ports by default)."""
    devnet = Devnet(network, **kwargs)  # type: ignore[arg-type]
    try:
        yield devnet
    finally:
        devnet.close()
