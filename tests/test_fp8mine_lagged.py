"""Lagged mining (kernels.fp8mine.lagged, MinedGemm(lagged=True)) on the CPU backend.

Fast: the combined operand against a literal reference (READY rows copied, clean rows with the
per-token scale), the row-shifted peel against the unshifted one on a
compact accumulator, the slot layout, and an sm_90 compile of the new kernels. Slow (the Triton
interpreter hashes the planes): dense and MoE launch sequences — launch 1 mines nothing even when
every tile wins; launch 2's READY accumulator rows equal launch 1's non-lagged accumulator bit for
bit and its output is no less accurate than the non-lagged one; a planted winner on launch t's
rows (hashed by launch t+1's GEMM) is latched by launch t+2 and its PlainProofV4 verifies (jackpot
policy included); set_job invalidates the prepared and the mined rows.
"""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from kernels.fp8mine import pipeline
from kernels.fp8mine.gpu_check import synthetic_chain
from kernels.fp8mine.lagged import LagError, LagSlot, MinedSlot, build_operand, clean_rows, lagged_front
from kernels.fp8mine.peel import peel_and_unscale
from kernels.fp8mine.pipeline import MinedGemm
from kernels.fp8mine.proofs import take_winner
from kernels.fp8mine.routing import RoutingTable, row_tiles
from kernels.fp8mine.word_copy import chunks
from proof.fp8 import lottery
from proof.fp8.params import TILE_4X64
from proof.fp8.verify import evaluate_plain_proof, verify_plain_proof

K = 1024
EVERY_TILE_WINS = 2 ** 256 - 1


