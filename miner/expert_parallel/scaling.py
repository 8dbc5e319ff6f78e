"""Tokens/s of the expert-parallel worker over 1, 2, 4 GPUs (or CPU processes), mining on.

    python -m miner.expert_parallel.scaling --procs 1 2 4 --device cuda \\
        --backend-factory MODULE:NAME --out docs/perf/expert-parallel-scaling

For each process count N it runs ``torchrun --standalone --nproc-per-node N -m
miner.expert_parallel.run`` (NCCL_NVLS_ENABLE=0, an embedded devnet as the job source, a fixed
number of batches after warm-up), reads the run's summary, and writes a table (speed-up and
efficiency against the smallest N) to OUT.md and the raw summaries to OUT.json. Each rank serves
``--batch-size`` requests per batch (weak scaling: the work grows with N) unless ``--global-batch``
fixes the total (strong scaling). ``--unmined-too`` adds a --mode off run per N for the cost of
mining. Anything after ``--`` goes to every run unchanged.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m miner.expert_parallel.scaling", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--procs", type=int, nargs="+", default=[1, 2, 4], help="process (GPU) counts")
    p.add_argument("--device", default="cuda", help="cuda (NCCL) or cpu (gloo)")
    p.add_argument("--model", default="qwen3_moe")
    p.add_argument("--batch-size", type=int, default=8, help="requests per batch per rank (weak scaling)")
    p.add_argument("--global-batch", type=int, help="requests per batch over all ranks (strong scaling)")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--batches", type=int, default=10, help="measured batches per run")
    p.add_argument("--warmup-batches", type=int, default=2)
    p.add_argument("--mode", default="auto", help="the mining mode of the measured runs")
    p.add_argument("--backend-factory", default="miner.worker:cpu_backend")
    p.add_argument("--unmined-too", action="store_true", help="also run each N with --mode off")
    p.add_argument("--out", type=Path, default=Path("docs/perf/expert-parallel-scaling"),
                   help="writes OUT.md and OUT.json")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    p.add_argument("extra", nargs="*", help="after --: more arguments for every run")
    return p


def batch_per_rank(args: argparse.Namespace, procs: int) -> int:
    if args.global_batch is None:
        return args.batch_size
    if args.global_batch % procs:
        raise ValueError(f"--global-batch {args.global_batch} does not split over {procs} ranks")
    return args.global_batch // procs


def run_command(args: argparse.Namespace, procs: int, mode: str, summary: Path, data_dir: Path) -> list[str]:
    """The torchrun command line of one measured run."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={procs}",
            "-m", "miner.expert_parallel.run", "--device", args.device, "--model", args.model,
            "--batch-size", str(batch_per_rank(args, procs)), "--prompt-len", str(args.prompt_len),
            "--max-new-tokens", str(args.max_new_tokens), "--mode", mode,
            "--backend-factory", args.backend_factory, "--warmup-batches", str(args.warmup_batches),
            "--max-batches", str(args.warmup_batches + args.batches), "--data-dir", str(data_dir),
            "--summary", str(summary), *args.extra]


def measure(args: argparse.Namespace, procs: int, mode: str, workdir: Path) -> dict[str, Any]:
    summary = workdir / f"summary-{procs}-{mode}.json"
    cmd = run_command(args, procs, mode, summary, workdir / f"data-{procs}-{mode}")
    print("+", " ".join(cmd), flush=True)
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0"}
    done = subprocess.run(cmd, env=env, timeout=args.timeout)
    if done.returncode != 0 or not summary.is_file():
        raise RuntimeError(f"the {procs}-process run ({mode}) failed with exit status {done.returncode}")
    return json.loads(summary.read_text())


def table(runs: list[dict[str, Any]]) -> str:
    """Markdown: one row per run, speed-up and efficiency against the smallest run of its mode."""
    lines = ["| processes | mode | tokens/s | decode tokens/s | speed-up | efficiency | credited work/s "
             "| tickets | winners | submitted | accepted |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    base: dict[str, dict[str, Any]] = {}
    for run in sorted(runs, key=lambda r: (r["mode"], r["world_size"])):
        first = base.setdefault(run["mode"], run)
        speedup = run["tokens_per_s"] / first["tokens_per_s"] if first["tokens_per_s"] else 0.0
        efficiency = speedup * first["world_size"] / run["world_size"]
        busy = max(r["prefill_ms"] + r["decode_ms"] for r in run["ranks"]) / 1000
        work_rate = run["credited_work"] / busy if busy else 0.0
        lines.append(f"| {run['world_size']} | {run['mode']} | {run['tokens_per_s']:.1f} | "
                     f"{run['decode_tokens_per_s']:.1f} | {speedup:.2f}x | {efficiency:.0%} | {work_rate:.3g} | "
                     f"{run['tickets']} | {run['winners']} | {run['submitted']} | {run['accepted']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    try:
        for procs in args.procs:
            batch_per_rank(args, procs)
    except ValueError as exc:
        print(f"scaling: {exc}", file=sys.stderr)
        return 2
    modes = [args.mode, "off"] if args.unmined_too and args.mode != "off" else [args.mode]
    runs = []
    with tempfile.TemporaryDirectory(prefix="ep-scaling-") as tmp:
        for procs in args.procs:
            for mode in modes:
                runs.append({**measure(args, procs, mode, Path(tmp)), "mode": mode})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python -m miner.expert_parallel.scaling", *argv])
    report = f"# Expert-parallel scaling ({args.device})\n\n`{command}`\n\n{table(runs)}\n"
    args.out.with_suffix(".md").write_text(report)
    args.out.with_suffix(".json").write_text(json.dumps(runs, indent=1, sort_keys=True) + "\n")
    print(report, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
