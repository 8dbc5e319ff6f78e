"""`python -m kernels.fp8mine.gpu_check --out DIR`: the H200 checks of the FP8 mining path.

Sections (each runs on its own; a failure is recorded and the next section still runs):
- gemm: both mined-GEMM implementations (the CuTe DSL grouped GEMM's fp32 accumulator and the
  windowed Triton kernel) vs proof.fp8.fp8_matmul("hopper") on operands covering every finite
  e4m3 code, the K = 32 noise dot and an uneven grouped launch (an empty expert, short tails); the
  same comparison for torch._scaled_mm per 128-k window with promotion (use_fast_accum True and
  False) and for one unwindowed _scaled_mm;
- stages: a dense and an MoE launch on the GPU against the CPU reference (planes, norms, E_A
  lines, α/β, A′ codes, the accumulator per expert, every tile's ticket), and a dense launch of
  200 rows (the A side's prefill-sized kernel paths);
- planted: planted winners (dense, MoE) → record → PlainProofV4 → CPU verifier (policy included);
- graph: the decode mined pass captured in a CUDA graph, replayed on new inputs, vs eager; the
  lagged pass (MinedGemm(lagged=True)) captured, replayed three times: the third replay's planted
  winner on the first replay's rows (hashed by the second) verifies, and the second equals eager;
- timing: mined pass vs unmined fp8 grouped GEMM (kernels.grouped_gemm, bf16 out; CUDA graphs,
  medians) on decode and prefill shapes, the GEMM implementation the pass used, per-stage times
  (both GEMM implementations), each stage of the A side alone ("A side stages"), and the layer
  output's error against a bf16 reference; on the decode shapes also the lagged pass
  (`mined_pass_lagged_us`, its parts and output error; the acceptance line uses the better pass);
- timeline: the kernels of graph replays (`kernels.timeline`) of the lagged decode pass (and of
  each LAGGED_SWITCHES variant of it) and the prefill pass at GLM-5 FC1 shapes, with each kernel's
  median duration: which stream waits on what.
JSON (results.json) and markdown (results.md) go to DIR.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from proof.fp8 import lottery as ref_lottery
from proof.fp8 import noise as ref_noise
from proof.fp8 import prequant as ref_prequant
from proof.fp8 import quantization as ref_quant
from proof.fp8.mma import fp8_matmul
from proof.fp8.params import TILE_4X64
from proof.fp8.verify import evaluate_plain_proof, verify_plain_proof

from . import matmul as matmul_module
from . import pipeline as pipeline_module
from . import quant
from .lottery import LotteryLatch
from .matmul import (IMPLS, WINDOW_K, fold_in_gemm, folded_lanes, gather_in_gemm, gemm_impl, grouped_matmul,
                     matmul, peel_in_gemm)
from .pipeline import MinedGemm
from .proofs import take_winner
from .routing import RoutingTable, routing_table, row_tiles
from .lagged import clean_peel, lagged_front

DEVICE = "cuda"  # `--device cpu` dry-runs the check logic on the CPU backend (slow, no timings)
FINITE_CODES = np.array([c for c in range(256) if c & 0x7F != 0x7F], dtype=np.uint8)


def _codes(x: torch.Tensor) -> np.ndarray:
    return x.view(torch.uint8).cpu().numpy()


def _u16(x: torch.Tensor) -> np.ndarray:
    return x.cpu().contiguous().view(torch.int16).numpy().view(np.uint16)


def _compare(got: np.ndarray, want: np.ndarray) -> dict:
    """Bitwise comparison of two fp32 arrays: mismatch count, worst ulp distance, a sample."""
    g, w = got.view(np.int32).astype(np.int64), want.view(np.int32).astype(np.int64)
    bad = np.argwhere(g != w)
    out = {"cells": int(g.size), "mismatches": int(len(bad))}
    if len(bad):
        out["max_ulp"] = int(np.abs(g - w).max())
        out["examples"] = [{"at": [int(i) for i in idx], "got": float(got[tuple(idx)]),
                            "model": float(want[tuple(idx)])} for idx in bad[:5]]
    return out


def _operand_sets(rng: np.random.Generator) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    m, n, k = 64, 128, 1024
    sets = {"all codes": (rng.choice(FINITE_CODES, (m, k)), rng.choice(FINITE_CODES, (n, k)))}
    small = FINITE_CODES[(FINITE_CODES & 0x78) <= 0x30]
    sets["small + subnormal"] = (rng.choice(small, (m, k)), rng.choice(FINITE_CODES, (n, k)))
    vec_a = np.zeros((64, 1024), dtype=np.uint8)
    vec_a[:, :128], vec_a[:, 128:256] = 0x78, 0x38
    sets["spec promotion vector"] = (vec_a, np.full((128, 1024), 0x38, dtype=np.uint8))
    cancel = rng.choice(FINITE_CODES, (m, k))
    cancel[:, 1::2] = cancel[:, ::2] ^ 0x80
    sets["cancelling pairs"] = (cancel, np.repeat(rng.choice(FINITE_CODES, (n, k // 2)), 2, axis=1))
    return {name: (a.astype(np.uint8), b.astype(np.uint8)) for name, (a, b) in sets.items()}


def _scaled_mm_windows(a: torch.Tensor, b: torch.Tensor, fast: bool, window: int = WINDOW_K) -> torch.Tensor:
    one = torch.ones((), device=a.device)
    total = torch.zeros((a.shape[0], b.shape[0]), dtype=torch.float32, device=a.device)
    for k0 in range(0, a.shape[1], window):
        part = torch._scaled_mm(a[:, k0:k0 + window].contiguous(), b[:, k0:k0 + window].contiguous().T,
                                scale_a=one, scale_b=one, out_dtype=torch.float32, use_fast_accum=fast)
        total = total + part
    return total


def check_gemm() -> dict:
    rng = np.random.default_rng(0)
    out: dict = {}
    for name, (a_np, b_np) in _operand_sets(rng).items():
        a = torch.from_numpy(a_np).to(DEVICE).view(torch.float8_e4m3fn)
        b = torch.from_numpy(b_np).to(DEVICE).view(torch.float8_e4m3fn)
        model = fp8_matmul("hopper", a_np, b_np)
        row = _impl_rows(lambda impl: matmul(a, b, impl), model)
        for label, fn in (("scaled_mm per window, fast_accum", lambda: _scaled_mm_windows(a, b, True)),
                          ("scaled_mm per window, no fast_accum", lambda: _scaled_mm_windows(a, b, False)),
                          ("scaled_mm whole k, fast_accum", lambda: _scaled_mm_windows(a, b, True, a.shape[1]))):
            try:
                row[label] = _compare(fn().cpu().numpy(), model)
            except Exception as exc:  # a formulation torch does not support here
                row[label] = {"error": repr(exc)}
        out[name] = row
    e = rng.choice(FINITE_CODES, (256, 32)).astype(np.uint8)
    f = rng.choice(FINITE_CODES, (512, 32)).astype(np.uint8)
    e_dev = torch.from_numpy(e).to(DEVICE).view(torch.float8_e4m3fn)
    f_dev = torch.from_numpy(f).to(DEVICE).view(torch.float8_e4m3fn)
    out["noise dot K=32"] = _impl_rows(lambda impl: matmul(e_dev, f_dev, impl), fp8_matmul("hopper", e, f))
    bounds = [0, 5, 5, 37, 64]  # an empty expert, tails shorter than any tile
    a_np = rng.choice(FINITE_CODES, (64, 1024)).astype(np.uint8)
    b_np = rng.choice(FINITE_CODES, (4, 128, 1024)).astype(np.uint8)
    model = np.concatenate([fp8_matmul("hopper", a_np[lo:hi], b_np[w]) if hi > lo else np.zeros((0, 128), np.float32)
                            for w, (lo, hi) in enumerate(zip(bounds, bounds[1:]))])
    table = RoutingTable(torch.arange(64, dtype=torch.int32, device=DEVICE),
                         torch.tensor(bounds, dtype=torch.int32, device=DEVICE))
    a_dev = torch.from_numpy(a_np).to(DEVICE).view(torch.float8_e4m3fn)
    b_dev = torch.from_numpy(b_np).to(DEVICE).view(torch.float8_e4m3fn)
    out["grouped, uneven experts"] = _impl_rows(lambda impl: grouped_matmul(a_dev, b_dev, table, impl), model)
    out["default implementation"] = gemm_impl()
    return out


def _impl_rows(run, model: np.ndarray) -> dict:
    """Each mined-GEMM implementation's bitwise comparison with the model (or its error)."""
    rows = {}
    for impl in IMPLS:
        try:
            rows[impl] = _compare(run(impl).cpu().numpy(), model)
        except Exception as exc:  # e.g. the CuTe GEMM is not importable here
            rows[impl] = {"error": repr(exc)}
    return rows


