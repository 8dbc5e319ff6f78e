"""`pearl-moe` command line: the worker (`run`), its gRPC clients (`status`, `events`, `control`)
and the local devnet (`devnet`)."""
from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from miner.accounting import COUNTERS
from miner.modes import AUTO, CHOICES
from miner.progress import slowdown_text
from miner.service import ADDRESS_FILE, DEFAULT_CONTROL

MAX_SLOWDOWN_HELP = ("mine only as much as keeps serving at most this fraction slower (0.1 = 10 %%), "
                     "measured per launch size (miner.governor; default: no cap, every eligible launch mines)")


def slowdown_fraction(text: str) -> float:
    """argparse type of --max-slowdown: a fraction above 0 (0 would be --mode off), checked by the
    governor's own rule (imported here: it needs torch, which status/events do not)."""
    from miner.governor import GovernorError, check_cap
    try:
        value = float(text)
        check_cap(value)
    except GovernorError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    return value


def metrics_port(text: str) -> int:
    """argparse type of --metrics-port: -1 (off) or a TCP port."""
    from node_client.devnet.cli import port_number

    return -1 if text.strip() == "-1" else port_number(text)


def _add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="serve a MoE model and mine inside its expert GEMMs",
                       description="With no --gateway, an embedded local devnet is started and the "
                                   "run stops after --max-blocks accepted blocks (default 1).")
    m = p.add_argument_group("model and serving")
    m.add_argument("--model", default="qwen3_moe",
                   help="preset (qwen3_moe, mixtral, deepseek_v3) or a config.json path")
    m.add_argument("--weights", type=Path, help="local weights (.safetensors or torch file); random if absent")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--device", help="torch device of the model (default: cuda when available, else cpu); "
                                    "CUDA mines with the GPU backends (miner.gpu), the CPU with the reference ones")
    m.add_argument("--no-lagged-decode", dest="lagged_decode", action="store_false",
                   help="GPU backends: mine every decode launch's own rows (default: decode launches mine the "
                        "previous launch's rows beside the GEMM, faster; docs/miner-gpu.md)")
    m.add_argument("--prompts", type=Path, help="file of prompts, one per line (default: generated)")
    m.add_argument("--batch-size", type=int, default=4)
    m.add_argument("--prompt-len", type=int, default=64)
    m.add_argument("--max-new-tokens", type=int, default=16)
    n = p.add_argument_group("chain")
    n.add_argument("--gateway", help="pearl-gateway address (tcp://HOST:PORT or unix:///PATH)")
    n.add_argument("--pearld", help="pearld RPC URL for heights and block status, e.g. http://127.0.0.1:18334")
    n.add_argument("--pearld-user", default="user")
    n.add_argument("--pearld-password", default="pass")
    n.add_argument("--pearld-cafile", help="CA (e.g. pearld's rpc.cert) for an https:// pearld URL")
    n.add_argument("--network", default=None,
                   help="network whose fork rules apply (required with --gateway; default: the devnet's profile)")
    n.add_argument("--devnet-profile", default="regtest", help="network profile of the embedded devnet")
    w = p.add_argument_group("worker")
    w.add_argument("--mode", default=AUTO, choices=CHOICES,
                   help="auto (the job's certificate and the network's forks decide), off, or a preferred mode")
    w.add_argument("--min-mining-tokens", type=int, default=16, help="smaller launches serve unmined")
    w.add_argument("--max-slowdown", type=slowdown_fraction, help=MAX_SLOWDOWN_HELP)
    w.add_argument("--data-dir", type=Path, help="unsent proofs and the submitted log (default: a temp dir "
                                                 "for the embedded devnet, ./pearl-moe-data otherwise)")
    w.add_argument("--control", default=DEFAULT_CONTROL, help="gRPC control address (port 0 = any)")
    w.add_argument("--metrics-port", type=metrics_port, default=0, help="Prometheus port on 127.0.0.1 (0 = any, -1 = off)")
    w.add_argument("--duration", type=float, help="stop after this many seconds")
    w.add_argument("--max-blocks", type=int, help="stop after this many accepted blocks "
                                                  "(default 1 with the embedded devnet)")
    w.add_argument("--progress-interval", type=float, default=5.0)
    w.add_argument("--log-level", default="WARNING")
    p.set_defaults(func=cmd_run)


