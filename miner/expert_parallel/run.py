"""The expert-parallel worker under torchrun, on one host:

    torchrun --nproc-per-node N -m miner.expert_parallel.run [options]

Every rank serves its own request stream through the shared model (experts sharded over the
ranks) and mines its local experts; rank 0 polls the job source (an embedded devnet unless
--gateway is given) and submits every rank's winners. Rank 0 prints the run's summary as one
JSON line (and writes it to --summary).
"""
from __future__ import annotations

import argparse
import importlib
import json
import logging
import signal
import sys
from contextlib import ExitStack
from pathlib import Path
from types import FrameType
from typing import Any

from miner.cli import MAX_SLOWDOWN_HELP, slowdown_fraction
from miner.expert_parallel.distributed import EPContext, connect_from_env, disconnect, on_cuda
from miner.expert_parallel.runtime import ExpertParallelWorker
from miner.jobs import JobSource
from miner.model import load_config
from miner.modes import AUTO, CHOICES
from miner.progress import ProgressDisplay
from miner.service import ADDRESS_FILE, serve
from miner.sources import GatewaySource
from miner.worker import BackendFactory, WorkerConfig, cpu_backend


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m miner.expert_parallel.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen3_moe", help="preset (qwen3_moe, mixtral, deepseek_v3) or config.json")
    p.add_argument("--weights", type=Path, help="local weights; random (seeded) if absent")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompts", type=Path, help="prompt file (rank r serves every N-th line from line r)")
    p.add_argument("--batch-size", type=int, default=4, help="requests per batch, per rank")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--device", default="auto", help="auto, cpu (gloo) or cuda (NCCL, one GPU per rank)")
    p.add_argument("--gateway", help="pearl-gateway address; without it rank 0 runs an embedded devnet")
    p.add_argument("--pearld", help="pearld RPC URL for heights and block status")
    p.add_argument("--pearld-user", default="user")
    p.add_argument("--pearld-password", default="pass")
    p.add_argument("--network", help="network whose fork rules apply (default: regtest or the devnet's)")
    p.add_argument("--devnet-profile", default="regtest")
    p.add_argument("--mode", default=AUTO, choices=CHOICES, help="auto (the job and the forks decide), off, or a preferred mode")
    p.add_argument("--min-mining-tokens", type=int, default=16, help="smaller launches serve unmined")
    p.add_argument("--max-slowdown", type=slowdown_fraction, help=MAX_SLOWDOWN_HELP + " (per rank)")
    p.add_argument("--backend-factory", default="miner.worker:cpu_backend",
                   help="MODULE:NAME of the mining backend factory (mode, layer_id, config) -> backend")
    p.add_argument("--data-dir", type=Path, default=Path("pearl-moe-ep-data"))
    p.add_argument("--duration", type=float, help="stop after this many seconds")
    p.add_argument("--max-blocks", type=int, help="stop after this many accepted blocks")
    p.add_argument("--max-batches", type=int, help="stop after this many batches (every rank)")
    p.add_argument("--warmup-batches", type=int, default=0, help="batches left out of the tokens/s figures")
    p.add_argument("--summary", type=Path, help="rank 0 writes the summary JSON here")
    p.add_argument("--control", default="127.0.0.1:0",
                   help="rank 0's gRPC control address (port 0 = any; `pearl-moe status --data-dir` finds it)")
    p.add_argument("--log-level", default="WARNING")
    return p


def load_factory(spec: str) -> BackendFactory:
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"--backend-factory must be MODULE:NAME, got {spec!r}")
    try:
        factory = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"--backend-factory {spec}: {exc}") from exc
    if not callable(factory):
        raise ValueError(f"--backend-factory {spec} is not callable")
    return factory


def network_of(args: argparse.Namespace) -> str:
    """The network whose rules apply (every rank needs it to choose the mode)."""
    return args.network or (args.devnet_profile if args.gateway is None else "regtest")


def job_source(args: argparse.Namespace, stack: ExitStack) -> JobSource:
    """Rank 0's source: the given gateway, or an embedded devnet."""
    from node_client.pearld import PearldClient

    if args.gateway is not None:
        pearld = PearldClient(args.pearld, args.pearld_user, args.pearld_password, retries=0, timeout=5.0) \
            if args.pearld else None
        source = GatewaySource(args.gateway, pearld)
    else:
        from node_client.devnet import start_devnet

        devnet = stack.enter_context(start_devnet(args.devnet_profile, datadir=args.data_dir / "devnet"))
        source = GatewaySource(devnet.gateway_address, devnet.pearld_client(retries=0, timeout=5.0))
    stack.callback(source.close)
    return source


def run(args: argparse.Namespace, config: WorkerConfig, factory: BackendFactory,
        ctx: EPContext) -> dict[str, Any] | None:
    with ExitStack() as stack:
        source = job_source(args, stack) if ctx.rank == 0 else None
        worker = ExpertParallelWorker(config, ctx, source, factory, max_batches=args.max_batches,
                                      warmup_batches=args.warmup_batches)
        host = worker.host

        def on_signal(signum: int, frame: FrameType | None) -> None:
            if host is not None:  # rank 0 decides when every rank stops (at a step boundary)
                host.stop_requested.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        display = None
        if host is not None:  # rank 0: the control service and the events on stdout
            server, port = serve(worker, args.control)
            stack.callback(server.stop, 2)
            address = f"{args.control.rpartition(':')[0] or '127.0.0.1'}:{port}"
            (config.data_dir / ADDRESS_FILE).write_text(address + "\n")
            print(f"expert-parallel worker: {ctx.world_size} ranks, control {address}", flush=True)
            display = ProgressDisplay(host.events)
        worker.start()
        try:
            worker.serve(on_batch=display.flush_events if display is not None else lambda: None)
        except BaseException:
            worker.abort()  # torchrun ends the other ranks; a shutdown exchange could only hang
            raise
        summary = worker.shutdown()
        if display is not None:
            display.flush_events()
    return summary


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s rank %(process)d %(name)s: %(message)s")
    if args.gateway is None and args.max_blocks is None and args.duration is None and args.max_batches is None:
        args.max_blocks = 1
    try:  # everything a rank could refuse is checked before the ranks wait on each other
        factory = load_factory(args.backend_factory)
        config = WorkerConfig(
            model=load_config(args.model), network=network_of(args), data_dir=args.data_dir,
            weights=args.weights, seed=args.seed, prompts=args.prompts, batch_size=args.batch_size,
            prompt_len=args.prompt_len, max_new_tokens=args.max_new_tokens,
            min_mining_tokens=args.min_mining_tokens, max_slowdown=args.max_slowdown, mode=args.mode,
            duration_s=args.duration,
            max_blocks=args.max_blocks)
        config.check()
        if args.warmup_batches < 0 or (args.max_batches is not None and args.max_batches <= args.warmup_batches):
            raise ValueError(f"--max-batches must exceed --warmup-batches ({args.warmup_batches})")
        if factory is cpu_backend and args.mode != "off" and on_cuda(args.device):
            raise ValueError("the CPU reference backend cannot mine CUDA tensors: give --backend-factory "
                             "of a GPU backend, or --device cpu, or --mode off")
        ctx = connect_from_env(args.device)
    except ValueError as exc:
        print(f"miner.expert_parallel.run: {exc}", file=sys.stderr)
        return 2
    try:
        summary = run(args, config, factory, ctx)
    finally:
        disconnect()
    if summary is not None:
        text = json.dumps(summary, sort_keys=True)
        print(text, flush=True)
        if args.summary is not None:
            args.summary.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
