"""``pearl-moe run``: build the worker from the command line, serve until done, shut down cleanly."""
from __future__ import annotations

import argparse
import signal
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from types import FrameType

import torch
from node_client.forks import get_params
from node_client.pearld import PearldClient

from miner.metrics import start_metrics
from miner.model import load_config
from miner.progress import ProgressDisplay, status_line
from miner.service import ADDRESS_FILE, DEFAULT_CONTROL, serve
from miner.sources import GatewaySource
from miner.worker import BackendFactory, Worker, WorkerConfig, cpu_backend


def backend_factory(device: str, lagged_decode: bool = True) -> BackendFactory:
    """CUDA mines with the GPU pipelines (miner.gpu); anything else with the CPU references.

    miner.gpu is imported only for CUDA: it pulls in the kernel toolchains, which a CPU install
    (requirements.txt) does not have.
    """
    if torch.device(device).type != "cuda":
        return cpu_backend
    from miner.gpu import worker_factory

    return worker_factory(device, lagged_decode=lagged_decode)


def _embedded_devnet(args: argparse.Namespace, stack: ExitStack) -> tuple[str, PearldClient]:
    """Start the local devnet in-process; returns (gateway address, pearld client)."""
    from node_client.devnet import start_devnet

    devnet = stack.enter_context(start_devnet(args.devnet_profile, datadir=Path(args.data_dir) / "devnet"))
    print(f"pearl-moe: embedded devnet ({args.devnet_profile}) at height {devnet.chain.height}: "
          f"pearld {devnet.pearld_url}, gateway {devnet.gateway_address}", flush=True)
    return devnet.gateway_address, devnet.pearld_client(retries=0, timeout=5.0)


def run_worker(args: argparse.Namespace, stack: ExitStack) -> int:
    model = load_config(args.model)
    if args.gateway is None:
        network = args.network or args.devnet_profile
        max_blocks = 1 if args.max_blocks is None else args.max_blocks
    elif args.network is None:
        raise ValueError("--network is required with --gateway: the fork rules decide what may be mined")
    else:
        network, max_blocks = args.network, args.max_blocks
    get_params(network)  # an unknown network is an error now, not at the first winner
    config = WorkerConfig(
        model=model, network=network, data_dir=Path(args.data_dir), weights=args.weights, seed=args.seed,
        device=args.device or ("cuda" if torch.cuda.is_available() else "cpu"),
        prompts=args.prompts, batch_size=args.batch_size, prompt_len=args.prompt_len,
        max_new_tokens=args.max_new_tokens, min_mining_tokens=args.min_mining_tokens,
        max_slowdown=args.max_slowdown, mode=args.mode,
        duration_s=args.duration, max_blocks=max_blocks,
    )
    config.check()  # before the devnet or any thread starts
    if args.gateway is None:
        gateway_address, pearld = _embedded_devnet(args, stack)
    else:
        gateway_address = args.gateway
        pearld = PearldClient(args.pearld, args.pearld_user, args.pearld_password, cafile=args.pearld_cafile,
                              retries=0, timeout=5.0) if args.pearld else None
    source = GatewaySource(gateway_address, pearld)
    stack.callback(source.close)
    worker = Worker(config, source, backend_factory(config.device, args.lagged_decode))
    try:
        server, port = serve(worker, args.control)
    except (OSError, RuntimeError) as exc:
        if args.control != DEFAULT_CONTROL:
            raise ValueError(f"cannot serve the control service on {args.control}: {exc}") from exc
        print(f"pearl-moe: {DEFAULT_CONTROL} is taken; control service on an ephemeral port", flush=True)
        server, port = serve(worker, "127.0.0.1:0")
    stack.callback(server.stop, 2)
    host = args.control.rpartition(":")[0] or "127.0.0.1"
    (config.data_dir / ADDRESS_FILE).write_text(f"{host}:{port}\n")
    print(f"pearl-moe: {model.style} model ({model.num_layers} layers, {model.num_experts} experts, "
          f"k={model.hidden_size}) on {config.device}, network {network}, control {host}:{port}", flush=True)
    if args.metrics_port >= 0:
        metrics_port = start_metrics(worker.status, args.metrics_port)
        print(f"pearl-moe: metrics on http://127.0.0.1:{metrics_port}/metrics", flush=True)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        worker.stop_requested.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    display = ProgressDisplay(worker.events, args.progress_interval)
    started = time.monotonic()
    worker.start()
    try:
        worker.serve(on_batch=lambda: display.tick(worker.status()))
    finally:
        worker.shutdown()
    display.flush_events()
    print(f"pearl-moe: done after {time.monotonic() - started:.0f} s: {status_line(worker.status())}", flush=True)
    return 0
