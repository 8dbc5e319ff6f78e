"""The H200 acceptance run (issue 9): mine on the embedded devnet with the GPU pipelines, and
measure tokens/s of the same model unmined vs mined in the same process.

    python -m miner.gpu.h200_check --out DIR            # on a CUDA machine, < 6 minutes on an H200
    python -m miner.gpu.h200_check --out DIR --cpu-smoke  # tiny sizes on the CPU (Triton interpreter)

Phases, one devnet each, in sequence (the FP8 fork never deactivates, so no single profile goes
from V4 to V3; docs/miner-gpu.md):

- ``regtest-fp8``: cert V4 → ``fp8-moe``;
- ``mainnet@91628``: mainnet's forks from height 91,628: cert V2 with MoE allowed (``int7-moe``)
  for two blocks, then the dense-only height 91,630 is crossed mid-run and the worker switches to
  the dense fallback (``int7-dense``);
- ``mainnet@100000``: mainnet as it is now: cert V3, salted seeds, rank penalty, dense only.

Each phase: a worker (``miner.worker.Worker``) with the GPU backends (``miner.gpu.worker_factory``),
the model moved to the device, and two devnets of the profile:

1. mining: the devnet's difficulty is its pow limit (planted: tiles win often), so blocks are found,
   submitted and accepted within seconds; the worker serves batches until ``--blocks`` blocks are
   accepted (or its time share is spent);
2. tokens/s: the worker's source is switched to a second devnet whose target (2^200) no tile
   meets, so mining runs in its steady state (every launch mined, no block every second forcing
   a new job, a B-side preparation and a proof); batches alternate mining paused / mining on,
   warm-up first, median of ``--reps``.

Every section is guarded: a failure is written into the results and the run goes on.
Results: DIR/h200_check.json and DIR/h200_check.md, rewritten after every section; the worker's
log (mining failures, completion tracebacks) in DIR/h200_check.log.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import platform
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from miner.generation import Generator, generated_prompts
from miner.gpu.factory import worker_factory
from miner.jobs import MiningJob
from miner.model import ModelConfig, preset
from miner.sources import GatewaySource
from miner.worker import Worker, WorkerConfig
from proof.chain import bits_from_target

log = logging.getLogger(__name__)

PHASES = ("regtest-fp8", "mainnet@91628", "mainnet@100000")
SMOKE_PHASES = ("regtest-fp8", "mainnet@100000")
QUIET_BITS = bits_from_target(1 << 200)  # no FP8 or INT7 tile of these shapes meets it


@dataclass(frozen=True)
class Sizes:
    """Model and serving shape of a run, and how long to measure."""

    model: ModelConfig
    batch_size: int
    prompt_len: int
    max_new_tokens: int
    min_mining_tokens: int
    warmup: int
    reps: int
    blocks: int
    budget_s: float


# Hidden 2048 (the mined GEMM's k; INT7 rank 128 needs k >= 2048), 32 experts, top-8, FC1 of
# 1024 columns per expert (a multiple of the FP8 lottery's 64 and INT7's 16), 4 layers.
H200 = Sizes(preset("qwen3_moe", hidden_size=2048, num_layers=4, num_heads=16, num_kv_heads=4, head_dim=128,
                    num_experts=32, top_k=8, expert_intermediate=512, vocab_size=4096, max_seq_len=512),
             batch_size=8, prompt_len=256, max_new_tokens=16, min_mining_tokens=8, warmup=2, reps=5,
             blocks=3, budget_s=300.0)
# The smallest shapes both pipelines take; decode launches (2 tokens) serve unmined.
SMOKE = Sizes(preset("qwen3_moe", hidden_size=2048, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=64,
                     num_experts=4, top_k=2, expert_intermediate=32, vocab_size=256, max_seq_len=64),
              batch_size=2, prompt_len=4, max_new_tokens=1, min_mining_tokens=8, warmup=0, reps=1,
              blocks=1, budget_s=1500.0)


class Results:
    """The run's results, written as JSON and a markdown table after every section."""

    def __init__(self, out: Path, meta: dict[str, Any]) -> None:
        self.out = out
        self.data: dict[str, Any] = {"meta": meta, "phases": [], "errors": []}
        out.mkdir(parents=True, exist_ok=True)

    def guard(self, where: str, target: dict[str, Any], action: Callable[[], None]) -> bool:
        """Run one section; on failure record the traceback under ``target['errors']``."""
        try:
            action()
            return True
        except Exception as exc:  # partial results are the point: record and go on
            target.setdefault("errors", []).append(f"{where}: {type(exc).__name__}: {exc}")
            target.setdefault("tracebacks", []).append(traceback.format_exc())
            return False
        finally:
            self.write()

    def write(self) -> None:
        (self.out / "h200_check.json").write_text(json.dumps(self.data, indent=2, default=str) + "\n")
        (self.out / "h200_check.md").write_text(markdown(self.data))


