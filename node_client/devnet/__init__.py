"""A local stand-in for pearld and pearl-gateway on loopback, speaking their wire formats.

``start_devnet(...)`` runs one in-process (threads) for tests and the worker; ``add_arguments`` and
``cli_main`` back ``pearl-moe devnet`` and ``python -m node_client.devnet``. See docs/node-client.md.
"""
from node_client.devnet.cli import add_arguments, cli_main
from node_client.devnet.server import Devnet, start_devnet

__all__ = ["Devnet", "add_arguments", "cli_main", "start_devnet"]
