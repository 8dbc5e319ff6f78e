"""Launch counts of the FP8 mined pass, counted on the CPU backend (small MoE shapes).

Each torch op that computes or copies (not views, not allocations) and each Triton kernel launch
is one device launch on CUDA. Kernels are counted, not run (shapes are static, so the sequence
of launches does not depend on the values; the values are the stages tests' business) — except
the routing kernel, whose Rflat indexes the gathers that follow — and the
CPU stand-in for the GEMM (proof.fp8's model) counts as the one launch it is on CUDA. The
budgets pin the per-launch structure so a regression (a per-launch cat, cast or gather chain)
shows up in CI without a GPU. Before the launch-count work (issue 8, second pass): A side 39,
whole pass 83 (of which 5 were the CPU-only per-expert peel loop).
"""
from __future__ import annotations

import collections
import contextlib
import functools

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from triton.runtime.interpreter import InterpretedFunction

from kernels.fp8mine import matmul
from kernels.fp8mine.pipeline import MinedGemm, prepare_a
from kernels.fp8mine.quant import prepare_rows
from kernels.fp8mine.gpu_check import synthetic_chain

EXPERTS, N_E, K, TOKENS, TOP_K = 4, 64, 1024, 16, 2
# rows (prequant, norms, scales), the plane trees, keys + E_A, noise dot, A′ (the A peel is the caller's)
A_SIDE_BUDGET = 5
PASS_BUDGET = 22  # incl. the lottery's tile map and pass (no longer fused into the peel)
# Ops that only allocate, alias or describe a tensor: no kernel on CUDA.
_FREE = {"empty", "empty_strided", "empty_like", "view", "_unsafe_view", "alias", "slice", "select",
         "expand", "t", "transpose", "permute", "as_strided", "detach", "unsqueeze", "squeeze",
         "split", "split_with_sizes", "unbind", "view_as", "lift_fresh", "_reshape_alias",
         "unflatten", "diagonal", "record_stream"}


# Kernels whose outputs index later ops (the routing table): run as well as counted.
_INDEX_KERNELS = {"_ranked_kernel", "_front_kernel"}


class LaunchCounter(TorchDispatchMode):
    """Counts kernel-launching torch ops and interpreted Triton launches (by kernel name)."""

    def __init__(self):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()
        self.kernels: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name not in _FREE:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))

    @property
    def launches(self) -> int:
        return sum(self.ops.values()) + sum(self.kernels.values())

    def reset(self) -> None:
        self.ops.clear()
        self.kernels.clear()


@pytest.fixture(scope="module")
def counter():
    """Triton launches and the CPU GEMM model are counted instead of run, for the whole module."""
    counting = LaunchCounter()
    patch = pytest.MonkeyPatch()

    original = InterpretedFunction.run

    @functools.wraps(original)
    def run(self, *args, grid, warmup, **kwargs):
        counting.kernels[self.fn.__name__] += 1
        if self.fn.__name__ in _INDEX_KERNELS:
            with _disable_current_modes():
                return original(self, *args, grid=grid, warmup=warmup, **kwargs)
        return None

    def model_gemm(a, b, table):
        counting.kernels["fp8 GEMM"] += 1
        return torch.empty((a.shape[0], b.shape[1]), dtype=torch.float32)

    patch.setattr(InterpretedFunction, "run", run)
    patch.setattr(matmul, "_model_grouped", model_gemm)
    yield counting
    patch.undo()


@pytest.fixture(scope="module")
def moe_pass(counter):
    torch.manual_seed(0)
    gemm = MinedGemm((torch.randn(EXPERTS, N_E, K) * 0.05).to(torch.bfloat16), m=TOKENS, top_k=TOP_K)
    header, ancestors = synthetic_chain()
    gemm.set_job(header, ancestors, 0)
    x = torch.randn(TOKENS, K).to(torch.bfloat16)
    topk = (torch.arange(TOKENS)[:, None] * TOP_K + torch.arange(TOP_K)[None, :]) % EXPERTS
    gemm.forward(x, topk)  # warm: constants uploaded, kernels rewritten
    return gemm, x, topk