def markdown(data: dict[str, Any]) -> str:
    """The results as the tables docs/perf/miner-h200.md quotes."""
    meta = data["meta"]
    m = meta.get("model") or {}
    model = (f"{m.get('style')}: hidden {m.get('hidden_size')}, {m.get('num_layers')} layers, "
             f"{m.get('num_experts')} experts top-{m.get('top_k')}, FC1 {2 * (m.get('expert_intermediate') or 0)} "
             f"columns per expert, {meta.get('dtype')}") if m else "?"
    lines = [f"# Miner acceptance run ({meta.get('device', '?')})", "",
             f"torch {meta.get('torch')}, triton {meta.get('triton')}; model {model}; "
             f"batch {meta.get('batch_size')} × prompt {meta.get('prompt_len')} + {meta.get('max_new_tokens')} "
             f"decode steps; median of {meta.get('reps')} after {meta.get('warmup')} warm-up.", "",
             "| profile | modes seen | accepted | submitted | rejected | winners | verify failed | "
             "mining errors | first block s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for p in data["phases"]:
        m = p.get("mining_stats") or p.get("mining", {})
        lines.append(f"| {p['profile']} | {' → '.join(p.get('modes', [])) or '-'} | {m.get('accepted', '-')} | "
                     f"{m.get('submitted', '-')} | {m.get('rejected', '-')} | {m.get('winners', '-')} | "
                     f"{m.get('verify_failed', '-')} | {m.get('mining_errors', '-')} | "
                     f"{_fmt(p.get('first_block_s'))} |")
    lines += ["", "| profile | mode | phase | unmined tok/s | mined tok/s | mined / unmined |",
              "|---|---|---|---|---|---|"]
    for p in data["phases"]:
        bench = p.get("bench", {})
        for phase in ("prefill", "decode", "overall"):
            row = bench.get(phase)
            if row:
                lines.append(f"| {p['profile']} | {bench.get('mode', '-')} | {phase} | {_fmt(row['unmined'])} | "
                             f"{_fmt(row['mined'])} | {_fmt(row['ratio'], 3)} |")
    lines += ["", "Layer launches as the slowdown budget times them (CUDA events; running means, all batches):", "",
              "| profile | tokens | unmined ms | mined ms | mined / unmined |", "|---|---|---|---|---|"]
    for p in data["phases"]:
        for row in p.get("bench", {}).get("launch_times", []):
            ratio = row["mined_ms"] / row["unmined_ms"] if row["mined_ms"] and row["unmined_ms"] else None
            lines.append(f"| {p['profile']} | {_fmt(row['tokens'], 0)} | {_fmt(row['unmined_ms'], 3)} | "
                         f"{_fmt(row['mined_ms'], 3)} | {_fmt(ratio, 3)} |")
    errors = [f"- {p['profile']}: {e}" for p in data["phases"] for e in p.get("errors", [])]
    errors += [f"- {e}" for e in data.get("errors", [])]
    if errors:
        lines += ["", "Errors:", *errors]
    return "\n".join(lines) + "\n"


def _fmt(value: Any, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


class Prompts:
    """Random prompts made on the CPU (the serving thread's default device is the model's)."""

    def __init__(self, sizes: Sizes, seed: int) -> None:
        self.stream: Iterator[list[int]] = generated_prompts(sizes.prompt_len, sizes.model.vocab_size, seed)
        self.batch_size = sizes.batch_size

    def batch(self) -> list[list[int]]:
        return [next(self.stream) for _ in range(self.batch_size)]


class SwitchedSource:
    """A JobSource that polls one devnet at a time; a proof goes back to the devnet of its job."""

    def __init__(self, source: GatewaySource) -> None:
        self.current = source
        self._owner: dict[bytes, GatewaySource] = {}

    def fetch_job(self) -> MiningJob:
        source = self.current
        job = source.fetch_job()
        self._owner[job.header76] = source
        return job

    def submit(self, plain_proof_b64: str, job: MiningJob) -> str:
        return self._owner.get(job.header76, self.current).submit(plain_proof_b64, job)

    def block_status(self, job: MiningJob) -> bool | None:
        return self._owner.get(job.header76, self.current).block_status(job)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def serve_measured(worker: Worker, sizes: Sizes, prompts: Prompts, device: torch.device) -> dict[str, float]:
    """One batch (prefill + decode) on the device; its tokens/s by phase and overall (synced)."""
    gen = Generator(worker.model, sizes.batch_size, sizes.max_new_tokens)
    batch = prompts.batch()
    _sync(device)
    start = time.perf_counter()
    with torch.device(device):
        gen.serve_batch(batch)
    _sync(device)
    wall = time.perf_counter() - start
    s = gen.stats
    return {"prefill": s.prefill_tokens_per_s, "decode": s.decode_tokens_per_s,
            "overall": (s.prefill_tokens + s.decode_tokens) / wall}


def mine_blocks(worker: Worker, sizes: Sizes, prompts: Prompts, device: torch.device, deadline: float,
                phase: dict[str, Any]) -> None:
    """Serve until ``sizes.blocks`` blocks are accepted or the deadline; note modes and timings."""
    started = time.monotonic()
    modes = phase.setdefault("modes", [])
    while time.monotonic() < deadline and worker.stats.accepted < sizes.blocks:
        serve_measured(worker, sizes, prompts, device)
        worker.check_blocks()
        mode = worker.status()["mode"]
        if mode != "off" and (not modes or modes[-1] != mode):
            modes.append(mode)
        if worker.stats.accepted and phase.get("first_block_s") is None:
            phase["first_block_s"] = time.monotonic() - started
    phase["mining_s"] = time.monotonic() - started


def wait_for_mode(worker: Worker, deadline: float, bits: int | None = None) -> None:
    """Let the job thread adopt a job (of ``bits`` if given) and prepare the backends."""
    def ready() -> bool:
        job = worker.poller.current
        return job is not None and (bits is None or job.bits == bits) and \
            all(layer.backend is not None for layer in worker.layers)

    while time.monotonic() < deadline and not ready():
        time.sleep(0.05)


def benchmark(worker: Worker, sizes: Sizes, prompts: Prompts, device: torch.device, deadline: float,
              phase: dict[str, Any]) -> None:
    """Tokens/s unmined (mining paused) vs mined, alternating batches; medians and ratios."""
    wait_for_mode(worker, deadline, QUIET_BITS)
    runs: dict[str, list[dict[str, float]]] = {"unmined": [], "mined": []}
    bench: dict[str, Any] = {"mode": worker.status()["mode"], "bits": f"{QUIET_BITS:08x}", "runs": runs}
    phase["bench"] = bench
    launches = worker.stats.launches_mined
    for i in range(sizes.warmup + sizes.reps):
        if time.monotonic() > deadline and runs["mined"]:
            break
        for kind in ("unmined", "mined"):
            if kind == "unmined":
                worker.pause("benchmark: unmined")
            else:
                worker.resume()
                wait_for_mode(worker, deadline)
            figures = serve_measured(worker, sizes, prompts, device)
            if i >= sizes.warmup:
                runs[kind].append(figures)
    worker.resume()
    bench["mined_launches"] = worker.stats.launches_mined - launches
    bench["launch_times"] = worker.governor.launch_means()  # layer launches, by CUDA events
    for name in ("prefill", "decode", "overall"):
        unmined = statistics.median(r[name] for r in runs["unmined"]) if runs["unmined"] else None
        mined = statistics.median(r[name] for r in runs["mined"]) if runs["mined"] else None
        bench[name] = {"unmined": unmined, "mined": mined,
                       "ratio": mined / unmined if mined is not None and unmined else None}


def run_phase(profile: str, sizes: Sizes, device: torch.device, dtype: torch.dtype, deadline: float,
              results: Results) -> None:
    """One devnet, one worker: mine blocks, then measure; partial results on any failure."""
    from node_client.devnet import start_devnet

    phase: dict[str, Any] = {"profile": profile}
    results.data["phases"].append(phase)
    with tempfile.TemporaryDirectory(prefix="h200-check-") as tmp, \
            start_devnet(profile, datadir=Path(tmp) / "devnet") as devnet, \
            start_devnet(profile, datadir=Path(tmp) / "quiet", bits=QUIET_BITS) as quiet:
        sources = [GatewaySource(d.gateway_address, d.pearld_client(retries=0, timeout=5.0)) for d in (devnet, quiet)]
        source = SwitchedSource(sources[0])
        config = WorkerConfig(model=sizes.model, network=profile, data_dir=Path(tmp) / "worker",
                              batch_size=sizes.batch_size, prompt_len=sizes.prompt_len,
                              max_new_tokens=sizes.max_new_tokens, min_mining_tokens=sizes.min_mining_tokens,
                              poll_interval=0.2, oom_cooldown_s=5.0)
        started = time.monotonic()
        worker = Worker(config, source, backend_factory=worker_factory(device))
        worker.model.to(device=device, dtype=dtype)
        phase["model_build_s"] = time.monotonic() - started
        prompts = Prompts(sizes, seed=len(results.data["phases"]))
        events = worker.events.subscribe()
        log.info("%s: worker started, model built and moved in %.1f s", profile, phase["model_build_s"])
        worker.start()
        try:
            mining_deadline = started + 0.6 * (deadline - started)
            results.guard("mining", phase, lambda: mine_blocks(worker, sizes, prompts, device, mining_deadline, phase))
            phase["mining_stats"] = worker.stats.snapshot()
            log.info("%s: mining section done: %s", profile, phase["mining_stats"])
            source.current = sources[1]
            results.guard("benchmark", phase, lambda: benchmark(worker, sizes, prompts, device, deadline, phase))
        finally:
            worker.stop_requested.set()
            worker.shutdown()
            for s in sources:
                s.close()
            phase["height"] = devnet.chain.height
            phase["mining"] = worker.stats.snapshot()
            phase["events"] = _drain(events)
            results.write()
            log.info("%s: phase done: %s", profile, {k: phase.get(k) for k in ("modes", "bench", "errors")})


def _drain(events: Any) -> list[str]:
    out = []
    while not events.empty():
        event = events.get_nowait()
        out.append(f"{event.kind}: {event.message}")
    return out[-40:]


def meta(sizes: Sizes, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    return {"device": name, "dtype": str(dtype), "torch": torch.__version__, "triton": triton_version,
            "model": asdict(sizes.model), **{k: v for k, v in asdict(sizes).items() if k != "model"},
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m miner.gpu.h200_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for h200_check.json and .md")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on the CPU (slow: Triton interpreter)")
    parser.add_argument("--phases", nargs="+", help=f"devnet profiles (default {' '.join(PHASES)})")
    parser.add_argument("--budget", type=float, help="seconds for the whole run (default: the sizes')")
    parser.add_argument("--reps", type=int, help="measured batches per kind")
    parser.add_argument("--blocks", type=int, help="accepted blocks to mine per phase before measuring")
    args = parser.parse_args(argv)
    sizes = SMOKE if args.cpu_smoke else H200
    if args.budget is not None:
        sizes = replace(sizes, budget_s=args.budget)
    if args.reps is not None:
        sizes = replace(sizes, reps=args.reps)
    if args.blocks is not None:
        sizes = replace(sizes, blocks=args.blocks)
    if args.cpu_smoke:
        device, dtype = torch.device("cpu"), torch.float32
    elif torch.cuda.is_available():
        device, dtype = torch.device("cuda"), torch.bfloat16
    else:
        parser.error("no CUDA device: use --cpu-smoke for the CPU run")
    phases = args.phases or (SMOKE_PHASES if args.cpu_smoke else PHASES)
    results = Results(args.out, meta(sizes, device, dtype))
    with worker_log(args.out / "h200_check.log"):
        run_phases(phases, sizes, device, dtype, results)
    print((args.out / "h200_check.md").read_text(), flush=True)
    return 0


@contextlib.contextmanager
def worker_log(path: Path) -> Iterator[None]:
    """The worker's log (INFO and up, every thread) into ``path`` for the run's duration."""
    root = logging.getLogger()
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s"))
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        handler.close()


def run_phases(phases: list[str] | tuple[str, ...], sizes: Sizes, device: torch.device, dtype: torch.dtype,
               results: Results) -> None:
    """Each phase in turn, sharing what is left of the budget evenly."""
    start = time.monotonic()
    for i, profile in enumerate(phases):
        share = (start + sizes.budget_s - time.monotonic()) / (len(phases) - i)
        if share <= 0:
            results.data["errors"].append(f"{profile}: skipped, the time budget is spent")
            continue
        results.guard(profile, results.data,
                      functools.partial(run_phase, profile, sizes, device, dtype, time.monotonic() + share, results))
    results.data["total_s"] = time.monotonic() - start
    results.write()


if __name__ == "__main__":
    raise SystemExit(main())
