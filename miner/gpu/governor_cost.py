"""The slowdown governor's host cost a launch, timed launch by launch against a bare launch.

    python -m miner.gpu.governor_cost --out DIR        # on a CUDA machine, ~10 s
    python -m miner.gpu.governor_cost --device cpu     # the same loop on the CPU (a smoke run)

Why: the governor brackets every layer launch, so its host time is paid on every launch of the
serving thread. A launch here is one small elementwise kernel (it runs faster than it is enqueued,
so the GPU never holds the host back); each variant runs the same loop, the variants interleaved
rep by rep, median over reps. Reported: µs of host time a launch, bare and under the governor
(every launch timed, and one in ``SAMPLE_EVERY``; uncapped and capped), and each one's cost over
the bare launch. Results: DIR/governor_cost.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from miner.governor import SAMPLE_EVERY, SlowdownGovernor

TOKENS = 512  # a GLM-5 decode launch's routed rows: one size class


def _launch_loop(governor: SlowdownGovernor | None, x: torch.Tensor, launches: int) -> float:
    """Host µs a launch over `launches` launches of one small kernel, bracketed by `governor`."""
    start = time.perf_counter()
    for _ in range(launches):
        if governor is None:
            x.add_(1.0)
            continue
        reserved = governor.admit(TOKENS)
        with governor.timed(x, TOKENS, mined=reserved is not None, reserved=reserved or 0.0):
            x.add_(1.0)
    elapsed = time.perf_counter() - start
    if x.is_cuda:
        torch.cuda.synchronize(x.device)
    return 1e6 * elapsed / launches


def variants() -> dict[str, SlowdownGovernor | None]:
    """Each variant's governor (None: the bare launch). A governor lives for the whole run, so its
    warm-up and unmined baselines are past by the timed reps."""
    return {"bare launch": None,
            "every launch timed, uncapped": SlowdownGovernor(None, sample_every=1),
            f"one in {SAMPLE_EVERY} timed, uncapped": SlowdownGovernor(None),
            "every launch timed, cap 10 %": SlowdownGovernor(0.1, sample_every=1),
            f"one in {SAMPLE_EVERY} timed, cap 10 %": SlowdownGovernor(0.1)}


def measure(device: torch.device, launches: int, reps: int) -> dict[str, object]:
    """Median host µs a launch per variant, and each governor variant's cost over the bare launch."""
    x = torch.zeros(1024, device=device)
    runs = variants()
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for governor in runs.values():  # warm-up: kernels, events, the governors' baselines
        _launch_loop(governor, x, launches)
    for _ in range(reps):
        for name, governor in runs.items():
            samples[name].append(_launch_loop(governor, x, launches))
    medians = {name: statistics.median(values) for name, values in samples.items()}
    bare = medians["bare launch"]
    return {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "launches a rep": launches, "reps": reps, "host us a launch (median)": medians,
            "governor host us a launch over the bare launch": {name: value - bare for name, value in medians.items()
                                                                if name != "bare launch"},
            "samples": samples}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m miner.gpu.governor_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="folder for governor_cost.json (default: print only)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cuda (default) or cpu")
    parser.add_argument("--launches", type=int, default=2000, help="launches a rep (default 2000)")
    parser.add_argument("--reps", type=int, default=15, help="reps a variant (default 15)")
    args = parser.parse_args(argv)
    if args.launches < 1 or args.reps < 1:
        parser.error("--launches and --reps must be at least 1")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device here; use --device cpu for a smoke run")
    if args.out and not _writable(args.out):  # said before the measurement, not after it
        return 2
    result = measure(device, args.launches, args.reps)
    for name, value in result["host us a launch (median)"].items():
        print(f"{name:36s} {value:7.2f} us")
    if args.out:
        try:
            (args.out / "governor_cost.json").write_text(json.dumps(result, indent=1))
        except OSError as error:
            print(f"governor_cost: cannot write {args.out}: {error}", file=sys.stderr)
            return 2
    return 0


def _writable(folder: Path) -> bool:
    """Create `folder` if needed; False (with the reason on stderr) where it cannot be written."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".governor_cost_probe"
        probe.write_text("")
        probe.unlink()
        return True
    except OSError as error:
        print(f"governor_cost: cannot write {folder}: {error}", file=sys.stderr)
        return False


if __name__ == "__main__":
    raise SystemExit(main())
