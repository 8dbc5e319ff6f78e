"""Triton entry point for kernels.int7: compiled on a CUDA machine, interpreted elsewhere.

Every kernel in this package is decorated with `jit`. Without a CUDA device (CI, this CPU machine)
the same kernel source runs in Triton's interpreter on CPU tensors, so the CPU tests exercise the
exact code the H200 compiles. PEARL_INT7_INTERPRET=1/0 overrides the choice (set before import).
"""
from __future__ import annotations

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
