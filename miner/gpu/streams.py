"""Per-job preparation off the serving stream, and one interpreted launch at a time on the CPU.

``SideWork`` runs a block of device work on a side stream (CUDA) and records an event; the serving
thread calls ``ready()`` before its first launch that uses the result, so the serving stream waits
on the GPU (never the host) and only for work it needs. On the CPU both are no-ops.

``device_exclusive(device)``: on the CPU the pipelines' Triton kernels run in Triton's interpreter,
which keeps the launch grid in process-wide state, so the job thread preparing one backend and the
serving thread launching another must not interpret kernels at the same time. CUDA launches need
no such lock.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import ContextManager

import torch

_INTERPRETER = threading.RLock()


def device_exclusive(device: torch.device) -> ContextManager[object]:
    """A process-wide lock for CPU (interpreted) pipeline work; nothing to hold on CUDA."""
    return contextlib.nullcontext() if device.type == "cuda" else _INTERPRETER


class SideWork:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.event: torch.cuda.Event | None = None

    @contextlib.contextmanager
    def run(self) -> Iterator[None]:
        """Enqueue the block's device work on the side stream, after what is already enqueued."""
        if self.stream is None:
            yield
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            yield
            self.event = torch.cuda.Event()
            self.event.record(self.stream)

    def ready(self) -> None:
        """Make the caller's current stream wait for the last block (no host sync)."""
        if self.event is not None:
            torch.cuda.current_stream(self.device).wait_event(self.event)
            self.event = None
