"""The prefill (bandwidth) paths of kernels.fp8mine on the CPU backend: each is checked against
the reference or the formula, and where a stage has a decode and a prefill path, the two are
bit-identical on the same input (small shapes; the thresholds that pick a path are patched)."""
import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from kernels.fp8mine import noisy_kernel, peel
from kernels.fp8mine import routing as dev_routing
from kernels.triton_jit import jit
from proof.fp8 import bf16 as ref_bf16
from proof.fp8 import e4m3 as ref_e4m3
from proof.fp8 import quantization as ref_quant
from proof.fp8.miner import routing_from_topk
from test_fp8mine_stages import EDGE_BF16, bf16_tensor, same_bf16, same_e4m3


def _peel_inputs(g: torch.Generator, counts: list[int], n_e: int):
    """A routed launch with `counts` rows per expert (one token per row, top-1)."""
    experts, tokens = len(counts), sum(counts)
    ids = torch.cat([torch.full((c,), w) for w, c in enumerate(counts)])[torch.randperm(tokens, generator=g)]
    table = dev_routing.routing_table(ids.view(-1, 1), experts)
    acc = torch.randn(tokens, n_e, generator=g) * 100
    a_rows = torch.randn(tokens, 64, generator=g).to(torch.bfloat16)
    alpha_a = (torch.rand(tokens, generator=g) + 0.5).to(torch.bfloat16)
    b_rows = torch.randn(experts, n_e, 64, generator=g).to(torch.bfloat16)
    alpha_b = (torch.rand(experts, n_e, generator=g) + 0.5).to(torch.bfloat16)
    return acc, a_rows, alpha_a, b_rows, alpha_b, table


