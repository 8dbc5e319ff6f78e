"""Triton entry point for the mining kernels (kernels.int7, kernels.fp8mine): compiled on a CUDA
machine, interpreted elsewhere.

Every Triton kernel of those packages is decorated with `jit`. Without a CUDA device (CI, this CPU
machine) the same kernel source runs in Triton's interpreter on CPU tensors, so the CPU tests
exercise the exact code the H200 compiles. PEARL_INT7_INTERPRET=1/0 overrides the choice for both
packages (set before import; the name is older than the second package). The interpreter wrapper
does not patch Triton's jit'd standard library (`tl.sum`, `tl.max`, ...): kernels use `tl.reduce`
with their own combine functions instead.
"""
from __future__ import annotations

import functools
import os

import torch
import triton
from triton.runtime.interpreter import InterpretedFunction


def _interpreting() -> bool:
    forced = os.environ.get("PEARL_INT7_INTERPRET")
    if forced is not None:
        return forced not in ("", "0")
    return not torch.cuda.is_available()


INTERPRETING = _interpreting()


def jit(fn):
    """`triton.jit` on a GPU machine, Triton's interpreter otherwise."""
    if INTERPRETING:
        return InterpretedFunction(fn)
    return triton.jit(fn)


# Programmatic dependent launch (sm_90+): a kernel launched with `pdl_launch()` may start while the
# kernel before it on the stream still runs, once every program of that one has called
# `gdc_launch_dependents`; it must call `gdc_wait` before reading anything that kernel writes.
# False turns it off everywhere (a lever for measuring it, and for drivers that refuse the launch
# attribute: PEARL_PDL=0 in the environment); the results are the same bits either way.
PDL = os.environ.get("PEARL_PDL", "1") not in ("", "0")


@functools.cache
def _sm90_or_newer() -> bool:
    return torch.cuda.get_device_capability() >= (9, 0)


def pdl_enabled() -> bool:
    """Whether launches overlap through programmatic dependent launch: compiled kernels on sm_90+."""
    return PDL and not INTERPRETING and _sm90_or_newer()


def pdl_launch(enabled: bool) -> dict:
    """The launch keyword for a programmatic dependent launch, or none."""
    return {"launch_pdl": True} if enabled else {}
