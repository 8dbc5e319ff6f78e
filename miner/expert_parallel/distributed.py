"""Joining the process group: gloo on the CPU, NCCL on GPUs (NVLink multicast off), plus a gloo
group for the per-step control traffic so it never touches a GPU stream."""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class EPContext:
    rank: int
    world_size: int
    device: torch.device
    group: dist.ProcessGroup | None  # the all-to-alls of the MoE layers (None: the default group)
    control_group: dist.ProcessGroup | None  # jobs and winners (gloo)


def on_cuda(device: str) -> bool:
    """Whether ``device`` (auto, cpu, cuda) means the GPUs here."""
    return device == "cuda" or (device == "auto" and torch.cuda.is_available())


def pick_device(device: str, local_rank: int) -> torch.device:
    """``cpu``, ``cuda`` (this process's local GPU) or ``auto`` (cuda when one is visible)."""
    if device == "auto":
        device = "cuda" if on_cuda(device) else "cpu"
    if device == "cpu":
        return torch.device("cpu")
    if device != "cuda":
        raise ValueError(f"device must be auto, cpu or cuda, got {device!r}")
    if not torch.cuda.is_available():
        raise ValueError("device cuda asked for, but no CUDA GPU is visible")
    if local_rank >= torch.cuda.device_count():
        raise ValueError(f"local rank {local_rank} has no GPU: {torch.cuda.device_count()} visible")
    return torch.device("cuda", local_rank)


def connect(rank: int, world_size: int, device: str = "cpu", init_method: str = "env://",
            local_rank: int | None = None, timeout_s: float = 300.0) -> EPContext:
    """Join the group (torchrun's environment by default) and open the control group."""
    dev = pick_device(device, rank if local_rank is None else local_rank)
    backend = "gloo"
    if dev.type == "cuda":
        os.environ["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast stays off on the lent machines
        torch.cuda.set_device(dev)
        backend = "nccl"
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout_s))
    control = dist.new_group(backend="gloo") if backend != "gloo" else None
    return EPContext(rank, world_size, dev, None, control)


def connect_from_env(device: str = "auto") -> EPContext:
    """Under torchrun: RANK, WORLD_SIZE and LOCAL_RANK come from the environment."""
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", rank))
    except (KeyError, ValueError) as exc:
        raise ValueError("RANK and WORLD_SIZE must be set (run under torchrun)") from exc
    return connect(rank, world, device, "env://", local)


def disconnect() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