def synthetic_chain(bits: int = 0x1D00FFFF) -> tuple[bytes, list[bytes]]:
    """A proposed 76-byte header σ̂ on top of four made-up ancestors (returned parent first):
    the job input of every check and test that needs a V4 job without a node."""
    from proof.chain import BlockHeader, sha256d
    headers, prev = [], bytes(32)
    for i in range(4):
        header = BlockHeader(1, prev, bytes([i]) * 32, 1_700_000_000 + i, bits, bytes([i + 1]) * 32).to_bytes()
        headers.append(header)
        prev = sha256d(header)
    return BlockHeader(1, prev, b"\x99" * 32, 1_700_000_100, bits).incomplete_bytes(), headers[::-1]


def _uniform_topk(tokens: int, top_k: int, experts: int) -> torch.Tensor:
    """Every expert gets tokens·top_k/e rows; a token's experts are distinct."""
    ids = (torch.arange(tokens)[:, None] * top_k + torch.arange(top_k)[None, :]) % experts
    return ids.to(DEVICE)


def _setup(experts: int, n_e: int, k: int, tokens: int, top_k: int, seed: int, target: int = 0,
           lagged: bool = False):
    torch.manual_seed(seed)
    weights = (torch.randn(experts, n_e, k, device=DEVICE) * 0.05).to(torch.bfloat16)
    gemm = MinedGemm(weights, m=tokens, top_k=top_k if experts > 1 else 1, layer_id=1, lagged=lagged)
    header, ancestors = synthetic_chain()
    gemm.set_job(header, ancestors, target)
    x = torch.randn(tokens, k, device=DEVICE).to(torch.bfloat16)
    topk = _uniform_topk(tokens, top_k, experts) if experts > 1 else None
    return gemm, weights, x, topk, header