def test_a_side_launches(moe_pass, counter):
    gemm, x, topk = moe_pass
    table = gemm.forward(x, topk).table
    counter.reset()
    with counter:
        prepare_a(prepare_rows(x), gemm.seed_message, gemm.p_a_len, gemm.state, table, in_expert_order=True)
    print("A side:", counter.launches, dict(counter.ops), dict(counter.kernels))
    assert counter.kernels["_launch_keys_kernel"] == 1  # HA, seedA and both label keys: one launch
    assert counter.launches <= A_SIDE_BUDGET


def test_mined_pass_launches(moe_pass, counter):
    gemm, x, topk = moe_pass
    counter.reset()
    with counter:
        gemm.forward(x, topk)
    print("mined pass:", counter.launches, dict(counter.ops), dict(counter.kernels))
    assert counter.kernels["fp8 GEMM"] == 2  # the noise dot and the layer GEMM
    assert counter.kernels["_a_peel_kernel"] == 1
    assert "index_select" not in counter.ops  # A′ is written into expert order, not gathered
    assert counter.launches <= PASS_BUDGET


LAGGED_MAIN_BUDGET = 3  # the front (routing + clean quantization + combined operand: one launch), GEMM, peel
# READY's tail copy, the lottery's tile map (the decode peel reads none), clean A peel, lottery + payload + publish of
# MINED (the rows the previous launch hashed), the A side, PENDING fill (one kernel, was six
# copies), MINED ← READY rows (one kernel, after the GEMM)
LAGGED_SIDE_BUDGET = 13  # the mined rows are never peeled: no A peel of them (sixteenth session, was 14)


@pytest.fixture(scope="module")
def lagged_pass(counter):
    torch.manual_seed(0)
    gemm = MinedGemm((torch.randn(EXPERTS, N_E, K) * 0.05).to(torch.bfloat16), m=TOKENS, top_k=TOP_K,
                     lagged=True)
    header, ancestors = synthetic_chain()
    gemm.set_job(header, ancestors, 0)
    x = torch.randn(TOKENS, K).to(torch.bfloat16)
    topk = (torch.arange(TOKENS)[:, None] * TOP_K + torch.arange(TOP_K)[None, :]) % EXPERTS
    gemm.forward(x, topk)  # warm
    return gemm, x, topk


def test_lagged_pass_launches(lagged_pass, counter, monkeypatch):
    """The serving stream of a lagged launch carries only what the output needs; the rest is
    counted inside the side-stream blocks (`MinedGemm._on_side`)."""
    gemm, x, topk = lagged_pass
    per_stream = {}

    @contextlib.contextmanager
    def on_side():
        before = counter.launches
        yield
        per_stream["side"] = per_stream.get("side", 0) + counter.launches - before

    monkeypatch.setattr(gemm, "_on_side", on_side)
    counter.reset()
    with counter:
        gemm.forward(x, topk)
    main = counter.launches - per_stream["side"]
    print("lagged pass: main", main, "side", per_stream["side"], dict(counter.ops), dict(counter.kernels))
    assert counter.kernels["fp8 GEMM"] == 2  # the noise dot (side) and the layer GEMM (main)
    assert counter.kernels["_front_kernel"] == 1 and counter.kernels["_lottery_kernel"] == 1
    assert "_operand_kernel" not in counter.kernels and "_clean_kernel" not in counter.kernels
    assert counter.kernels["_fill_kernel"] == 1
    assert counter.kernels["_take_kernel"] == 1
    assert counter.kernels["_a_peel_kernel"] == 1  # the clean rows' only
    assert main <= LAGGED_MAIN_BUDGET
    assert per_stream["side"] <= LAGGED_SIDE_BUDGET
