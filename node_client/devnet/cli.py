"""``pearl-moe devnet``: run a local pearld + pearl-gateway stand-in until interrupted."""
from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from node_client import forks
from node_client.devnet.cpu_miner import mine_one
from node_client.devnet.server import DEFAULT_RPC_PASSWORD, DEFAULT_RPC_USER, Devnet
from node_client.gateway import DEFAULT_TCP_PORT


def _hex_int(text: str) -> int:
    return int(text, 16)


def port_number(text: str) -> int:
    """argparse type of a TCP port: 0 (any free one) to 65535, refused here rather than by bind()."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is outside 0-65535")
    return port


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The devnet's options (shared by ``pearl-moe devnet`` and ``python -m node_client.devnet``)."""
    parser.add_argument("--network", default="regtest",
                        help="network rules: mainnet, testnet, testnet2, regtest, simnet, signet, regtest-fp8, "
                             "simnet-fp8, NETWORK@HEIGHT (that network's forks from HEIGHT), or a .json profile")
    parser.add_argument("--datadir", type=Path, default=None,
                        help="where the chain is kept (default ~/.pearl-moe/devnet/<network>)")
    parser.add_argument("--bits", type=_hex_int, default=None,
                        help="compact target of every block, hex (default: the network's pow limit; regtest 1e010000)")
    parser.add_argument("--host", default="127.0.0.1", help="address both servers bind (default 127.0.0.1)")
    parser.add_argument("--rpc-port", type=port_number, default=None, help="pearld RPC port (default: the network's)")
    parser.add_argument("--rpc-user", default=DEFAULT_RPC_USER)
    parser.add_argument("--rpc-password", default=DEFAULT_RPC_PASSWORD)
    parser.add_argument("--rpc-limit-user", default=None, help="limited RPC user (may submitblock, not getblocktemplate)")
    parser.add_argument("--rpc-limit-password", default=None)
    parser.add_argument("--tls-cert", default=None, help="serve pearld RPC over TLS with this certificate (PEM)")
    parser.add_argument("--tls-key", default=None, help="the TLS certificate's key (PEM)")
    parser.add_argument("--gateway-port", type=port_number, default=DEFAULT_TCP_PORT,
                        help=f"gateway miner RPC TCP port (default {DEFAULT_TCP_PORT}, the gateway's)")
    parser.add_argument("--gateway-socket", default=None, help="serve the gateway on this Unix socket instead of TCP")
    parser.add_argument("--payout-script", type=bytes.fromhex, default=None,
                        help="coinbase output script, hex (P2TR/P2MR/OP_RETURN; default: a fixed devnet key)")
    parser.add_argument("--mine", type=int, default=0, metavar="N",
                        help="mine N blocks with the CPU reference miner through the gateway, then keep serving")
    parser.add_argument("--exit-after-mining", action="store_true", help="stop once the --mine blocks are in")


def cli_main(args: argparse.Namespace) -> int:
    """Run the devnet described by ``args``; returns the process exit status."""
    try:
        params = forks.get_params(args.network)
    except forks.ProfileError as exc:
        print(f"devnet: {exc}", file=sys.stderr)
        return 2
    datadir = args.datadir or Path.home() / ".pearl-moe" / "devnet" / params.name.replace("/", "_")
    extra = {"payout_script": args.payout_script} if args.payout_script is not None else {}
    try:
        devnet = Devnet(
            params, datadir=datadir, bits=args.bits, host=args.host,
            rpc_port=params.rpc_port if args.rpc_port is None else args.rpc_port,
            rpc_user=args.rpc_user, rpc_password=args.rpc_password, rpc_limit_user=args.rpc_limit_user,
            rpc_limit_password=args.rpc_limit_password, tls_cert=args.tls_cert, tls_key=args.tls_key,
            gateway_port=args.gateway_port, gateway_socket=args.gateway_socket, **extra,
        )
    except (OSError, ValueError) as exc:
        print(f"devnet: cannot start: {exc}", file=sys.stderr)
        return 1
    stop = threading.Event()
    previous_handler = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        print(f"devnet {params.name}: height {devnet.chain.height}, data in {datadir}", flush=True)
        print(f"  pearld RPC  {devnet.pearld_url} (user {args.rpc_user})", flush=True)
        print(f"  gateway RPC {devnet.gateway_address}", flush=True)
        with devnet.gateway_client(timeout=120) as client:
            for i in range(args.mine):
                job = mine_one(client, seed=i)
                devnet.gateway.wait_idle()
                outcome = devnet.gateway.results()[-1]
                detail = f" ({outcome.detail})" if outcome.detail else ""
                print(f"  mined a v{job.cert_version} proof: {outcome.status}{detail}, height {devnet.chain.height}",
                      flush=True)
        if args.exit_after_mining:
            return 0
        seen = devnet.chain.height
        while not stop.wait(1.0):
            if devnet.chain.height != seen:
                seen = devnet.chain.height
                print(f"  height {seen}", flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        devnet.close()
        signal.signal(signal.SIGTERM, previous_handler)
    return 0
