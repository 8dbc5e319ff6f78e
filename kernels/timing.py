"""GPU timing for the benchmark and the autotune sweep: CUDA-graph replay, L2-cold input
rotation, interleaved replays, medians (grouped-gemm-anchors.md §6 protocol).

A method is a list of zero-argument callables, one per rotated input set; each call launches
one operation on the current stream. A method's graph holds `calls` launches cycling over the
sets, so consecutive launches never find their inputs in L2 when the sets together exceed it.
Methods compared with each other are replayed round-robin (A B C A B C ...), so clock drift under
sustained load (seen: +-10 % within one run on the H200) hits all of them alike.
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


@dataclass
class _Prepared:
    run: Callable[[], None]
    n_calls: int
    graph: torch.cuda.CUDAGraph | None


def _prepare(calls: list[Callable[[], None]], target_ms: float) -> _Prepared:
    """Warm up, size the batch to ~target_ms, and capture it in a graph (eager if that fails)."""
    for fn in calls:  # warm-up: compilation, handles, allocator
        fn()
    torch.cuda.synchronize()
    one_ms = _event_time_ms(lambda: [fn() for fn in calls]) / len(calls)
    n_calls = max(len(calls), math.ceil(target_ms / max(one_ms, 1e-3)))
    n_calls = math.ceil(n_calls / len(calls)) * len(calls)

    def body() -> None:
        for i in range(n_calls):
            calls[i % len(calls)]()

    try:
        graph = captured_graph(body, warmup=1)
        graph.replay()
        return _Prepared(graph.replay, n_calls, graph)
    except RuntimeError:
        torch.cuda.synchronize()
        return _Prepared(body, n_calls, None)


def captured_graph(fn: Callable[[], object], warmup: int) -> torch.cuda.CUDAGraph:
    """One `fn()` captured in a CUDA graph, after `warmup` calls on a side stream (capture needs
    its allocations and compilations done, off the capturing stream)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def time_methods(methods: dict[str, list[Callable[[], None]]], target_ms: float = 4.0,
                 replays: int = 9) -> dict[str, Timing | Exception]:
    """Median time of one call per method, replaying the methods' graphs round-robin.

    A method that fails to run gets its exception instead of a Timing; the others still run.
    """
    prepared: dict[str, _Prepared] = {}
    result: dict[str, Timing | Exception] = {}
    for name, calls in methods.items():
        try:
            prepared[name] = _prepare(calls, target_ms)
        except Exception as exc:  # a baseline that cannot run on this shape drops out
            torch.cuda.synchronize()
            result[name] = exc
    samples: dict[str, list[float]] = {name: [] for name in prepared}
    for _ in range(replays):
        for name, p in prepared.items():
            samples[name].append(_event_time_ms(p.run) * 1e3 / p.n_calls)
    for name, p in prepared.items():
        s = samples[name]
        result[name] = Timing(statistics.median(s), min(s), replays, p.n_calls, p.graph is not None)
    return result
