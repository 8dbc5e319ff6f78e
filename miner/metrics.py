"""The Prometheus endpoint: every figure of the worker's status, read at scrape time."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from miner.accounting import COUNTERS

_MINING_COUNTERS = tuple(name for name in COUNTERS if name != "rejected")  # rejected: by reason
_SERVING_COUNTERS = ("requests", "prefill_tokens", "decode_tokens")
_SERVING_GAUGES = ("prefill_tokens_per_s", "decode_tokens_per_s", "tokens_per_s")
_STATES = ("mining", "paused", "waiting", "cooldown")


class StatusCollector(Collector):
    """Turns a worker status dict into metric families prefixed ``pearl_moe_``."""

    def __init__(self, status: Callable[[], dict[str, Any]]) -> None:
        self._status = status

    def collect(self) -> Iterator[Any]:
        status = self._status()
        mining, serving = status["mining"], status["serving"]
        for name in _MINING_COUNTERS:
            yield CounterMetricFamily(f"pearl_moe_{name}", f"mining: {name.replace('_', ' ')}",
                                      value=mining[name])
        rejected = CounterMetricFamily("pearl_moe_rejected", "proofs rejected, by reason",
                                       labels=["reason"])
        for reason, count in mining["rejected_reasons"].items():
            rejected.add_metric([reason], count)
        yield rejected
        yield GaugeMetricFamily("pearl_moe_hashrate", "credited work per second", value=mining["hashrate"])
        yield GaugeMetricFamily("pearl_moe_pending_winners", "winners not yet submitted",
                                value=mining["pending_winners"])
        yield GaugeMetricFamily("pearl_moe_max_slowdown", "the slowdown cap on mining (0: none)",
                                value=mining["max_slowdown"])
        yield GaugeMetricFamily("pearl_moe_measured_slowdown", "mining's measured slowdown of serving "
                                "(-1: not known yet)", value=mining["measured_slowdown"])
        for name in _SERVING_COUNTERS:
            yield CounterMetricFamily(f"pearl_moe_{name}", f"serving: {name.replace('_', ' ')}",
                                      value=serving[name])
        for name in _SERVING_GAUGES:
            yield GaugeMetricFamily(f"pearl_moe_{name}", f"serving: {name.replace('_', ' ')}",
                                    value=serving[name])
        state = GaugeMetricFamily("pearl_moe_state", "1 for the worker's current state", labels=["state"])
        for name in _STATES:
            state.add_metric([name], 1.0 if status["state"] == name else 0.0)
        yield state
        yield GaugeMetricFamily("pearl_moe_source_connected", "1 while the job source answers",
                                value=1.0 if status["source_connected"] else 0.0)


def start_metrics(status: Callable[[], dict[str, Any]], port: int, host: str = "127.0.0.1") -> int:
    """Serve /metrics on ``host:port`` (0 = an ephemeral port); returns the bound port."""
    registry = CollectorRegistry()
    registry.register(StatusCollector(status))
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return int(server.server_address[1])
