"""The progress display for long runs: notable events as they happen and a status line."""
from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from miner.events import EventBus

QUIET_KINDS = {"mode_preference"}


def human(value: float) -> str:
    """1234567 -> '1.23M' (work figures run to 10^15 quickly)."""
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f}{unit}"
    return f"{value:.0f}"


def slowdown_text(mining: dict[str, Any]) -> str:
    """Mining's measured slowdown of serving and its cap (miner.governor), for people."""
    cap, measured = float(mining.get("max_slowdown", 0.0)), float(mining.get("measured_slowdown", -1.0))
    shown = "not measured yet" if measured < 0 else f"{100 * measured:.1f} % measured"
    return f"{shown}, cap {'none' if cap == 0 else f'{100 * cap:.1f} %'}"


def status_line(status: dict[str, Any]) -> str:
    mining, serving = status["mining"], status["serving"]
    height = status["height"]
    return (f"[{status['uptime_s']:6.0f}s] {status['state']:<8} {status['mode']:<10} "
            f"h={height if height >= 0 else '?'} job={status['job_id'][:8] or '-'} | "
            f"serve {serving['tokens_per_s']:.0f} tok/s (decode {serving['decode_tokens_per_s']:.0f}) "
            f"reqs={serving['requests']} | work {human(mining['credited_work'])} "
            f"({human(mining['hashrate'])}/s) tickets={mining['tickets']} winners={mining['winners']} "
            f"submitted={mining['submitted']} accepted={mining['accepted']} rejected={mining['rejected']} | "
            f"slowdown {slowdown_text(mining)}")


class ProgressDisplay:
    """Call ``tick(status)`` between batches: prints new events and, every ``interval`` seconds,
    the status line."""

    def __init__(self, events: EventBus, interval: float = 5.0, out: TextIO = sys.stdout) -> None:
        self.interval, self.out = interval, out
        self._sub = events.subscribe(replay=True)
        self._last = 0.0

    def flush_events(self) -> None:
        while not self._sub.empty():
            event = self._sub.get_nowait()
            if event.kind not in QUIET_KINDS:
                stamp = time.strftime("%H:%M:%S", time.localtime(event.time))
                print(f"{stamp} {event.kind}: {event.message}", file=self.out, flush=True)

    def tick(self, status: dict[str, Any]) -> None:
        self.flush_events()
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            print(status_line(status), file=self.out, flush=True)
