"""Mining backends on the GPU pipelines (kernels.int7, kernels.fp8mine) and the H200 acceptance run.

See docs/miner-gpu.md. ``backend_factory(mode, layer, device)`` makes one layer's backend;
``worker_factory(device)`` keeps them across jobs in the worker's factory signature;
``factory_for(device)`` is the worker's choice of factory for a model on that device.
They are imported on first use, so ``miner.gpu.layout`` stays light (no Triton kernels).
"""
from __future__ import annotations

from typing import Any

__all__ = ["FP8_DENSE", "backend_factory", "factory_for", "worker_factory"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from miner.gpu import factory
        return getattr(factory, name)
    raise AttributeError(f"module 'miner.gpu' has no attribute {name!r}")
