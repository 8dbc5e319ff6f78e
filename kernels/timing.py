"""GPU timing for the benchmark and the autotune sweep: CUDA-graph replay, L2-cold input
rotation, medians (grouped-gemm-anchors.md §6 protocol).

A method is a list of zero-argument callables, one per rotated input set; each call launches
one operation on the current stream. The graph holds `calls` launches cycling over the sets, so
consecutive launches never find their inputs in L2 when the sets together exceed it.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable

import torch

L2_BYTES = 60 * 1024 * 1024  # H200, as torch reports it
ROTATION_BYTES = 3 * L2_BYTES  # inputs touched between two uses of one set


def rotation_sets(bytes_per_set: int, max_sets: int = 16) -> int:
    """How many input copies make consecutive launches L2-cold."""
    return max(1, min(max_sets, math.ceil(ROTATION_BYTES / max(bytes_per_set, 1))))


@dataclass(frozen=True)
class Timing:
    median_us: float
    min_us: float
    replays: int
    calls_per_replay: int
    graph: bool


def _event_time_ms(run: Callable[[], None]) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def time_calls(calls: list[Callable[[], None]], target_ms: float = 4.0,
               replays: int = 9) -> Timing:
    """Median time of one call, replaying a CUDA graph of many calls (eager if capture fails)."""
    for fn in calls:  # warm-up: compilation, handles, allocator
        fn()
    torch.cuda.synchronize()
    one_ms = _event_time_ms(lambda: [fn() for fn in calls]) / len(calls)
    n_calls = max(len(calls), math.ceil(target_ms / max(one_ms, 1e-3)))
    n_calls = math.ceil(n_calls / len(calls)) * len(calls)

    def body() -> None:
        for i in range(n_calls):
            calls[i % len(calls)]()

    graph: torch.cuda.CUDAGraph | None = torch.cuda.CUDAGraph()
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            body()  # warm-up on the side stream, as capture requires
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(graph):
            body()
        run = graph.replay
        run()
    except RuntimeError:
        torch.cuda.synchronize()
        graph, run = None, body
    samples = [_event_time_ms(run) * 1e3 / n_calls for _ in range(replays)]
    return Timing(statistics.median(samples), min(samples), replays, n_calls, graph is not None)
