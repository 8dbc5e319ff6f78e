"""Kernel timelines of CUDA-graph replays, from the profiler's CUPTI records.

Event timings (kernels.timing) give a pass's length; they cannot show where it goes when a pass
spreads over two streams: which kernel holds the serving stream, what runs beside the GEMM, how
long the gaps between launches are. The mining passes' GPU checks record these timelines so a
device session gets them in the same call as its timings.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

import torch

from kernels.timing import captured_graph


@dataclass(frozen=True)
class KernelSpan:
    """One kernel (or copy) of a replay: start relative to the first record, duration (µs), the
    stream it ran on and its (shortened) name."""

    start_us: float
    duration_us: float
    stream: int
    name: str


def kernel_timeline(fn: Callable[[], object], replays: int = 4, name_chars: int = 90) -> list[KernelSpan]:
    """The device work of `replays` replays of a CUDA graph of one `fn()` call, in start order.

    fn is warmed up twice on a side stream (as graph capture requires), captured, replayed three
    times untimed, then replayed under the profiler."""
    if not torch.cuda.is_available():
        raise RuntimeError("kernel timelines need a CUDA device")
    from torch.profiler import ProfilerActivity, profile

    graph = captured_graph(fn, warmup=2)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    records = sorted((e.time_range.start, e.time_range.end - e.time_range.start, getattr(e, "thread", -1), e.name)
                     for e in prof.events()
                     if str(e.device_type).endswith("CUDA") and e.name and not e.name.startswith("cudaGraph"))
    first = records[0][0] if records else 0.0
    return [KernelSpan(round(start - first, 2), round(duration, 2), stream, name[:name_chars])
            for start, duration, stream, name in records]


def summarize(spans: list[KernelSpan]) -> dict[str, dict[str, float]]:
    """Per kernel name: how many times it ran and its median duration (µs), longest first."""
    by_name: dict[str, list[float]] = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span.duration_us)
    rows = {name: {"count": len(times), "median_us": round(statistics.median(times), 2)}
            for name, times in by_name.items()}
    return dict(sorted(rows.items(), key=lambda kv: -kv[1]["median_us"]))


def timeline_entry(spans: list[KernelSpan]) -> dict[str, object]:
    """A recorded timeline as the GPU checks report it: the per-kernel summary, then every span as
    [start µs, µs, stream, name] (the gaps between launches are read from the spans)."""
    return {"kernels": summarize(spans),
            "spans (start us, us, stream, name)": [[s.start_us, s.duration_us, s.stream, s.name] for s in spans]}
