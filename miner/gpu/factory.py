"""Which backend mines a layer: the GPU pipelines on the model's device, kept across jobs.

``backend_factory(mode, layer, device)`` makes the backend of one MoE layer for a mode.
``worker_factory(device)`` adapts it to the worker's ``BackendFactory`` signature
(mode, layer id, model config) and keeps one backend per (mode, layer) for the worker's life, so
per-weights work (int7 quantisation, FP8 gemms and their B states) is not redone every block.
``factory_for(device)``: the GPU backends on CUDA, the worker's CPU reference backends otherwise.
``lagged_decode`` (all three; default on): decode launches mine the previous launch's rows beside
the GEMM (docs/miner-gpu.md, "Lagged decode mining"); False keeps every launch same-launch.
"""
from __future__ import annotations

import threading
from typing import Protocol

import torch

from miner.backend import MiningBackend
from miner.gpu.fp8 import GpuFp8Backend
from miner.gpu.int7 import GpuInt7Backend
from miner.model import ModelConfig
from miner.modes import Mode
from miner.worker import BackendFactory, cpu_backend

FP8_DENSE = "fp8-dense"


class LayerShape(Protocol):
    """What a backend needs to know of its layer (``miner.model.moe.MoEBlock`` has both)."""

    layer_id: int
    cfg: ModelConfig


def backend_factory(mode: Mode | str, layer: LayerShape, device: torch.device | str, *,
                    lagged_decode: bool = True) -> MiningBackend:
    """The GPU-pipeline backend of ``layer`` for ``mode`` (fp8-moe, fp8-dense, int7-moe, int7-dense).

    ``device`` is where the layer's weights live; the backend runs its pipeline there (CUDA, or
    torch's CPU backend with Triton's interpreter for tests).
    """
    device = torch.device(device)
    cfg = layer.cfg
    name = mode.value if isinstance(mode, Mode) else str(mode)
    if name in (Mode.INT7_MOE.value, Mode.INT7_DENSE.value):
        return GpuInt7Backend(Mode(name), layer.layer_id, cfg.num_experts, cfg.top_k, lagged_decode=lagged_decode)
    if name == Mode.FP8_MOE.value:
        return GpuFp8Backend(layer.layer_id, cfg.num_experts, cfg.top_k, lagged_decode=lagged_decode)
    if name == FP8_DENSE:
        if cfg.num_experts != 1:
            raise ValueError(f"fp8-dense mines a one-expert (dense) layer; this one has {cfg.num_experts}")
        return GpuFp8Backend(layer.layer_id, 1, 1, lagged_decode=lagged_decode)
    raise NotImplementedError(f"no GPU backend mines {name} (on {device})")


class _Layer:
    def __init__(self, layer_id: int, cfg: ModelConfig) -> None:
        self.layer_id, self.cfg = layer_id, cfg


def worker_factory(device: torch.device | str, *, lagged_decode: bool = True) -> BackendFactory:
    """``backend_factory`` in the worker's signature, one backend per (mode, layer) kept across jobs."""
    kept: dict[tuple[Mode, int], MiningBackend] = {}
    lock = threading.Lock()

    def make(mode: Mode, layer_id: int, cfg: ModelConfig) -> MiningBackend:
        with lock:
            backend = kept.get((mode, layer_id))
            if backend is None:
                backend = kept[(mode, layer_id)] = backend_factory(mode, _Layer(layer_id, cfg), device,
                                                                     lagged_decode=lagged_decode)
            return backend

    return make


def factory_for(device: torch.device | str, *, lagged_decode: bool = True) -> BackendFactory:
    """The worker's factory for a model on ``device``: GPU pipelines on CUDA, CPU references otherwise."""
    return worker_factory(device, lagged_decode=lagged_decode) if torch.device(device).type == "cuda" else cpu_backend