def _table(ids: torch.Tensor, experts: int) -> RoutingTable:
    """Rflat/bounds by a literal stable sort of the top-k ids (independent of routing.py)."""
    flat = ids.reshape(-1).tolist()
    order = sorted(range(len(flat)), key=lambda i: (flat[i], i))
    counts = [flat.count(w) for w in range(experts)]
    bounds = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    return RoutingTable(torch.tensor([i // ids.shape[1] for i in order], dtype=torch.int32),
                        torch.from_numpy(bounds))


def _slot(m: int, rows: int, k: int, ready_bounds: list[int], seed: int) -> LagSlot:
    slot = LagSlot.allocate(m, rows, k, len(ready_bounds) - 1, torch.device("cpu"))
    slot.a_rows.copy_(torch.from_numpy(np.random.default_rng(seed).integers(0, 256, (rows, k), dtype=np.uint8)))
    slot.bounds.copy_(torch.tensor(ready_bounds, dtype=torch.int32))
    return slot


def _clean_row(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Literal per-token quantization: α = bf16(448 / max(max|x|, 2^-32)), codes = e4m3(clamp(α·x))."""
    amax = max(float(x.float().abs().max()), 2.0 ** -32)
    alpha = (torch.tensor(448.0, dtype=torch.float32) / torch.tensor(amax, dtype=torch.float32)).to(torch.bfloat16)
    codes = (x.float() * alpha.float()).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return codes.view(torch.uint8), alpha


@pytest.mark.parametrize("experts,top_k,ready_counts,k", [
    (4, 2, [3, 0, 9, 4], 256),  # an expert with no READY rows
    (4, 2, [0, 0, 0, 0], 256),  # nothing READY (first launch, or after set_job)
    (1, 1, [8], 256),  # dense: one group
    (5, 3, [4, 1, 0, 7, 2], 1056),  # k not a power of two: masked quantization and copy blocks
])
def test_combined_operand_matches_literal_reference(experts, top_k, ready_counts, k):
    m = 8
    rng = np.random.default_rng(experts + sum(ready_counts))
    x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32) * np.exp2(rng.integers(-20, 20, (m, 1))))
    x[1] = 0  # an all-zero token
    x[2, 5] = 3.0e4  # one large value
    x = x.to(torch.bfloat16)
    ids = torch.from_numpy(rng.integers(0, experts, (m, top_k)))
    if experts > 1:
        ids[ids == 1] = 0  # expert 1 gets no clean rows
    table = _table(ids, experts)
    rows = m * top_k
    ready = _slot(m, rows, k, [0, *np.cumsum(ready_counts).tolist()], seed=1)
    routing = ids if experts > 1 else None
    clean = clean_rows(x, routing, experts)
    assert torch.equal(clean.table.rflat, table.rflat) and torch.equal(clean.table.bounds, table.bounds)
    for got in (build_operand(clean, ready), lagged_front(x, routing, experts, ready)):  # MoE: one launch
        _assert_operand(got, x, table, ready)


@pytest.fixture(autouse=True)
def _stale_tile_counter(monkeypatch):
    """Operand buffers come back with nonzero counters (the tile counter and each expert's
    finished tiles), so a kernel that does not zero them fails the operand checks (a fresh
    allocation often holds zero by chance)."""
    from kernels.fp8mine import lagged
    allocate = lagged._operand_buffers

    def stale(*args, **kwargs):
        buffers = allocate(*args, **kwargs)
        buffers[3].fill_(-1)
        return buffers
    monkeypatch.setattr(lagged, "_operand_buffers", stale)


def _assert_operand(got, x: torch.Tensor, table: RoutingTable, ready: LagSlot) -> None:
    """The combined operand, its bounds, the clean table, codes and α against the literal reference."""
    assert torch.equal(got.clean_table.rflat, table.rflat) and torch.equal(got.clean_table.bounds, table.bounds)
    rb, ct, rows = ready.bounds.tolist(), table.bounds.tolist(), table.rflat.shape[0]
    want_rows, want_alpha, want_codes = [], {}, {}
    for w in range(table.experts):
        want_rows += [ready.a_rows[j] for j in range(rb[w], rb[w + 1])]
        for i in range(ct[w], ct[w + 1]):
            token = int(table.rflat[i])
            codes, alpha = _clean_row(x[token])
            want_rows.append(codes)
            want_alpha[token], want_codes[token] = alpha, codes
    assert got.table.bounds.tolist() == [r + c for r, c in zip(rb, ct)][:-1] + [2 * rows]  # the end: all rows
    assert torch.equal(got.ready_bounds, ready.bounds)  # the snapshot the folding GEMM reads
    assert got.tile_counter.tolist() == [0]  # zeroed for the GEMM's dynamic scheduler
    assert got.expert_done.tolist() == [0] * table.experts  # and for a polling peel
    assert torch.equal(got.rows.view(torch.uint8)[:len(want_rows)], torch.stack(want_rows))
    for token, alpha in want_alpha.items():
        assert got.clean_alpha[token].view(torch.int16) == alpha.view(torch.int16)
        assert torch.equal(got.clean_codes[token].view(torch.uint8), want_codes[token])
    assert set(want_alpha) == set(table.rflat.tolist())


@pytest.mark.parametrize("seed,m,experts,top_k,k", [
    (0, 8, 4, 2, 256), (1, 12, 7, 3, 96), (2, 5, 32, 8, 128), (3, 16, 256, 4, 64), (4, 3, 3, 3, 32),
])
def test_front_in_one_launch_equals_the_two_launch_path(seed, m, experts, top_k, k):
    """lagged_front's one kernel (each token ranks its own entries) against clean_rows +
    build_operand, bit for bit: random routings with experts that get no rows (clean or READY),
    repeated and out-of-range ids (clamped, ranked stably), nothing READY, a full READY."""
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).to(torch.bfloat16)
    ids = torch.from_numpy(rng.integers(-1, experts + 1, (m, top_k)))  # -1 and e clamp to 0 and e - 1
    ids[ids == experts // 2] = 0  # expert e/2 gets no clean rows
    rows = m * top_k
    share = np.ones(experts)
    share[experts // 3] = 0  # expert e/3 has no READY rows
    counts = rng.multinomial(rows, share / share.sum()) if seed % 2 else np.zeros(experts, dtype=int)  # even: none
    ready = _slot(m, rows, k, [0, *np.cumsum(counts).tolist()], seed=seed)
    want = build_operand(clean_rows(x, ids, experts), ready)
    got = lagged_front(x, ids, experts, ready)
    literal = _table(ids.clamp(0, experts - 1), experts)
    assert torch.equal(got.clean_table.rflat, literal.rflat) and torch.equal(got.clean_table.bounds, literal.bounds)
    used = int(ready.bounds[-1]) + rows
    assert torch.equal(got.rows.view(torch.uint8)[:used], want.rows.view(torch.uint8)[:used])
    assert torch.equal(got.table.bounds, want.table.bounds) and torch.equal(got.ready_bounds, want.ready_bounds)
    assert got.tile_counter.tolist() == want.tile_counter.tolist() == [0]
    assert got.expert_done.tolist() == want.expert_done.tolist() == [0] * experts
    assert torch.equal(got.clean_table.rflat, want.clean_table.rflat)
    assert torch.equal(got.clean_table.bounds, want.clean_table.bounds)
    assert torch.equal(got.clean_codes.view(torch.uint8), want.clean_codes.view(torch.uint8))
    assert torch.equal(got.clean_alpha.view(torch.int16), want.clean_alpha.view(torch.int16))


def test_combined_operand_rejects_mismatched_slots():
    clean = clean_rows(torch.zeros((4, 64), dtype=torch.bfloat16), torch.zeros((4, 1), dtype=torch.int64), 2)
    with pytest.raises(LagError, match="READY must hold"):
        build_operand(clean, _slot(4, 8, 64, [0, 0, 0], seed=0))
    with pytest.raises(LagError, match="bf16"):
        clean_rows(torch.zeros((4, 48), dtype=torch.bfloat16), None, 1)


def _peel_inputs(rows_per_expert: list[int], n: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    experts, m = len(rows_per_expert), sum(rows_per_expert)
    table = RoutingTable(torch.randperm(m, generator=gen).to(torch.int32),
                         torch.tensor([0, *np.cumsum(rows_per_expert).tolist()], dtype=torch.int32))
    a_peel = torch.randn((m, 64), generator=gen).to(torch.bfloat16)
    alpha_a = (torch.rand(m, generator=gen) * 100 + 1).to(torch.bfloat16)
    b_peel = torch.randn((experts, n, 64), generator=gen).to(torch.bfloat16)
    alpha_b = (torch.rand((experts, n), generator=gen) * 100 + 1).to(torch.bfloat16)
    return table, a_peel, alpha_a, b_peel, alpha_b


def test_shifted_peel_reads_the_clean_rows_of_the_combined_accumulator():
    """The lagged layout through peel_and_unscale(row_shift=): output row i of expert w reads
    acc row i + rb[w + 1] (clean rows after the READY ones); bit-equal to the compact pass."""
    table, a_peel, alpha_a, b_peel, alpha_b = _peel_inputs([5, 0, 19, 8], n=192, seed=3)
    compact = torch.randn((32, 192)) * 1000
    ready = [0, 7, 7, 12, 30]  # READY rows before each expert's clean rows
    combined = torch.full((64, 192), float("nan"))
    shift = torch.tensor(ready[1:], dtype=torch.int32)
    starts = table.bounds.tolist()
    for w in range(4):
        for i in range(starts[w], starts[w + 1]):
            combined[i + ready[w + 1]] = compact[i]
    want = peel_and_unscale(compact, a_peel, alpha_a, b_peel, alpha_b, table)
    got = peel_and_unscale(combined, a_peel, alpha_a, b_peel, alpha_b, table, row_shift=shift)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


@pytest.mark.parametrize("rows_per_expert", [[5, 0, 19, 8], [40, 17, 33, 30]])  # decode: by expert
def test_peel_of_clean_rows_reads_only_the_right_halves(rows_per_expert):
    """a_left_zero: with A_peel[:, :32] = 0 the pass reads only the right halves of both peels
    (B_peel's left half may hold anything); the same output as the full pass."""
    from kernels.fp8mine import peel
    table, a_peel, alpha_a, b_peel, alpha_b = _peel_inputs(rows_per_expert, n=192, seed=5)
    assert not peel.reads_tiles(table)
    a_peel[:, :32] = 0
    acc = torch.randn((sum(rows_per_expert), 192)) * 1000
    want = peel_and_unscale(acc, a_peel, alpha_a, b_peel, alpha_b, table)
    b_peel[:, :, :32] = float("nan")  # never read
    got = peel_and_unscale(acc, a_peel, alpha_a, b_peel, alpha_b, table, a_left_zero=True)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


@pytest.mark.parametrize("ready_counts,clean_counts", [([9, 0, 12], [4, 3, 0]), ([0, 0, 0], [5, 2, 7])])
def test_mined_slot_takes_the_ready_rows_of_the_combined_accumulator(ready_counts, clean_counts):
    """MINED acc row j of expert w = combined row rb[w] + ct[w] + j; READY's tail (planes, Rflat,
    bounds, key) copied; rows past the READY rows left alone; READY bounds all zero: nothing
    to mine."""
    m, rows, n, k, experts = 11, 22, 64, 96, 3
    rb = [0, *np.cumsum(ready_counts).tolist()]
    ct = [0, *np.cumsum(clean_counts).tolist()]
    ready = _slot(m, rows, k, rb, seed=3)
    ready.tail().copy_(torch.randint(-2 ** 31, 2 ** 31 - 1, ready.tail().shape, dtype=torch.int32))
    ready.bounds.copy_(torch.tensor(rb, dtype=torch.int32))
    combined = torch.randn((2 * rows, n))
    mined = MinedSlot.allocate(m, rows, n, k, experts, torch.device("cpu"))
    mined.acc.fill_(-1.0)
    mined.take(combined, ready, torch.tensor(ct, dtype=torch.int32))
    want = torch.full((rows, n), -1.0)
    for w in range(experts):
        for j in range(rb[w + 1] - rb[w]):
            want[rb[w] + j] = combined[rb[w] + ct[w] + j]
    assert torch.equal(mined.acc, want)
    assert torch.equal(mined.slot.tail(), ready.tail()) and mined.slot.a_rows.numel() == 0
    assert mined.slot.sources()["codes"].data_ptr() == mined.slot.flat.data_ptr()
    assert int((row_tiles(mined.slot.table()).row_start >= 0).sum()) == sum(c // 4 for c in ready_counts)
    mined.invalidate()
    assert bool((row_tiles(mined.slot.table()).row_start < 0).all())


def test_folded_mined_slot_takes_the_lanes_and_the_tail():
    """Where the lagged GEMM folds the READY rows (the lanes already compact, tile t of expert w
    at [(rb[w] + 4t) // 4, c]), MINED takes those lanes whole and READY's tail; a lane buffer of
    another shape is refused."""
    m, rows, n, k, experts = 11, 24, 128, 96, 3
    ready = _slot(m, rows, k, [0, 8, 8, 20], seed=5)
    ready.tail().copy_(torch.randint(-2 ** 31, 2 ** 31 - 1, ready.tail().shape, dtype=torch.int32))
    mined = MinedSlot.allocate(m, rows, n, k, experts, torch.device("cpu"), folded=True)
    assert mined.folded and mined.acc.shape == (rows // 4, n // 64, 16)
    lanes = torch.randint(-2 ** 31, 2 ** 31 - 1, (rows // 4, n // 64, 16), dtype=torch.int32)
    mined.take(lanes, ready, torch.zeros(experts + 1, dtype=torch.int32))
    assert torch.equal(mined.acc, lanes) and torch.equal(mined.slot.tail(), ready.tail())
    for wrong in (lanes[:, :1], lanes[:-1]):
        with pytest.raises(LagError, match="does not take"):
            mined.take(wrong, ready, torch.zeros(experts + 1, dtype=torch.int32))
    assert not MinedSlot.allocate(m, rows, n, k, experts, torch.device("cpu")).folded


def test_serving_peel_carries_the_folded_take():
    """The lagged pass's serving peel with MINED's folded take as its copies (`folded_copies`):
    its output is the plain peel's bit for bit, and MINED then holds what the take kernel would
    have copied (the lanes whole, READY's tail); at most two int32 ranges of equal length, and
    only on the decode peel."""
    m, rows, n, k, experts = 40, 160, 384, 256, 4  # 3 column tiles, each range over 2 copy chunks
    table, a_peel, alpha_a, b_peel, alpha_b = _peel_inputs([5, 0, 11, 8], n=n, seed=9)
    acc = torch.randn((sum([5, 0, 11, 8]), n)) * 1000
    ready = _slot(m, rows, k, [0, 48, 48, 120, 160], seed=5)
    ready.tail().copy_(torch.randint(-2 ** 31, 2 ** 31 - 1, ready.tail().shape, dtype=torch.int32))
    mined = MinedSlot.allocate(m, rows, n, k, experts, torch.device("cpu"), folded=True)
    lanes = torch.randint(-2 ** 31, 2 ** 31 - 1, mined.acc.shape, dtype=torch.int32)
    assert [chunks(src.numel()) for src, _ in mined.folded_copies(lanes, ready)] == [2, 2]
    want = peel_and_unscale(acc, a_peel, alpha_a, b_peel, alpha_b, table)
    got = peel_and_unscale(acc, a_peel, alpha_a, b_peel, alpha_b, table, copies=mined.folded_copies(lanes, ready))
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert torch.equal(mined.acc, lanes) and torch.equal(mined.slot.tail(), ready.tail())
    words = lanes.view(-1)
    for bad in (((words, words),) * 3, ((words, words[1:]),), ((words.float(), words.float()),),
                ((words[::2], words[::2]),)):
        with pytest.raises(ValueError, match="copies"):
            peel_and_unscale(acc, a_peel, alpha_a, b_peel, alpha_b, table, copies=bad)
    wide, *wide_peels = _peel_inputs([80, 70, 64, 90], n=n, seed=1)  # prefill-sized: the row-tile peel
    with pytest.raises(ValueError, match="decode peel only"):
        peel_and_unscale(torch.zeros((304, n)), *wide_peels, wide,
                         copies=mined.folded_copies(lanes, ready))


def test_polling_peel_is_refused_where_it_cannot_poll():
    """`peel_and_unscale(poll=)` (`LAGGED_PEEL_POLLS`) only after its GEMM, with int32 counts (e,)
    and the GEMM's bounds (e+1,), and only on the decode peel. Without PDL (here, the
    interpreter) the peel runs after the GEMM anyway and its output is the plain peel's."""
    from kernels.fp8mine.peel import TilePoll
    table, a_peel, alpha_a, b_peel, alpha_b = _peel_inputs([5, 0, 11, 8], n=384, seed=9)
    acc = torch.randn((24, 384)) * 1000
    done, bounds = torch.zeros(4, dtype=torch.int32), torch.tensor([0, 10, 10, 30, 48], dtype=torch.int32)
    args = (acc, a_peel, alpha_a, b_peel, alpha_b, table)
    want = peel_and_unscale(*args)
    got = peel_and_unscale(*args, after_gemm=True, poll=TilePoll(done, bounds, 64, 128))
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    for bad, after in ((TilePoll(done, bounds, 64, 128), False), (TilePoll(done[:3], bounds, 64, 128), True),
                       (TilePoll(done.long(), bounds, 64, 128), True), (TilePoll(done, bounds[:4], 64, 128), True)):
        with pytest.raises(ValueError, match="poll"):
            peel_and_unscale(*args, after_gemm=after, poll=bad)
    wide, *wide_peels = _peel_inputs([80, 70, 64, 90], n=384, seed=1)  # prefill-sized: the row-tile peel
    with pytest.raises(ValueError, match="decode peel only"):
        peel_and_unscale(torch.zeros((304, 384)), *wide_peels, wide, after_gemm=True,
                         poll=TilePoll(done, bounds, 64, 128))


def test_slot_views_are_disjoint_and_one_copy_moves_a_launch():
    a = LagSlot.allocate(4, 8, 64, 3, torch.device("cpu"))
    b = LagSlot.allocate(4, 8, 64, 3, torch.device("cpu"))
    views = [a.a_rows, a.codes, a.scales, a.rflat, a.bounds, a.pow_key]
    spans = sorted((v.data_ptr(), v.data_ptr() + v.numel() * v.element_size()) for v in views)
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))
    assert all(v.data_ptr() % 16 == 0 for v in views)
    for v in views:
        v.view(torch.uint8).fill_(7)
    b.flat.copy_(a.flat)
    assert all(bool((v.view(torch.uint8) == 7).all()) for v in (b.a_rows, b.codes, b.scales, b.rflat, b.pow_key))
    b.invalidate()
    assert b.bounds.tolist() == [0, 0, 0, 0] and a.bounds.tolist() != [0, 0, 0, 0]


def test_fill_gathers_the_rows_and_copies_the_planes_in_one_kernel():
    m, top_k, experts, k = 6, 2, 3, 96
    g = torch.Generator().manual_seed(2)
    ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(m)])
    table = _table(ids, experts)
    a_codes = torch.randint(0, 256, (m, k), generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn)
    codes = torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int8)
    scales = torch.randn((m, k // 8), generator=g).to(torch.bfloat16)
    key = torch.randint(-2 ** 31, 2 ** 31 - 1, (1, 8), generator=g, dtype=torch.int32)
    slot = LagSlot.allocate(m, m * top_k, k, experts, torch.device("cpu"))
    slot.fill(a_codes, codes, scales, key, table)
    assert torch.equal(slot.a_rows, a_codes.view(torch.uint8)[table.rflat.long()])
    assert torch.equal(slot.codes, codes) and torch.equal(slot.scales.view(torch.int16), scales.view(torch.int16))
    assert torch.equal(slot.rflat, table.rflat) and torch.equal(slot.bounds, table.bounds)
    assert torch.equal(slot.pow_key, key)


COMPILE = textwrap.dedent("""
    import os
    os.environ["PEARL_INT7_INTERPRET"] = "0"
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from kernels.fp8mine import lagged, lottery
    target = GPUTarget("cuda", 90, 128)
    triton.compile(ASTSource(fn=lagged._operand_kernel, signature={
        "codes_ptr": "*i32", "rflat_ptr": "*i32", "clean_bounds_ptr": "*i32", "ready_ptr": "*i32",
        "ready_bounds_ptr": "*i32", "out_ptr": "*i32", "bounds_ptr": "*i32", "ready_copy_ptr": "*i32",
        "counter_ptr": "*i32", "experts": "i32", "words": "i32",
        "capacity": "i32", "EB": "constexpr", "BW": "constexpr"}, constexprs={"EB": 64, "BW": 2048}), target=target)
    triton.compile(ASTSource(fn=lagged._fill_kernel, signature={
        **{name: "*i32" for name in ("a_ptr", "rflat_ptr", "codes_ptr", "scales_ptr", "bounds_ptr", "key_ptr",
                                     "slot_a_ptr", "slot_codes_ptr", "slot_scales_ptr", "slot_rflat_ptr",
                                     "slot_bounds_ptr", "slot_key_ptr")},
        "rows": "i32", "words": "i32", "scale_words": "i32", "edges": "i32", "BW": "constexpr"},
        constexprs={"BW": 2048}), target=target)
    triton.compile(ASTSource(fn=lagged._take_kernel, signature={
        **{name: "*i32" for name in ("acc_ptr", "ready_bounds_ptr", "clean_bounds_ptr", "mined_ptr")},
        "rows": "i32", "n": "i32", "experts": "i32",
        **{name: "*i32" for name in ("first_src_ptr", "first_dst_ptr")}, "first_words": "i32",
        **{name: "*i32" for name in ("second_src_ptr", "second_dst_ptr")}, "second_words": "i32",
        "EB": "constexpr", "BW": "constexpr"}, constexprs={"EB": 256, "BW": 2048}),
        target=target)
    triton.compile(ASTSource(fn=lagged._clean_kernel, signature={
        "x_ptr": "*i16", "k": "i32", "codes_ptr": "*u8", "alpha_ptr": "*i16", "BK": "constexpr"},
        constexprs={"BK": 8192}), target=target, options={"enable_fp_fusion": False, "num_warps": lagged._QUANT_WARPS})
    for ids, eb, tk, chunk, wait in (("*i64", 32, 8, 512, 1), ("*i32", 256, 4, 64, 0)):
        front = triton.compile(ASTSource(fn=lagged._front_kernel, signature={
            "ids_ptr": ids, "total": "i32", "experts": "i32", "top_k": "i32", "x_ptr": "*i16", "k": "i32",
            "codes_ptr": "*u8", "alpha_ptr": "*i16", "ready_ptr": "*i32", "ready_bounds_ptr": "*i32",
            "rflat_ptr": "*i32", "bounds_ptr": "*i32", "out_ptr": "*u8", "out_words_ptr": "*i32",
            "out_bounds_ptr": "*i32", "ready_copy_ptr": "*i32", "counter_ptr": "*i32", "m": "i32", "capacity": "i32",
            "EB": "constexpr", "TK": "constexpr", "CHUNK": "constexpr", "BK": "constexpr", "BW": "constexpr",
            "RP": "constexpr", "WAIT": "constexpr"},
            constexprs={"EB": eb, "TK": tk, "CHUNK": chunk, "BK": 8192, "BW": 2048, "RP": lagged._READY_ROWS,
                        "WAIT": wait}),
            target=target,
            options={"enable_fp_fusion": False, "num_warps": lagged._QUANT_WARPS})
        ptx = front.asm["ptx"]
        print("FRONT-LOCAL", ".local" in ptx)  # no stack frame at the decode shapes
        # a programmatic dependent waits once, before any global load; the other does not wait
        waits = ptx.count("griddepcontrol.wait")
        print("FRONT-WAIT", wait, waits, waits == 1 and "ld.global" not in ptx[:ptx.index("griddepcontrol.wait")])
    mined = triton.compile(ASTSource(fn=lottery._lottery_kernel, signature={
        "src_ptr": "*i64", "n": "i32", "tile_row_ptr": "*i32", "tile_expert_ptr": "*i32", "tile_local_ptr": "*i32",
        "num_tiles": "i32", "key_ptr": "*i32", "thr_ptr": "*i32", "seed_b_ptr": "*i32",
        "lock_ptr": "*i32", "record_ptr": "*i32", "fresh_ptr": "*i32", "header_ptr": "*i32",
        "tickets_ptr": "*i32", "BT": "constexpr", "STORE_TICKETS": "constexpr", "FOLDED": "constexpr"},
        constexprs={"BT": 128, "STORE_TICKETS": False, "FOLDED": False}), target=target)
    print("PAIR-LOADS", mined.asm["ptx"].count("ld.global.b64"))
""")


def test_lagged_kernels_compile_for_sm90():
    env = dict(os.environ, PEARL_INT7_INTERPRET="0")
    done = subprocess.run([sys.executable, "-c", COMPILE], capture_output=True, text=True, env=env,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), timeout=600)
    if done.returncode != 0 and "ptxas" in done.stderr and "not found" in done.stderr:
        pytest.skip("Triton's ptxas is not available")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "PAIR-LOADS 128" in done.stdout  # the lottery keeps the fold's 8-byte loads
    assert "FRONT-LOCAL True" not in done.stdout
    assert "FRONT-WAIT 1 1 True" in done.stdout and "FRONT-WAIT 0 0 False" in done.stdout


# ------------------------------------------------------------------------------------ launches

def _ready_tickets(result, previous, pow_key: bytes) -> dict:
    """Reference tickets of the previous launch's rows inside this launch's combined accumulator:
    expert w's READY rows start at operand_bounds[w]."""
    acc = result.acc.numpy()
    starts = result.operand_bounds.tolist()
    counts = (previous.table.bounds[1:] - previous.table.bounds[:-1]).tolist()
    out = {}
    for expert, (start, count) in enumerate(zip(starts, counts)):
        for local in range(count // 4):
            for col in range(acc.shape[1] // 64):
                cell = acc[start + 4 * local:start + 4 * local + 4, 64 * col:64 * col + 64]
                message = lottery.fold_message(cell, TILE_4X64.row_pattern, TILE_4X64.col_pattern)
                out[(expert, local, col)] = lottery.ticket_with_key(pow_key, message)
    return out


def _key(result) -> bytes:
    return bytes(result.a.pow_key.view(torch.uint8).view(-1).tolist())


def _relative_error(out: torch.Tensor, x: torch.Tensor, weights: torch.Tensor, table: RoutingTable) -> float:
    rows = table.rflat.long()
    expert = torch.searchsorted(table.offsets.long(), torch.arange(rows.numel()), right=True)
    reference = torch.einsum("rk,rnk->rn", x.float()[rows], weights.float()[expert])
    return float((out.float() - reference).norm() / reference.norm())


def _launches(weights: torch.Tensor, m: int, top_k: int, routings: list[torch.Tensor | None]):
    header, ancestors = synthetic_chain()
    gemm = MinedGemm(weights, m=m, top_k=top_k, layer_id=3, lagged=True)
    gemm.set_job(header, ancestors, EVERY_TILE_WINS)
    x1, x2 = (torch.randn(m, K).to(torch.bfloat16) for _ in range(2))
    t1, t2 = routings

    gemm.lagged = False  # the same layer's non-lagged pass, for comparison
    plain1, plain2 = gemm.forward(x1, t1), gemm.forward(x2, t2)
    gemm.lagged = True
    gemm.latch.reset()

    first = gemm.forward(x1, t1)
    gemm.latch.publish()
    assert gemm.latch.poll() is None  # launch 1 mines nothing, although every tile would win
    second = gemm.forward(x2, t2)  # hashes launch 1's rows; their lottery runs in launch 3
    gemm.latch.publish()
    assert gemm.latch.poll() is None
    gemm.forward(x1, t1)
    record = gemm.latch.poll()
    assert record is not None and record.pow_key == _key(first)  # a tile of launch 1's rows

    # launch 2's READY rows are launch 1's noisy rows: the same accumulator bit for bit
    starts, plain_bounds = second.operand_bounds.tolist(), plain1.table.bounds.tolist()
    for w in range(len(starts) - 1):
        count = plain_bounds[w + 1] - plain_bounds[w]
        assert torch.equal(second.acc[starts[w]:starts[w] + count].view(torch.int32),
                           plain1.acc[plain_bounds[w]:plain_bounds[w + 1]].view(torch.int32))
    # launch 2's output (clean rows of x2) is at least as accurate as the non-lagged output
    assert torch.equal(second.table.rflat, plain2.table.rflat)
    lagged_error = _relative_error(second.out, x2, weights, second.table)
    plain_error = _relative_error(plain2.out, x2, weights, plain2.table)
    assert lagged_error <= plain_error < 0.1

    tickets = _ready_tickets(second, first, _key(first))
    planted, ticket = min(tickets.items(), key=lambda kv: int.from_bytes(kv[1], "little"))
    target = -(-int.from_bytes(ticket, "little") // (4 * 64 * K))
    gemm.latch.reset()
    gemm.forward(x1, t1)  # PENDING ← launch 1's rows again (they hold the planted tile)
    gemm.latch.reset()
    gemm.set_job(header, ancestors, target)  # invalidates them: their keys belong to the old job
    gemm.forward(x1, t1)
    gemm.latch.publish()
    assert gemm.latch.poll() is None
    gemm.forward(x2, t2)  # hashes the previous launch's rows: the planted tile
    gemm.latch.publish()
    assert gemm.latch.poll() is None
    gemm.forward(x2, t2)  # their lottery
    winner = take_winner(gemm)
    record = winner.record
    assert (record.group_id, record.tile_row, record.tile_column) == planted
    assert record.ticket == ticket
    assert verify_plain_proof(header, winner.proof, target=target) == (True, "ok")
    assert evaluate_plain_proof(header, winner.proof).jackpot == ticket


@pytest.mark.slow
def test_lagged_launches_dense():
    torch.manual_seed(4)
    _launches((torch.randn(1, 64, K) * 0.05).to(torch.bfloat16), 8, 1, [None, None])


@pytest.mark.slow
@pytest.mark.parametrize("lottery_first", [False, True])
def test_lagged_launches_moe(lottery_first, monkeypatch):
    """Both places of MINED's tickets (under the GEMM, the default; beside the front) mine the
    previous launch's rows and publish the planted winner."""
    monkeypatch.setattr(pipeline, "LAGGED_LOTTERY_FIRST", lottery_first)
    torch.manual_seed(5)
    experts, top_k, m = 3, 2, 12
    routings = [torch.stack([torch.randperm(experts)[:top_k] for _ in range(m)]) for _ in range(2)]
    _launches((torch.randn(experts, 64, K) * 0.05).to(torch.bfloat16), m, top_k, routings)
