"""Hopper (sm_90a) CuTe DSL kernels and their torch-facing ops (see docs/kernels.md).

The kernels here target sm_90a only, so the DSL's target defaults to it before cutlass is first
imported (cutlass reads CUTE_DSL_ARCH once, at import): compiles then work on a CPU-only machine
too, and on an H200 this is the architecture the DSL would detect anyway.
"""
import os

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