def test_peel_prefill_columns_loop_matches_one_step_and_the_formula(monkeypatch):
    """64-row tiles walking 4 column steps of 64 per program (the last program past n) give the
    same bits as one step per program, and the formula; experts of 110/90/0/70 rows leave partial
    tiles, an empty expert and rows past an expert's end inside the launch."""
    g = torch.Generator().manual_seed(31)
    args = _peel_inputs(g, [110, 90, 0, 70], 320)
    acc, a_rows, alpha_a, b_rows, alpha_b, table = args
    assert peel.reads_tiles(table)
    monkeypatch.setattr(peel, "_PEEL_MIN_PROGRAMS", 1)
    assert peel.peel_shape(8, 320) == (64, 4, 3, 8)
    looped = peel.peel_and_unscale(*args)
    monkeypatch.setattr(peel, "_PEEL_SPAN", 64)
    assert peel.peel_shape(8, 320).steps == 1
    single = peel.peel_and_unscale(*args)
    assert torch.equal(looped.view(torch.int16), single.view(torch.int16))
    rows = table.rflat.long()
    expert = torch.searchsorted(table.offsets.long(), torch.arange(rows.shape[0]), right=True)
    correction = torch.einsum("rj,rcj->rc", a_rows[rows].float(), b_rows[expert].float())
    want = (acc + correction) / alpha_a[rows].float()[:, None] / alpha_b[expert].float()
    assert torch.allclose(looped.float(), want, rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("counts", [[5, 0, 9, 2], [20, 3, 40, 17], [40, 0, 70, 31], [80, 2, 1, 3], [0, 1, 0, 0, 7, 0]])
def test_peel_by_expert_matches_the_row_tile_kernel(counts, monkeypatch):
    """The decode peel (a program per expert × 128 columns, 16- or 32-row blocks in a loop: here
    empty experts, odd counts, experts of 2–5 blocks, n not a multiple of 128) gives the bits of
    the prefill pass's row-tile kernel (64-row tiles, forced), plain and row-shifted, with full
    peels and with right halves only (the B peel's left half NaN: never read)."""
    g = torch.Generator().manual_seed(34)
    acc, a_rows, alpha_a, b_rows, alpha_b, table = _peel_inputs(g, counts, 200)
    assert not peel.reads_tiles(table)
    assert peel._expert_rows(acc.shape[0], table.experts) == (32 if counts[2] == 70 else 16)
    shift = torch.arange(table.experts, dtype=torch.int32) * 2 + 1  # non-decreasing: experts never overlap
    combined = torch.randn((acc.shape[0] + 2 * table.experts + 3, 200), generator=g)
    for w, (start, end) in enumerate(zip(table.bounds[:-1].tolist(), table.bounds[1:].tolist())):
        combined[start + shift[w]:end + shift[w]] = acc[start:end]
    right_a, right_b = a_rows.clone(), b_rows.clone()
    right_a[:, :32] = 0
    right_b[:, :, :32] = float("nan")
    cases = [(acc, a_rows, b_rows, {}), (combined, a_rows, b_rows, {"row_shift": shift}),
             (combined, right_a, right_b, {"row_shift": shift, "a_left_zero": True})]
    for acc_, a_, b_, kw in cases:
        by_expert = peel.peel_and_unscale(acc_, a_, alpha_a, b_, alpha_b, table, **kw)
        with monkeypatch.context() as forced:
            forced.setattr(peel, "reads_tiles", lambda _table: True)
            by_tile = peel.peel_and_unscale(acc_, a_, alpha_a, b_, alpha_b, table, **kw)
        assert torch.equal(by_expert.view(torch.int16), by_tile.view(torch.int16))


@pytest.mark.parametrize("counts, n_e", [([5, 0, 9, 2], 128), ([110, 90, 0, 70], 320)])  # 16-, 64-row tiles
def test_peel_row_shift_reads_each_expert_from_its_offset(counts, n_e, monkeypatch):
    """A combined accumulator (junk rows before each expert's rows, as the lagged pass lays out
    READY rows) read through row_shift gives the same bits as the compact accumulator."""
    monkeypatch.setattr(peel, "_PEEL_MIN_PROGRAMS", 1)  # the prefill shape walks several column steps
    g = torch.Generator().manual_seed(32)
    acc, *rest = args = _peel_inputs(g, counts, n_e)
    table = args[-1]
    junk = torch.tensor([3, 1, 4, 2], dtype=torch.int32)[:table.experts]
    shift = torch.cumsum(junk, 0, dtype=torch.int32)
    pieces, start = [], 0
    for w, end in enumerate(table.offsets.tolist()):
        pieces += [torch.full((int(junk[w]), n_e), float("nan")), acc[start:end]]
        start = end
    combined = torch.cat(pieces + [torch.full((5, n_e), float("nan"))])
    plain = peel.peel_and_unscale(*args)
    shifted = peel.peel_and_unscale(combined, *rest, row_shift=shift)
    assert torch.equal(plain.view(torch.int16), shifted.view(torch.int16))
    ahead = peel.peel_and_unscale(combined, *rest, row_shift=shift, tiles=peel.peel_tiles(table))
    assert torch.equal(ahead.view(torch.int16), shifted.view(torch.int16))  # the tile map built ahead
    with pytest.raises(ValueError, match="does not hold"):
        peel.peel_and_unscale(combined, *rest)


def test_peel_shape_fills_the_gpu_at_prefill():
    assert peel.peel_shape(1056, 4096) == (64, 16, 3, 8)  # GLM-5 prefill: 1056 row tiles, 1024 columns
    assert peel.peel_shape(1056, 4096, acc_bytes=2) == (64, 16, 3, 4)  # a bf16 accumulator: 4 warps
    few = peel.peel_shape(40, 4096).steps  # few row tiles: spans shrink to keep the SMs busy
    assert 40 * (4096 // (few * 64)) >= peel._PEEL_MIN_PROGRAMS > 40 * (4096 // (2 * few * 64))


@pytest.mark.parametrize("tokens, top_k, experts", [(600, 8, 1024), (513, 3, 7), (1000, 4, 64)])
def test_chunked_routing_table_matches_reference(tokens, top_k, experts, monkeypatch):
    """The prefill routing path (chunk counts, per-expert prefixes, bounds, scatter) against the
    reference: a ragged last chunk, prefix programs walking several chunk steps, e up to 1024
    (32 prefix programs), non-power-of-two e (the dead tail counted under id e)."""
    monkeypatch.setattr(dev_routing, "_SCAN_CELLS", 64)  # 2..8 chunks a prefix step
    rng = np.random.default_rng(tokens)
    topk = np.stack([rng.permutation(experts)[:top_k] for _ in range(tokens)])
    rflat, offsets = routing_from_topk(topk, experts)
    table = dev_routing._chunked_table(torch.from_numpy(topk), experts)
    assert table.rflat.tolist() == rflat and table.bounds.tolist() == [0] + offsets


# ------------------------------------------------------------------------------- noisy codes, f32

@jit
def _e4m3_probe(bits_ptr, out_ptr, count, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = i < count
    tl.store(out_ptr + i, noisy_kernel._e4m3_code(tl.load(bits_ptr + i, mask=live, other=0)), mask=live)


@jit
def _fma_probe(a_ptr, b_ptr, c_ptr, out_ptr, leaves_ptr, count, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = i < count
    a = noisy_kernel._bf16_of_bits(a_ptr, i, live)
    b = noisy_kernel._bf16_of_bits(b_ptr, i, live)
    c = noisy_kernel._bf16_of_bits(c_ptr, i, live)
    tl.store(out_ptr + i, noisy_kernel._fma_bf16_f32(a, b, c) >> 16, mask=live)
    tl.store(leaves_ptr + i, noisy_kernel._product_leaves_f32(a, b).to(tl.int32), mask=live)


def _probe(kernel, count: int, *tensors) -> None:
    kernel[(triton.cdiv(count, 1 << 16),)](*tensors, count, BLOCK=1 << 16, enable_fp_fusion=False)


def test_e4m3_encode_saturates_and_matches_reference():
    """Every bf16 pattern and random f32 patterns (all exponents, subnormals, ties of the 2^-9
    grid, out of range, NaN): RNE e4m3 of the value clamped to ±448, NaN → 0x7F | sign."""
    rng = np.random.default_rng(41)
    ties = (np.arange(-20, 20) * 0.5 * 2.0 ** -9).astype(np.float32).view(np.uint32)
    patterns = np.concatenate([np.arange(1 << 16, dtype=np.uint32) << 16,
                               rng.integers(0, 1 << 32, 1 << 18, dtype=np.uint64).astype(np.uint32), ties])
    bits = torch.from_numpy(patterns.view(np.int32).copy())
    got = torch.empty_like(bits)
    _probe(_e4m3_probe, bits.shape[0], bits, got)
    values = patterns.view(np.float32)
    nan = np.isnan(values)
    want = ref_e4m3.f32_to_e4m3(np.clip(values, -448.0, 448.0))
    got = got.numpy()
    assert np.array_equal(got[~nan], want[~nan].astype(np.int32))
    assert np.array_equal(got[nan], 0x7F | ((patterns[nan] >> 24) & 0x80).astype(np.int32))


def test_f32_fma_equals_the_single_rounding_wherever_the_product_is_exact():
    """_fma_bf16_f32 against proof.fp8's FMA on the edge grid, random triples and cancelling
    triples, wherever _product_leaves_f32 does not flag the product; it flags every product an
    f32 does not hold exactly (checked in f64), and it flags few others."""
    rng = np.random.default_rng(42)
    grid = np.array(np.meshgrid(EDGE_BF16, EDGE_BF16, EDGE_BF16)).reshape(3, -1)
    random = rng.integers(0, 0x10000, (3, 200_000)).astype(np.uint16)
    near = (0x3F00 + rng.integers(0, 0x200, (3, 50_000))).astype(np.uint16)
    near[2] ^= 0x8000
    for a, b, c in (grid, random, near):
        count = a.shape[0]
        tensors = [torch.from_numpy(v.astype(np.int16)) for v in (a, b, c)]
        out, leaves = torch.empty(count, dtype=torch.int32), torch.empty(count, dtype=torch.int32)
        _probe(_fma_probe, count, *tensors, out, leaves)
        fa, fb = ref_bf16.bf16_to_f32(a).astype(np.float64), ref_bf16.bf16_to_f32(b).astype(np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            exact = fa * fb
            held = (exact.astype(np.float32).astype(np.float64) == exact) | np.isnan(exact)
        fast = leaves.numpy() == 0
        assert not (fast & ~held).any() and fast.mean() > 0.5
        got = (out.numpy() & 0xFFFF).astype(np.uint16)
        assert same_bf16(got[fast], ref_bf16.bf16_fma(a, b, c)[fast])


def test_noisy_codes_f32_path_matches_reference():
    """Tiles whose products are all exact in f32 (the f32 path): zeros of both signs, noise that
    cancels α·X to the last bits, NaN/±inf noise; codes equal the reference."""
    rng = np.random.default_rng(43)
    rows, k = 16, 1024
    alpha = ref_bf16.f32_to_bf16(rng.uniform(0.5, 300, rows).astype(np.float32))
    beta = ref_bf16.f32_to_bf16(rng.uniform(1e-4, 1e-2, rows).astype(np.float32))
    x = ref_bf16.f32_to_bf16((rng.standard_normal((rows, k)) * np.exp2(rng.integers(-12, 3, (rows, k)))).astype(np.float32))
    x[:, :4] = [0x0000, 0x8000, 0x0000, 0x8000]
    product = ref_bf16.bf16_to_f32(alpha)[:, None] * ref_bf16.bf16_to_f32(x)
    noise = (rng.standard_normal((rows, k)) * 1000).astype(np.float32)
    cancel = rng.random((rows, k)) < 0.5  # β·N ≈ −α·X up to a few ulps
    noise[cancel] = (-product / ref_bf16.bf16_to_f32(beta)[:, None] * (1 + rng.integers(-8, 9, (rows, k)) * 2.0 ** -9))[cancel]
    noise[:, 4:8] = [np.nan, np.inf, -np.inf, -0.0]
    assert not (np.abs(product) < 2.0 ** -126)[x & 0x7FFF != 0].any()  # every tile takes the f32 path
    got = noisy_kernel.noisy_codes(bf16_tensor(alpha), bf16_tensor(beta), bf16_tensor(x), torch.from_numpy(noise))
    want = ref_quant._noisy_codes(alpha[:, None], beta[:, None], x, ref_bf16.f32_to_bf16(noise))
    assert same_e4m3(got.view(torch.uint8).numpy(), want)


# ------------------------------------------------------------------------------------ A peel decode

@jit
def _decode_probe(codes_ptr, out_ptr, count, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = i < count
    tl.store(out_ptr + i, peel.e4m3_value(tl.load(codes_ptr + i, mask=live, other=0).to(tl.int32)), mask=live)


def test_e4m3_decode_is_exact_on_every_code():
    """The A peel's decode (bits → f32 subnormal or normal, times 2^120): every finite code to
    its value bit for bit (−0 included); the NaN codes decode as ±480 (never in A′ or F_B)."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    got = torch.empty(256, dtype=torch.float32)
    _probe(_decode_probe, 256, codes, got)
    want = ref_e4m3.e4m3_to_f32(np.arange(256))
    finite = ~ref_e4m3.is_nan_code(np.arange(256))
    assert np.array_equal(got.numpy().view(np.uint32)[finite], want.view(np.uint32)[finite])
    assert got[0x7F].item() == 480.0 and got[0xFF].item() == -480.0