def _stage_report(gemm: MinedGemm, x: torch.Tensor, result) -> dict:
    a = result.a
    report = {}
    x_np = x.float().cpu().numpy()
    codes, scales = ref_prequant.prequantize(x_np)
    report["planes"] = bool(np.array_equal(a.codes.cpu().numpy(), codes) and np.array_equal(_u16(a.scales), scales))
    values = ref_prequant.open_values(codes, scales)
    l2, linf = ref_prequant.row_norms(codes, scales)
    seed_a = bytes(a.seed_a.view(torch.uint8).view(-1).cpu().tolist())
    seed_b = bytes(gemm.state.seed_b.view(torch.uint8).view(-1).cpu().tolist())
    e_lines = ref_noise.noise_lines(seed_a, "A", "E", np.arange(x.shape[0]))
    f_lines = ref_noise.noise_lines(seed_b, "A", "F", np.arange(x.shape[1]))
    report["E_A lines"] = bool(np.array_equal(_codes(a.side.e_lines), e_lines))
    report["F_A lines"] = bool(np.array_equal(_codes(gemm.state.f_a), f_lines))
    ref = ref_quant.noisy_quantize("hopper", values, l2, linf, e_lines, f_lines)
    report["alpha"] = bool(np.array_equal(_u16(a.side.alpha), ref.alpha))
    report["beta"] = bool(np.array_equal(_u16(a.side.beta), ref.beta))
    report["A' codes"] = _compare(_codes(a.side.token_codes()).view(np.int8).astype(np.float32),
                                  ref.codes.view(np.int8).astype(np.float32))
    table = result.table
    b_codes = _codes(gemm.state.side.codes).reshape(gemm.b.experts, gemm.b.n_e, -1)
    a_rows = ref.codes[table.rflat.cpu().numpy()] if gemm.moe else ref.codes
    acc = result.acc.cpu().numpy()
    start, acc_report = 0, {"cells": 0, "mismatches": 0}
    for expert, end in enumerate(table.offsets.cpu().tolist()):
        if end > start:
            part = _compare(acc[start:end], fp8_matmul("hopper", a_rows[start:end], b_codes[expert]))
            acc_report["cells"] += part["cells"]
            acc_report["mismatches"] += part["mismatches"]
        start = end
    report["accumulator"] = acc_report
    tiles = row_tiles(table)
    tickets = torch.zeros((tiles.row_start.shape[0], acc.shape[1] // 64, 8), dtype=torch.int32, device=DEVICE)
    gemm.latch.run(result.acc, tiles, a.pow_key, gemm.threshold, gemm.state.seed_b, {}, tickets=tickets)
    pow_key = bytes(a.pow_key.view(torch.uint8).view(-1).cpu().tolist())
    tickets_np = tickets.cpu().numpy()
    bad = total = 0
    for slot, row0 in enumerate(tiles.row_start.cpu().tolist()):
        if row0 < 0:
            continue
        for col in range(acc.shape[1] // 64):
            message = ref_lottery.fold_message(acc[row0:row0 + 4, 64 * col:64 * col + 64],
                                               TILE_4X64.row_pattern, TILE_4X64.col_pattern)
            total += 1
            bad += tickets_np[slot, col].astype("<i4").tobytes() != ref_lottery.ticket_with_key(pow_key, message)
    report["tickets"] = {"tiles": total, "mismatches": int(bad)}
    codes, b_dev = gemm.expert_rows(a.side, table), gemm.b_codes()
    if fold_in_gemm(codes.shape[0], b_dev):
        report["epilogue-folded tickets"] = _folded_tickets(codes, b_dev, table, tiles, a.pow_key, gemm, tickets_np)
    return report


def _folded_tickets(codes, b_codes, table: RoutingTable, tiles, pow_key, gemm: MinedGemm,
                    want: np.ndarray) -> dict:
    """Tickets drawn from the GEMM epilogue's folded lanes against the lottery pass's (`want`,
    checked against proof.fp8 above), into a latch of their own (a planted target may win)."""
    latch = LotteryLatch(DEVICE, {})
    lanes = folded_lanes(codes.shape[0], b_codes.shape[1], codes.device)
    grouped_matmul(codes, b_codes, table, fold_into=lanes)
    got = torch.zeros_like(torch.from_numpy(want)).to(DEVICE)
    latch.run_folded(lanes, tiles, pow_key, gemm.threshold, gemm.state.seed_b, {}, tickets=got)
    live = tiles.row_start.cpu().numpy() >= 0
    bad = int((got.cpu().numpy()[live] != want[live]).any(axis=2).sum())
    return {"tiles": int(live.sum()) * want.shape[1], "mismatches": bad}


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def check_stages() -> dict:
    out = {}
    # 200 rows: the A side's prefill-sized paths (the row kernel a program per 4 rows, E_A in a
    # launch of its own) beside the decode-sized 32
    for name, args in (("dense", (1, 256, 1024, 32, 1)), ("moe", (4, 128, 1024, 32, 2)),
                       ("dense 200 rows", (1, 256, 1024, 200, 1))):
        gemm, _, x, topk, _ = _setup(*args, seed=3)
        # the fp32 accumulator, checked against the model (the peel epilogue keeps none: compared after)
        with _switched("BF16_FOLDED_ACC", False), _switched("PEEL_IN_EPILOGUE", False):
            out[name] = _checked_stages(gemm, x, topk)
    return out


def _checked_stages(gemm: MinedGemm, x: torch.Tensor, topk) -> dict:
    """`_stage_report` of one pass, then each switched variant that applies against it."""
    result = gemm.forward(x, topk)
    _sync()
    out = _stage_report(gemm, x, result)
    rows = result.table.rflat.shape[0]
    if fold_in_gemm(rows, gemm.b_codes()):
        out["bf16 accumulator"] = _bf16_acc_report(gemm, x, topk, result)
    if _would("PEEL_IN_EPILOGUE", peel_in_gemm, rows, gemm.b_codes()):
        out["peel in the epilogue vs the peel pass"] = _epilogue_peel_error(gemm, x, topk, result)
    if gemm.moe:
        gathered = _forward_switched(gemm, x, topk, "A_IN_EXPERT_ORDER", False)
        out["A′ written in expert order: accumulator and output bitwise those of gathered rows"] = bool(
            result.a.side.positions is not None and gathered.a.side.positions is None
            and torch.equal(gathered.acc.view(torch.int32), result.acc.view(torch.int32))
            and torch.equal(gathered.out.view(torch.int16), result.out.view(torch.int16)))
    if gemm.moe and _would("GATHER_IN_GEMM", gather_in_gemm, rows, gemm.b_codes()):
        flipped = _forward_switched(gemm, x, topk, "GATHER_IN_GEMM", not matmul_module.GATHER_IN_GEMM)
        out["A′ token rows gathered by the GEMM or expert-order rows by TMA: output bitwise equal"] = bool(
            _bitwise_equal(flipped.acc, result.acc)
            and torch.equal(flipped.out.view(torch.int16), result.out.view(torch.int16)))
    return out


def _bf16_acc_report(gemm: MinedGemm, x: torch.Tensor, topk, result) -> dict:
    """The pass with `BF16_FOLDED_ACC` on against `result` (fp32 accumulator, the same inputs):
    its accumulator is the fp32 one rounded to nearest even, bit for bit, and how far the output
    moves."""
    rounded = _forward_switched(gemm, x, topk, "BF16_FOLDED_ACC", True)
    want = result.acc.to(torch.bfloat16)
    moved = (rounded.out.float() - result.out.float()).norm() / result.out.float().norm()
    return {"dtype": str(rounded.acc.dtype),
            "bitwise the fp32 accumulator rounded": bool(rounded.acc.dtype == torch.bfloat16 and torch.equal(
                rounded.acc.view(torch.int16), want.view(torch.int16))),
            "output relative change": float(moved)}


def _epilogue_peel_error(gemm: MinedGemm, x: torch.Tensor, topk, result) -> dict:
    """The same pass with the peel in the GEMM's epilogue against the peel pass's output."""
    return _output_diff(_forward_switched(gemm, x, topk, "PEEL_IN_EPILOGUE", True).out, result.out)


def _output_diff(got: torch.Tensor, want: torch.Tensor) -> dict:
    """How far one bf16 output is from another: max abs difference and the cells beyond two bf16
    steps of the wanted value."""
    diff = (got.float() - want.float()).abs()
    return {"max abs diff": float(diff.max()), "max |want|": float(want.float().abs().max()),
            "cells beyond 2 bf16 steps": int((diff > 2 ** -7 * want.float().abs() + 1e-30).sum())}


@contextlib.contextmanager
def _switched(switch: str, value: bool):
    """A module switch (matmul's FOLD_IN_EPILOGUE, PEEL_IN_EPILOGUE, GATHER_IN_GEMM,
    BF16_FOLDED_ACC; pipeline's A_IN_EXPERT_ORDER, LAGGED_FOLD, LAGGED_COMPACT_ACC, LAGGED_PEEL_POLLS)
    set to `value` for the block: the other variant, for comparisons and timing."""
    module = _switch_module(switch)
    before = getattr(module, switch)
    setattr(module, switch, value)
    try:
        yield
    finally:
        setattr(module, switch, before)


def _switch_module(switch: str):
    return next(m for m in (matmul_module, pipeline_module) if hasattr(m, switch))


def _forward_switched(gemm: MinedGemm, x: torch.Tensor, topk, switch: str, value: bool):
    """One same-launch pass with a switch (`_switched`) set to `value`."""
    with _switched(switch, value):
        return gemm.forward(x, topk)


def _would(switch: str, applies, rows: int, b_codes: torch.Tensor) -> bool:
    """Whether the pass would take a switched variant (`applies`: peel_in_gemm, gather_in_gemm)
    with the `matmul` switch on."""
    with _switched(switch, True):
        return applies(rows, b_codes)


def check_planted() -> dict:
    out = {}
    # the prefill-sized launch (256 rows an expert) peels in its GEMM (`matmul.peel_in_gemm`)
    for name, args in (("dense", (1, 128, 1024, 16, 1)), ("moe", (4, 128, 1024, 32, 2)),
                       ("moe prefill-sized", (4, 128, 1024, 512, 2))):
        gemm, _, x, topk, header = _setup(*args, seed=5)
        with _switched("PEEL_IN_EPILOGUE", False):  # every ticket, from the fp32 accumulator
            first = _forward_switched(gemm, x, topk, "BF16_FOLDED_ACC", False)
        planted, ticket, target = _lowest_ticket(gemm, first.table, first.acc, first.a.pow_key)
        _, ancestors = synthetic_chain()
        gemm.set_job(header, ancestors, target)
        gemm.forward(x, topk)
        _sync()
        out[name] = _winner_report(take_winner(gemm), planted, ticket, header, target)
    return out


def _winner_report(winner, planted: tuple, ticket: bytes, header: bytes, target: int) -> dict:
    """A taken winner against the planted tile: its record, ticket, proof and jackpot."""
    if winner is None:
        return {"planted": list(planted), "record": None}
    record = winner.record
    return {"planted": list(planted), "record": [record.group_id, record.tile_row, record.tile_column],
            "ticket matches": record.ticket == ticket,
            "verify": list(verify_plain_proof(header, winner.proof, target=target)),
            "verifier jackpot matches": evaluate_plain_proof(header, winner.proof).jackpot == ticket}


def _captured(gemm: MinedGemm, static_x: torch.Tensor, static_topk: torch.Tensor):
    """(graph, its result views): the pass warmed up twice, then captured on the static inputs."""
    for _ in range(2):
        gemm.forward(static_x, static_topk)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = gemm.forward(static_x, static_topk)
    return graph, captured


def check_graph() -> dict:
    return {**_check_graph_same_launch(32, 512, 2048, 64, 8),
            "prefill-sized (the peel in the GEMM)": _check_graph_same_launch(8, 256, 1024, 1024, 2),
            "lagged": _check_graph_lagged()}


def _check_graph_same_launch(experts: int, n_e: int, k: int, tokens: int, top_k: int) -> dict:
    """The same-launch pass captured, replayed on new activations and routing, against eager."""
    gemm, _, x, topk, _ = _setup(experts, n_e, k, tokens, top_k, seed=7)
    static_x, static_topk = x.clone(), topk.clone()
    graph, captured = _captured(gemm, static_x, static_topk)
    new_x = torch.randn_like(x.float()).to(torch.bfloat16)
    new_topk = _uniform_topk(x.shape[0], top_k, experts).roll(1, 0)
    static_x.copy_(new_x)
    static_topk.copy_(new_topk)
    graph.replay()
    torch.cuda.synchronize()
    eager = gemm.forward(new_x, new_topk)
    torch.cuda.synchronize()
    return {"captured": True, "peels in the GEMM": captured.acc is None,
            "acc bitwise equal": _bitwise_equal(captured.acc, eager.acc),
            "out bitwise equal": bool(torch.equal(captured.out.view(torch.int16), eager.out.view(torch.int16)))}


def _bitwise_equal(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Two accumulators bitwise equal, or both absent (a pass that peels in its GEMM keeps none)."""
    if a is None or b is None:
        return a is None and b is None
    return a.dtype == b.dtype and bool(torch.equal(a.view(torch.int16), b.view(torch.int16)))


def _ready_target(gemm: MinedGemm, x_a, topk_a, x_b, topk_b) -> tuple[tuple, bytes, int]:
    """Eagerly: launch A then launch B; every ticket of A's rows (B's GEMM hashed them into
    MINED) → the lowest tile, its ticket and the target at which only it wins."""
    first = gemm.forward(x_a, topk_a)
    gemm.forward(x_b, topk_b)
    return _lowest_ticket(gemm, first.table, gemm.mined.acc, first.a.pow_key)


def _lowest_ticket(gemm: MinedGemm, table: RoutingTable, acc: torch.Tensor,
                   pow_key: torch.Tensor) -> tuple[tuple, bytes, int]:
    """Every ticket of the table's lottery tiles in acc (fp32 rows, or (rows // 4, n / 64, 16)
    folded lanes) → the lowest tile (expert, local tile, column tile), its ticket and the target
    at which only it wins."""
    tiles = row_tiles(table)
    folded = acc.dim() == 3
    tickets = torch.zeros((tiles.row_start.shape[0], acc.shape[1] // (1 if folded else 64), 8), dtype=torch.int32,
                          device=DEVICE)
    draw = gemm.latch.run_folded if folded else gemm.latch.run
    draw(acc, tiles, pow_key, gemm.threshold, gemm.state.seed_b, {}, tickets=tickets)
    values = {}
    slots = zip(tiles.row_start.tolist(), tiles.expert.tolist(), tiles.local.tolist())
    for slot, (row0, expert, local) in enumerate(slots):
        if row0 >= 0:
            for col in range(tickets.shape[1]):
                values[(expert, local, col)] = tickets[slot, col].cpu().numpy().astype("<i4").tobytes()
    planted, ticket = min(values.items(), key=lambda kv: int.from_bytes(kv[1], "little"))
    return planted, ticket, -(-int.from_bytes(ticket, "little") // (4 * 64 * gemm.b.k))


# The lagged pass's switches timed against the default pass (the other form of each, where the
# default is the compact store): `timing`'s "mined lagged with SWITCH=value".
LAGGED_SWITCHES = ("LAGGED_COMPACT_ACC", "LAGGED_PEEL_POLLS")


def _lagged_variants(lag: MinedGemm, weights: torch.Tensor, x: torch.Tensor, topk,
                     header: bytes) -> tuple[dict, dict]:
    """({"SWITCH=value": the lagged pass built with that switch flipped, warmed up by one launch},
    {"SWITCH=value": why it could not be}): a variant that fails (never run on a GPU before, as
    the polling peel) is reported beside the default pass's numbers instead of losing them."""
    variants, errors = {}, {}
    for switch in LAGGED_SWITCHES:
        value = not getattr(pipeline_module, switch)
        label = f"{switch}={value}"
        try:
            with _switched(switch, value):
                variant = MinedGemm(weights, m=lag.m, top_k=lag.top_k, layer_id=1, lagged=True)
            variant.set_job(header, synthetic_chain()[1], 0)
            variant.forward(x, topk)
            if x.is_cuda:
                torch.cuda.synchronize()  # a fault of the variant's kernels surfaces here, under its label
            variants[label] = variant
        except Exception as exc:
            errors[label] = repr(exc)
    return variants, errors


def _variant_timelines(name: str, variants: dict, errors: dict, x: torch.Tensor, topk) -> dict:
    """Four-replay timelines of each lagged variant, each failure (errors: those that could not be
    built) reported under its own key."""
    from kernels.timeline import kernel_timeline, timeline_entry
    out = {f"{name}, lagged with {label}": {"error": error} for label, error in errors.items()}
    for label, variant in variants.items():
        try:
            out[f"{name}, lagged with {label}"] = timeline_entry(
                kernel_timeline(functools.partial(variant.forward, x, topk), replays=4))
        except Exception as exc:
            out[f"{name}, lagged with {label}"] = {"error": repr(exc)}
    return out


def _check_graph_lagged() -> dict:
    """The lagged decode pass in a CUDA graph: replays 1 and 2 (after set_job) publish nothing,
    replay 2's GEMM hashes replay 1's rows and replay 3 runs their lottery — its planted winner
    verifies; replay 2 equals the eager launch."""
    gemm, _, x_a, topk_a, header = _setup(32, 512, 2048, 64, 8, seed=9, lagged=True)
    x_b = torch.randn_like(x_a.float()).to(torch.bfloat16)
    topk_b = _uniform_topk(x_a.shape[0], 8, 32).roll(3, 0)
    planted, ticket, target = _ready_target(gemm, x_a, topk_a, x_b, topk_b)
    _, ancestors = synthetic_chain()
    gemm.set_job(header, ancestors, target)
    static_x, static_topk = x_a.clone(), topk_a.clone()
    graph, captured = _captured(gemm, static_x, static_topk)
    gemm.set_job(header, ancestors, target)  # the warm-up rows are not mined: replay 1 is a first launch
    gemm.latch.reset()
    graph.replay()
    torch.cuda.synchronize()
    out: dict = {"replay 1 mines nothing": gemm.latch.poll() is None}
    static_x.copy_(x_b)
    static_topk.copy_(topk_b)
    graph.replay()
    torch.cuda.synchronize()
    out["replay 2 publishes nothing"] = gemm.latch.poll() is None
    replayed = (captured.acc.clone(), captured.out.clone())
    graph.replay()
    torch.cuda.synchronize()
    out["replay 3 winner"] = _winner_report(take_winner(gemm), planted, ticket, header, target)
    gemm.set_job(header, ancestors, target)
    gemm.latch.reset()
    gemm.forward(x_a, topk_a)
    eager = gemm.forward(x_b, topk_b)
    torch.cuda.synchronize()
    out["acc bitwise equal"] = _bitwise_equal(replayed[0], eager.acc)
    out["out bitwise equal"] = bool(torch.equal(replayed[1].view(torch.int16), eager.out.view(torch.int16)))
    return out


TIMED = [  # (name, experts, n_e, k, tokens, top_k): rows per expert = tokens·top_k / experts
    ("GLM-5 FC1 decode 32x16", 32, 4096, 6144, 64, 8),
    ("DeepSeek-V3 FC1 decode 32x16", 32, 4096, 7168, 64, 8),
    ("GLM-5 FC1 prefill 32x2048", 32, 4096, 6144, 8192, 8),
]


def _unmined(xq, wq, offsets, xs, ws):
    try:
        from kernels.grouped_gemm import grouped_gemm
        grouped_gemm(xq, wq, offsets, x_scale=xs, w_scale=ws)
        return "kernels.grouped_gemm fp8 -> bf16", lambda: grouped_gemm(xq, wq, offsets, x_scale=xs, w_scale=ws)
    except Exception:
        offs = offsets[1:].contiguous()
        wt = wq.transpose(-2, -1)
        return "torch._scaled_grouped_mm", lambda: torch._scaled_grouped_mm(
            xq, wt, xs, ws, offs=offs, out_dtype=torch.bfloat16)


def _parts(gemm: MinedGemm, x: torch.Tensor, topk, result) -> dict:
    """Where the mined pass spends its time: each stage alone, as a graph of one call."""
    from .peel import a_peel, peel_and_unscale
    from .pipeline import prepare_a
    if result.acc is None:  # the default peeled in its GEMM: the parts of the pass that keeps an accumulator
        result = _forward_switched(gemm, x, topk, "PEEL_IN_EPILOGUE", False)
    state, table, a = gemm.state, result.table, result.a
    codes, b_codes = gemm.expert_rows(a.side, table), gemm.b_codes()
    token_codes = a.side.token_codes()
    with _switched("PEEL_IN_EPILOGUE", False):  # what the lottery pass reads: an fp32 accumulator
        acc32 = result.acc if result.acc.dtype == torch.float32 else \
            _forward_switched(gemm, x, topk, "BF16_FOLDED_ACC", False).acc
    peel_args = (a_peel(a.side, state.f_b), a.side.alpha, state.peel.view(gemm.b.experts, gemm.b.n_e, -1),
                 state.side.alpha.view(gemm.b.experts, gemm.b.n_e), table)
    sources = {"codes": a.codes, "scales": a.scales, "rflat": table.rflat, "offsets": table.offsets}
    stages = {
        **({"routing table": lambda: routing_table(topk, gemm.b.experts)} if gemm.moe else {}),
        "A side": lambda: prepare_a(quant.prepare_rows(x), gemm.seed_message, gemm.p_a_len, state,
                                    table if gemm.moe else None, in_expert_order=a.side.positions is not None),
        "A peel": lambda: a_peel(a.side, state.f_b, state.f_b_t),
        "A' token rows gathered into expert order": lambda: token_codes.index_select(0, table.rflat),
        **{f"GEMM ({impl})": functools.partial(grouped_matmul, codes, b_codes, table, impl) for impl in IMPLS},
        "lottery tile map + lottery": lambda: gemm.latch.run(acc32, row_tiles(table), a.pow_key,
                                                             gemm.threshold, state.seed_b, {}),
        **_folded_parts(gemm, codes, b_codes, table, a.pow_key),
        **_peel_epilogue_parts(gemm, codes, b_codes, table, a),
        f"peel + unscale ({str(result.acc.dtype).removeprefix('torch.')} accumulator)": functools.partial(
            peel_and_unscale, result.acc, *peel_args),
        **({"peel + unscale (float32 accumulator)": functools.partial(peel_and_unscale, acc32, *peel_args)}
           if acc32 is not result.acc else {}),
        "payload capture + publish": lambda: (gemm.latch.capture(sources), gemm.latch.publish()),
    }
    return _time_each(stages)


def _folded_parts(gemm: MinedGemm, codes, b_codes, table: RoutingTable, pow_key) -> dict:
    """The GEMM that folds in its epilogue and the lottery on its lanes (where the config fits)."""
    if not fold_in_gemm(codes.shape[0], b_codes):
        return {}
    lanes = folded_lanes(codes.shape[0], b_codes.shape[1], codes.device)
    tiles = row_tiles(table)

    def fp32_acc():
        with _switched("BF16_FOLDED_ACC", False):
            grouped_matmul(codes, b_codes, table, fold_into=lanes)

    return {"GEMM folding the lottery tiles": lambda: grouped_matmul(codes, b_codes, table, fold_into=lanes),
            "GEMM folding the lottery tiles, fp32 accumulator stored": fp32_acc,
            "lottery on the folded lanes": lambda: gemm.latch.run_folded(lanes, tiles, pow_key, gemm.threshold,
                                                                         gemm.state.seed_b, {})}


def _peel_epilogue_parts(gemm: MinedGemm, codes, b_codes, table: RoutingTable, a) -> dict:
    """The GEMM that also peels in its epilogue, alone, at the selector's tile and at 64-row
    pingpong tiles, beside the folding GEMM at those tiles: what the peel tile and the unscale
    cost the GEMM (`PEEL_IN_EPILOGUE` is off for it). Its operands: the expert-order A′ rows
    copied into rows with tails, and the job's B′ rows (which carry theirs)."""
    from kernels.grouped_gemm_config import GroupedGemmConfig
    from .fold_epilogue import fold_config, folded_grouped_gemm
    from .peel import TAIL_BYTES, a_peel, padded_rows, write_tails
    from .peel_epilogue import peel_fits, peeled_grouped_gemm
    rows, (experts, n_e, k) = codes.shape[0], b_codes.shape
    default = fold_config(rows, *b_codes.shape)
    if default is None:
        return {}
    state = gemm.state
    lanes = folded_lanes(rows, n_e, codes.device)
    acc = torch.empty((rows, n_e), dtype=torch.bfloat16, device=codes.device)
    out = torch.empty_like(acc)
    padded_a = torch.empty((rows, k + TAIL_BYTES), dtype=torch.uint8, device=codes.device)
    padded_a[:, :k] = codes.view(torch.uint8)
    token = table.rflat.long()
    side = quant.NoisySide(padded_a[:, :k].view(torch.float8_e4m3fn), a.side.alpha[token], a.side.beta[token],
                           a.side.e_lines[token])
    padded_a, inv_alpha_rows = write_tails(side, a_peel(a.side, state.f_b, state.f_b_t)[token])
    padded_a = padded_a.view(torch.float8_e4m3fn)
    padded_b = padded_rows(state.side.codes).view(experts, n_e, k + TAIL_BYTES).view(torch.float8_e4m3fn)
    parts = {}
    for config in dict.fromkeys([default, GroupedGemmConfig(64, 128, 128, pingpong=True)]):
        if not peel_fits(config, n_e, k):
            continue
        parts[f"GEMM folding, {config.key}"] = functools.partial(
            folded_grouped_gemm, codes, b_codes, table.bounds, acc, lanes, config)
        parts[f"GEMM folding and peeling in its epilogue, {config.key}"] = functools.partial(
            peeled_grouped_gemm, padded_a, padded_b, table.bounds, out, lanes, inv_alpha_rows,
            state.inv_alpha.view(experts, n_e), config)
    return parts


def _time_each(stages: dict) -> dict:
    """Median µs of each callable alone (a CUDA graph of one call, L2 flushed), or its error."""
    from kernels.timing import time_methods
    timings = time_methods({name: [fn] for name, fn in stages.items()}, target_ms=10.0, replays=3)
    return {name: repr(t) if isinstance(t, Exception) else t.median_us for name, t in timings.items()}


def _a_side_stages(gemm: MinedGemm, x: torch.Tensor, table: RoutingTable) -> dict:
    """Each stage of `prepare_a` alone, on the intermediates of one eager A side (same order)."""
    from . import noise, noisy_kernel, prequant, transcript
    from .peel import a_peel
    state = gemm.state
    codes, scales, values = prequant.prequantize_and_open(x)
    l2, linf = prequant.row_norms(codes, scales)
    key_a = transcript.key_a_of(gemm.seed_message)
    planes = [codes, scales] + ([table.rflat, table.offsets] if gemm.moe else [])
    roots = transcript.plane_roots(key_a, planes)
    routing = (roots[2], roots[3]) if gemm.moe else None
    keys = transcript.launch_keys(gemm.seed_message, gemm.p_a_len, (roots[0], roots[1]), routing)
    e_a = noise.noise_lines(keys[2:3], "A", "E", x.shape[0])
    noise_dot = matmul(e_a, state.f_a)
    alpha, beta = quant.row_scales(l2, linf)
    side = quant.NoisySide(noisy_kernel.noisy_codes(alpha, beta, x, noise_dot), alpha, beta, e_a)
    committed = noisy_kernel.Planes(codes, scales)
    stages = {
        "rows, one launch (planes, norms, α, β)": lambda: quant.prepare_rows(x),
        "prequant + open": lambda: prequant.prequantize_and_open(x),
        "row norms": lambda: prequant.row_norms(codes, scales),
        "plane trees (all, plane_roots)": lambda: transcript.plane_roots(key_a, planes),
        **{f"tree {name} alone (int7 keyed_trees, for comparison)":
           functools.partial(transcript.tree_root, key_a, plane)
           for name, plane in zip(("codes", "scales", "Rflat", "offsets"), planes)},
        "launch keys": lambda: transcript.launch_keys(gemm.seed_message, gemm.p_a_len, (roots[0], roots[1]), routing),
        "noise lines E_A": lambda: noise.noise_lines(keys[2:3], "A", "E", x.shape[0]),
        **{f"noise dot E_A F_A (GEMM k=32, {impl})": functools.partial(matmul, e_a, state.f_a, impl)
           for impl in IMPLS},
        "row scales": lambda: quant.row_scales(l2, linf),
        "noisy codes": lambda: noisy_kernel.noisy_codes(alpha, beta, x, noise_dot),
        "noisy codes, E·F dot in the launch": lambda: noisy_kernel.noisy_codes_of_lines(
            alpha, beta, values, e_a, state.f_a),
        "same, X opened from the planes": lambda: noisy_kernel.noisy_codes_of_lines(
            alpha, beta, committed, e_a, state.f_a),
        **({"same, written into expert order": lambda: noisy_kernel.noisy_codes_of_lines(
            alpha, beta, values, e_a, state.f_a, table.positions),
            "same, into expert order, X opened from the planes": lambda: noisy_kernel.noisy_codes_of_lines(
            alpha, beta, committed, e_a, state.f_a, table.positions)} if gemm.moe else {}),
        "A peel": lambda: a_peel(side, state.f_b, state.f_b_t),
    }
    return _time_each(stages)


def _median_us(timing) -> float:
    """A Timing's median, or the error that kept the method from running."""
    if isinstance(timing, Exception):
        raise timing
    return timing.median_us


def _lagged_parts(gemm: MinedGemm, x: torch.Tensor, topk, result) -> dict:
    """Where the lagged pass spends its time, each stage alone (same method as `_parts`).
    Serving stream: the front (routing, clean quantization and combined operand, one launch at
    MoE decode), GEMM (its tile counter's reset included: this stage is not comparable with
    sessions before 23), peel of the clean rows, and the peel carrying MINED's folded take (the
    pass's form); side stream: READY's tail ← PENDING's, clean A peel, the lottery over MINED +
    payload + publish, the A side and PENDING fill, MINED ← the READY rows by the take kernel
    (the form where the GEMM does not fold)."""
    from .peel import peel_and_unscale
    from .pipeline import prepare_a
    state, table, ready, mined = gemm.state, result.table, gemm.ready, gemm.mined
    routing = topk if gemm.moe else None
    operand = lagged_front(x, routing, gemm.b.experts, gemm.pending)
    a_peel_clean = clean_peel(operand, state.f_b, state.f_b_t)
    shift = None if gemm.compact_acc else ready.bounds[1:]  # the clean rows compact, or among READY's
    b_peel = state.peel.view(gemm.b.experts, gemm.b.n_e, -1)
    alpha_b = state.side.alpha.view(gemm.b.experts, gemm.b.n_e)

    def gemm_alone():  # the front zeroes the GEMM's tile counter in the pass
        operand.tile_counter.zero_()
        gemm._combined_gemm(operand)

    def side_a():
        a = prepare_a(quant.prepare_rows(x), gemm.seed_message, gemm.p_a_len, state, table if gemm.moe else None)
        gemm.pending.fill(a.side.codes, a.codes, a.scales, a.pow_key, table)

    stages = {
        "front: routing + clean quantization + combined operand": lambda: lagged_front(x, routing, gemm.b.experts,
                                                                                       gemm.pending),
        "side: READY tail <- PENDING tail": lambda: ready.tail().copy_(gemm.pending.tail()),
        "GEMM (combined rows; its tile counter zeroed first)": gemm_alone,
        "peel + unscale (clean rows)": lambda: peel_and_unscale(result.acc, a_peel_clean, operand.clean_alpha,
                                                                b_peel, alpha_b, table, row_shift=shift,
                                                                a_left_zero=True),
        "side: clean A peel": lambda: clean_peel(operand, state.f_b, state.f_b_t),
        "side: A side + PENDING fill": side_a,
        "side: lottery (MINED rows) + payload + publish": gemm._mine_previous,
        "side: MINED <- READY rows (after the GEMM)": lambda: mined.take(
            result.acc if gemm.ready_lanes is None else gemm.ready_lanes, ready, table.bounds),
    }
    if gemm.ready_lanes is not None:  # the pass's form: the take's copies ride the serving peel
        stages["peel + unscale (clean rows) + MINED's folded take, one launch"] = lambda: peel_and_unscale(
            result.acc, a_peel_clean, operand.clean_alpha, b_peel, alpha_b, table, row_shift=shift,
            a_left_zero=True, copies=mined.folded_copies(gemm.ready_lanes, ready))
    return _time_each(stages)


def _reference_error(out: torch.Tensor, x: torch.Tensor, weights: torch.Tensor, table: RoutingTable) -> float:
    """Relative Frobenius error of a pass's output (rows in `table`'s expert order) against the
    bf16 GEMM of the same rows."""
    rows = table.rflat.long()
    ref = torch.empty_like(out, dtype=torch.float32)
    start = 0
    for w, end in enumerate(table.offsets.tolist()):
        ref[start:end] = (x[rows[start:end]] @ weights[w].T).float()
        start = end
    return float((out.float() - ref).norm() / ref.norm())


def check_timing() -> dict:
    from kernels.timing import time_methods
    out = {}
    for name, experts, n_e, k, tokens, top_k in TIMED:
        entry: dict = {}
        try:
            gemm, weights, x, topk, header = _setup(experts, n_e, k, tokens, top_k, seed=11)
            result = gemm.forward(x, topk)
            entry["output rel err vs bf16"] = _reference_error(result.out, x, weights, result.table)
            rows = result.table.rflat.long()
            xq = x[rows].to(torch.float8_e4m3fn)
            wq = weights.to(torch.float8_e4m3fn)
            offsets = result.table.bounds
            xs = torch.ones(xq.shape[0], device=DEVICE)
            ws = torch.ones(experts, n_e, device=DEVICE)
            label, unmined = _unmined(xq, wq, offsets, xs, ws)
            methods = {"mined": [lambda: gemm.forward(x, topk)], "unmined": [unmined]}
            peeling = peel_in_gemm(xq.shape[0], gemm.b_codes())
            if peeling:  # the same pass with the peel pass after the GEMM
                methods["mined, peel pass"] = [
                    functools.partial(_forward_switched, gemm, x, topk, "PEEL_IN_EPILOGUE", False)]
            elif fold_in_gemm(xq.shape[0], gemm.b_codes()):  # the same pass, the lottery pass folding
                methods["mined, lottery pass"] = [
                    functools.partial(_forward_switched, gemm, x, topk, "FOLD_IN_EPILOGUE", False)]
                methods["mined, fp32 accumulator"] = [
                    functools.partial(_forward_switched, gemm, x, topk, "BF16_FOLDED_ACC", False)]
                entry["output rel err vs bf16, fp32 accumulator"] = _reference_error(
                    _forward_switched(gemm, x, topk, "BF16_FOLDED_ACC", False).out, x, weights, result.table)
            if gemm.moe:
                methods["mined, A′ gathered into expert order"] = [
                    functools.partial(_forward_switched, gemm, x, topk, "A_IN_EXPERT_ORDER", False)]
            if gemm.moe and _would("GATHER_IN_GEMM", gather_in_gemm, xq.shape[0], gemm.b_codes()):
                methods["mined, A′ read the other way by the GEMM"] = [
                    functools.partial(_forward_switched, gemm, x, topk, "GATHER_IN_GEMM",
                                      not matmul_module.GATHER_IN_GEMM)]
            lag = None
            if "decode" in name:  # lagged mining is the decode design (64-row tiles, ~16 rows an expert)
                lag = MinedGemm(weights, m=tokens, top_k=top_k, layer_id=1, lagged=True)
                lag.set_job(header, synthetic_chain()[1], 0)
                lag.forward(x, topk)
                lagged_result = lag.forward(x, topk)  # hashes the first launch's rows into MINED
                entry["lagged output rel err vs bf16"] = _reference_error(lagged_result.out, x, weights,
                                                                          lagged_result.table)
                methods["mined lagged"] = [lambda: lag.forward(x, topk)]
                variants, variant_errors = (_lagged_variants(lag, weights, x, topk, header) if lag.compact_acc
                                            else ({}, {}))
                entry.update({f"mined lagged with {label} error": error for label, error in variant_errors.items()})
                methods.update({f"mined lagged, {label}": [functools.partial(v.forward, x, topk)]
                                for label, v in variants.items()})
            timings = time_methods(methods, target_ms=20.0, replays=5)
            mined_us, base_us = _median_us(timings["mined"]), _median_us(timings["unmined"])
            entry.update({"GEMM implementation": gemm_impl(), "unmined": label,
                          "unmined median us": base_us, "mined median us": mined_us,
                          "mined graph": timings["mined"].graph, "slowdown": mined_us / base_us})
            if "mined, lottery pass" in timings:
                entry["mined with the lottery pass median us"] = _median_us(timings["mined, lottery pass"])
                entry["mined with the fp32 accumulator median us"] = _median_us(timings["mined, fp32 accumulator"])
            if "mined, A′ gathered into expert order" in timings:
                entry["mined with A′ gathered into expert order median us"] = _median_us(
                    timings["mined, A′ gathered into expert order"])
            if "mined, A′ read the other way by the GEMM" in timings:
                entry[f"mined with GATHER_IN_GEMM={not matmul_module.GATHER_IN_GEMM} median us"] = _median_us(
                    timings["mined, A′ read the other way by the GEMM"])
            if "mined, peel pass" in timings:
                entry["mined with the peel pass median us"] = _median_us(timings["mined, peel pass"])
            best = ("mined", mined_us)
            if lag is not None:
                lagged_us = _median_us(timings["mined lagged"])
                entry.update({"mined_pass_lagged_us": lagged_us, "lagged graph": timings["mined lagged"].graph,
                              "lagged slowdown": lagged_us / base_us})
                best = min(best, ("mined lagged", lagged_us), key=lambda kv: kv[1])
                for label in variants:
                    entry[f"mined lagged with {label} median us"] = _median_us(timings[f"mined lagged, {label}"])
            entry["acceptance"] = (f"{best[0]} {best[1]:.1f} us vs unmined {base_us:.1f} us: "
                                   f"{best[1] / base_us:.3f}x (target <= 1.10x; mined {mined_us:.1f} us"
                                   + (f", lagged {entry['mined_pass_lagged_us']:.1f} us)" if lag is not None else ")"))
            entry["parts median us"] = _parts(gemm, x, topk, result)
            entry["A side stages median us"] = _a_side_stages(gemm, x, result.table)
            if lag is not None:
                entry["lagged parts median us"] = _lagged_parts(lag, x, topk, lagged_result)
                for v in (lag, *variants.values()):
                    v.b.slots = [None, None]
            gemm.b.slots = [None, None]
        except Exception as exc:
            entry["error"] = repr(exc)
            entry["traceback"] = traceback.format_exc(limit=4)
        out[name] = entry
        print(name, entry.get("acceptance", entry.get("error")), flush=True)
        torch.cuda.empty_cache()
    return out


def check_timeline() -> dict:
    """Kernel timelines of four lagged decode replays, each LAGGED_SWITCHES variant's beside them
    (where its kernels end against the GEMM's), and two prefill replays (GLM-5 FC1)."""
    from kernels.timeline import kernel_timeline, timeline_entry
    out = {}
    for name, experts, n_e, k, tokens, top_k in (TIMED[0], TIMED[2]):
        lagged = "decode" in name
        gemm, weights, x, topk, header = _setup(experts, n_e, k, tokens, top_k, seed=11, lagged=lagged)
        spans = kernel_timeline(lambda: gemm.forward(x, topk), replays=4 if lagged else 2)
        out[f"{name}{', lagged' if lagged else ''}"] = timeline_entry(spans)
        variants, errors = _lagged_variants(gemm, weights, x, topk, header) if lagged and gemm.compact_acc \
            else ({}, {})
        out.update(_variant_timelines(name, variants, errors, x, topk))
        for pass_ in (gemm, *variants.values()):  # no B state is kept while the prefill pass is built
            pass_.b.slots = [None, None]
        variants.clear()
        torch.cuda.empty_cache()
    return out


SECTIONS = {"gemm": check_gemm, "stages": check_stages, "planted": check_planted,
            "graph": check_graph, "timing": check_timing, "timeline": check_timeline}


def _markdown(results: dict) -> str:
    lines = ["# fp8mine GPU check", ""]
    for name, value in results.items():
        lines += [f"## {name}", "", "```json", json.dumps(value, indent=1, default=str), "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="directory for results.json / results.md")
    parser.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated subset")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                        help="cpu: dry-run the stages/planted logic on the CPU backend (slow)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)  # the GEMM implementation choice is logged once
    args.out.mkdir(parents=True, exist_ok=True)
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 2
    name = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"
    results: dict = {"device": name, "torch": torch.__version__}
    for name in args.sections.split(","):
        started = time.time()
        try:
            results[name] = SECTIONS[name]()
        except Exception as exc:
            results[name] = {"error": repr(exc), "traceback": traceback.format_exc(limit=6)}
        results[name + " seconds"] = round(time.time() - started, 1)
        print(name, json.dumps(results[name], default=str)[:2000], flush=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=1, default=str))
        (args.out / "results.md").write_text(_markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
