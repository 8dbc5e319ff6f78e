"""Completion counters for launches whose last program combines the others' work (the FP8 split-k
A peel, the plane forest): one zeroed int32 buffer per (device, stream, size). Each launch's last
program resets what it used, so graph replays reuse the buffer; launches on different streams
get different buffers, so two in flight at once never share a count."""
from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=64)
def _counters(device: torch.device, stream: int, size: int) -> torch.Tensor:
    return torch.zeros(size, dtype=torch.int32, device=device)


def stream_counters(device: torch.device, size: int) -> torch.Tensor:
    """The zeroed counters of `size` for launches on the current stream of `device` (0: the CPU)."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    return _counters(device, stream, size)