def _add_clients(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("status", help="live figures of a running worker (over gRPC)")
    s.add_argument("--address",
                   help=f"control address (default: the data dir's {ADDRESS_FILE}, else {DEFAULT_CONTROL})")
    s.add_argument("--data-dir", type=Path, default=Path("pearl-moe-data"))
    s.add_argument("--json", action="store_true", help="print the status as JSON")
    s.set_defaults(func=cmd_status)
    e = sub.add_parser("events", help="stream a running worker's events (over gRPC)")
    e.add_argument("--address")
    e.add_argument("--data-dir", type=Path, default=Path("pearl-moe-data"))
    e.add_argument("--no-replay", action="store_true", help="only events from now on")
    e.add_argument("--count", type=int, help="stop after this many events")
    e.set_defaults(func=cmd_events)
    c = sub.add_parser("control", help="pause, resume, or set the mining mode or slowdown cap of a running worker")
    c.add_argument("action", choices=("pause", "resume", "mode", "slowdown"))
    c.add_argument("value", nargs="?", default="", help="the mode for 'mode', a reason for 'pause', the cap "
                                                        "for 'slowdown' (a fraction such as 0.1, or 'none')")
    c.add_argument("--address")
    c.add_argument("--data-dir", type=Path, default=Path("pearl-moe-data"))
    c.set_defaults(func=cmd_control)


def _add_devnet(sub: argparse._SubParsersAction) -> None:
    from node_client import devnet

    d = sub.add_parser("devnet", help="run the local devnet (a stand-in pearld and pearl-gateway)")
    devnet.add_arguments(d)
    d.set_defaults(func=lambda args: devnet.cli_main(args))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pearl-moe", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run(sub)
    _add_clients(sub)
    _add_devnet(sub)
    return parser


def _control_address(args: argparse.Namespace) -> str:
    if args.address:
        return args.address
    path = args.data_dir / ADDRESS_FILE
    return path.read_text().strip() if path.is_file() else DEFAULT_CONTROL


def cmd_status(args: argparse.Namespace) -> int:
    import grpc
    from google.protobuf.json_format import MessageToDict

    from miner.progress import status_line
    from miner.service import ControlClient

    client = ControlClient(_control_address(args))
    try:
        status = MessageToDict(client.status(), preserving_proto_field_name=True,
                               always_print_fields_with_no_presence=True)
    except grpc.RpcError as exc:
        print(f"pearl-moe status: no worker answers at {_control_address(args)}: {exc.details()}", file=sys.stderr)
        return 2
    finally:
        client.close()
    if args.json:
        print(json.dumps(status, indent=2, sort_keys=True))
        return 0
    _print_status(status, status_line)
    return 0


def _print_status(status: dict[str, Any], status_line: Any) -> None:
    mining, serving = status["mining"], status["serving"]
    for key in (*COUNTERS, "pending_winners"):
        mining[key] = int(mining.get(key, 0))
    for key in ("requests", "prefill_tokens", "decode_tokens"):
        serving[key] = int(serving.get(key, 0))
    status["height"] = int(status.get("height", -1))
    print(status_line(status))
    print(f"  network {status['network']}  cert V{status['cert_version']}  mode {status['mode']} "
          f"(preference {status['mode_preference']}: {status['mode_reason']})  backend {status['backend'] or '-'}")
    print(f"  source {'connected' if status['source_connected'] else 'DOWN: ' + status['source_error']}")
    print(f"  serving: {serving['requests']} requests, prefill {serving['prefill_tokens_per_s']:.0f} tok/s, "
          f"decode {serving['decode_tokens_per_s']:.0f} tok/s")
    print(f"  mining: hashrate {mining['hashrate']:.3g} work/s, launches mined {mining['launches_mined']} "
          f"unmined {mining['launches_unmined']} (held by the slowdown budget {mining['launches_held']}), "
          f"proofs {mining['proofs_built']}, "
          f"verify failed {mining['verify_failed']}, refused by rules {mining['refused_by_rules']}, "
          f"persisted {mining['persisted']}, pending {mining['pending_winners']}, "
          f"OOM {mining['oom_events']}, errors {mining['mining_errors']}")
    print(f"  slowdown: {slowdown_text(mining)}")
    for reason, count in sorted(mining.get("rejected_reasons", {}).items()):
        print(f"  rejected {int(count)}x: {reason}")


def cmd_events(args: argparse.Namespace) -> int:
    import time

    import grpc

    from miner.service import ControlClient

    client = ControlClient(_control_address(args))
    seen = 0
    try:
        for event in client.events(replay=not args.no_replay):
            stamp = time.strftime("%H:%M:%S", time.localtime(event.time))
            print(f"{stamp} #{event.seq} {event.kind}: {event.message}", flush=True)
            seen += 1
            if args.count is not None and seen >= args.count:
                break
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.CANCELLED:
            print(f"pearl-moe events: {exc.details()}", file=sys.stderr)
            return 2
    except KeyboardInterrupt:
        pass
    finally:
        client.close()
    return 0


def _is_zero(text: str) -> bool:
    try:
        return float(text) == 0
    except ValueError:
        return False


def cmd_control(args: argparse.Namespace) -> int:
    import grpc

    from miner.service import ControlClient

    cap = 0.0  # the wire's "no cap"
    if args.action == "slowdown" and args.value.strip().lower() != "none":
        try:
            cap = 0.0 if _is_zero(args.value) else slowdown_fraction(args.value)
        except argparse.ArgumentTypeError as exc:
            print(f"pearl-moe control slowdown: {exc}", file=sys.stderr)
            return 2
    if args.action == "mode" and args.value not in CHOICES:  # the worker refuses it too; say so without a round trip
        print(f"pearl-moe control mode: {args.value!r} is not one of {', '.join(CHOICES)}", file=sys.stderr)
        return 2
    client = ControlClient(_control_address(args))
    try:
        if args.action == "pause":
            status = client.pause(args.value)
        elif args.action == "resume":
            status = client.resume()
        elif args.action == "slowdown":
            status = client.set_max_slowdown(cap)
        else:
            status = client.set_mode(args.value)
    except grpc.RpcError as exc:
        print(f"pearl-moe control: {exc.details()}", file=sys.stderr)
        return 2
    finally:
        client.close()
    slowdown = slowdown_text({"max_slowdown": status.mining.max_slowdown,
                              "measured_slowdown": status.mining.measured_slowdown})
    print(f"state {status.state}, mode {status.mode} ({status.mode_reason}), slowdown {slowdown}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from miner.runner import run_worker  # torch and the model load only for `run`

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with ExitStack() as stack:
        if args.data_dir is None:
            args.data_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="pearl-moe-"))) \
                if args.gateway is None else Path("pearl-moe-data")
        return run_worker(args, stack)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, OSError) as exc:  # bad input or an unusable file or port: a message, not a traceback
        print(f"pearl-moe {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
