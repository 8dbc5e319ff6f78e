"""kernels.int7.activations: the int7 quantiser (reciprocal with exact tie repair, one read per
row, several rows per program) and A·P_B (K-major or row-major P_B, every block shape), against
literal references (IEEE division and torch.round; an int64 dense product)."""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from kernels.int7 import activations
from kernels.int7.activations import ActivationError, a_times_p_b, quantise_rows
from kernels.int7.noise import dense_sparse_factor

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Literal quantiser: IEEE float32 division, round half to even, clamp."""
    values = x.float().cpu()
    amax = values.abs().amax(-1)
    scale = torch.where(amax > 0, amax / 64, torch.ones_like(amax))
    return torch.round(values / scale[..., None]).clamp(-64, 64).to(torch.int8), scale


def _all_magnitudes(dtype: torch.dtype) -> torch.Tensor:
    """Every finite non-negative value of a 16-bit float type, ascending."""
    bits = torch.arange(0, 0x7C00 if dtype == torch.float16 else 0x7F80, dtype=torch.int32)
    return bits.to(torch.int16).view(dtype).float()


def _rows_below(amax: float, dtype: torch.dtype, k: int, rng: np.random.Generator) -> torch.Tensor:
    """Rows of k values of `dtype`: each starts with amax and holds values |x| ≤ amax, together
    every such value of the type once (both signs), the last row padded with zeros."""
    magnitudes = _all_magnitudes(dtype)
    values = magnitudes[magnitudes <= amax].numpy()
    values = np.concatenate([values, -values[values > 0]])
    rng.shuffle(values)
    per_row = k - 1
    padded = np.zeros(-(-len(values) // per_row) * per_row, dtype=np.float32)
    padded[:len(values)] = values
    rows = np.concatenate([np.full((len(padded) // per_row, 1), amax, np.float32),
                           padded.reshape(-1, per_row)], axis=1)
    return torch.from_numpy(rows).to(dtype)


# Row maxima: ordinary, with an 8-bit mantissa, the largest finite, near and below 2^-60 (where
# the kernel boosts the row by 2^64), the smallest normal and a subnormal. Maxima with few
# mantissa bits have many exact ties x / scale = k + 1/2; an odd 8-bit mantissa or a subnormal
# maximum has (almost) none. For 0.875 and 0.8125 (at any power of two) x · fl(1/scale) rounds
# some ties the wrong way (3 and 1 values): only the tie repair gets them right.
BF16_MAXIMA = [(1.0, True), (0.875, True), (0.8125 * 2.0 ** -64, True), (3.140625, False),
               (0.0078125 * 1.4921875, False),
               (2.0 ** 100 * 1.9921875, False), (3.3895313892515355e38, False), (2.0 ** -60, True),
               (2.0 ** -61 * 1.5, True), (2.0 ** -126, True), (2.0 ** -130 * 1.5, False)]


@pytest.mark.parametrize("amax, with_ties", BF16_MAXIMA)
def test_quantise_every_bf16_value_below_the_row_maximum(amax, with_ties):
    rng = np.random.default_rng(1)
    x = _rows_below(amax, torch.bfloat16, 8192, rng).to(DEVICE)
    q, scale = quantise_rows(x)
    expected_q, expected_scale = _reference(x)
    assert torch.equal(scale.cpu(), expected_scale) and torch.equal(q.cpu(), expected_q)
    twice = x.float().cpu() / expected_scale[:, None] * 2  # ties: x / scale an odd half
    ties = (twice == twice.round()) & (twice.round().remainder(2) == 1)
    assert ties.sum() >= 16 or not with_ties, "the sample must hold exact ties (x / scale = k + 1/2)"


@pytest.mark.parametrize("amax", [1.0, 6.5e4, 2.0 ** -14 * 1.75, 2.0 ** -20])
def test_quantise_every_fp16_value_below_the_row_maximum(amax):
    x = _rows_below(amax, torch.float16, 8192, np.random.default_rng(2)).to(DEVICE)
    q, scale = quantise_rows(x)
    expected_q, expected_scale = _reference(x)
    assert torch.equal(scale.cpu(), expected_scale) and torch.equal(q.cpu(), expected_q)


def test_quantise_float32_rows_divide():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn((6, 1000), generator=gen)
    x[1, :64] = torch.arange(64) + 0.5  # amax 63.5, scale 63.5/64: many near-ties
    x[2] = 0.0
    q, scale = quantise_rows(x.to(DEVICE))
    expected_q, expected_scale = _reference(x)
    assert torch.equal(scale.cpu(), expected_scale) and torch.equal(q.cpu(), expected_q)


@pytest.mark.parametrize("rows, k, prefill_rows, one_pass_max, two_pass_block", [
    (37, 2048, 8, 32768, 8192),  # 4 rows per program, the last program part-empty
    (37, 3072, 8, 32768, 8192),  # 2 rows per program, each a 2048 block and a 1024 tail
    (5, 2112, 4096, 1024, 512),  # rows longer than the one-pass limit: two passes of 512
    (6, 2112, 4096, 32768, 8192),  # one pass: 2048 + a 64 tail
    (3, 6144, 4096, 32768, 8192),  # GLM-5 decode: one row per program, 4096 + 2048
    (2, 7168, 4096, 32768, 8192),  # DeepSeek-V3: 4096 + a 4096 tail with 3072 live
])
def test_quantise_program_shapes(monkeypatch, rows, k, prefill_rows, one_pass_max, two_pass_block):
    monkeypatch.setattr(activations, "_PREFILL_ROWS", prefill_rows)
    monkeypatch.setattr(activations, "_ONE_PASS_MAX", one_pass_max)
    monkeypatch.setattr(activations, "_TWO_PASS_BLOCK", two_pass_block)
    gen = torch.Generator().manual_seed(rows)
    x = (torch.randn((rows, k), generator=gen) * torch.logspace(-3, 3, rows)[:, None]).bfloat16()
    x[rows // 2] = 0.0  # an all-zero row keeps scale 1
    q, scale = quantise_rows(x.to(DEVICE))
    expected_q, expected_scale = _reference(x)
    assert torch.equal(scale.cpu(), expected_scale) and torch.equal(q.cpu(), expected_q)
    assert scale[rows // 2].item() == 1.0


def _dense(first: torch.Tensor, second: torch.Tensor, rank: int) -> np.ndarray:
    p = np.zeros((*first.shape, rank), dtype=np.int64)
    for i in range(first.shape[0]):
        p[i, np.arange(first.shape[1]), first[i].cpu().numpy()] = 1
        p[i, np.arange(first.shape[1]), second[i].cpu().numpy()] = -1
    return p


@pytest.mark.parametrize("instances, rows, k, rank, sms, k_major", [
    (2, 16, 1024, 64, 132, True),   # decode: 16-row blocks, a k-split with atomics
    (2, 16, 1024, 64, 132, False),  # the same from a (K, r)-contiguous P_B
    (1, 256, 512, 128, 1, True),    # 128-row blocks (8 warps), one split, plain stores
    (2, 64, 192, 32, 1, True),      # 64-row blocks, K a multiple of 64 only
])
def test_a_times_p_b_block_shapes(monkeypatch, instances, rows, k, rank, sms, k_major):
    monkeypatch.setattr(activations, "_SMS", sms)
    gen = torch.Generator().manual_seed(rows + k)
    first = torch.randint(0, rank, (instances, k), dtype=torch.int32, generator=gen)
    second = (first + torch.randint(1, rank, (instances, k), dtype=torch.int32, generator=gen)) % rank
    p_b = dense_sparse_factor(first.to(DEVICE), second.to(DEVICE), rank)
    assert p_b.shape == (instances, k, rank) and p_b.stride(1) == 1  # K-major storage
    if not k_major:
        p_b = p_b.contiguous()
    q = torch.randint(-64, 65, (instances, rows, k), dtype=torch.int8, generator=gen)
    apb = a_times_p_b(q.to(DEVICE), p_b, rows_per_instance=rows)
    p = _dense(first, second, rank)
    assert np.array_equal(p_b.cpu().numpy(), p)
    for i in range(instances):
        assert np.array_equal(apb[i].cpu().numpy(), q[i].numpy().astype(np.int64) @ p[i])


def test_bad_input_is_named():
    with pytest.raises(ActivationError, match="floating activations"):
        quantise_rows(torch.zeros((2, 64), dtype=torch.int8, device=DEVICE))
    with pytest.raises(ActivationError, match="int8 codes"):
        a_times_p_b(torch.zeros((16, 64), device=DEVICE), torch.zeros((1, 64, 32), dtype=torch.int8,
                                                                       device=DEVICE), rows_per_instance=16)


@pytest.mark.parametrize("rank", [128, 48])  # 48: a masked, power-of-two-wide zeroing block
def test_quantiser_clears_the_split_a_times_p_b_accumulator(rank):
    x = torch.randn((2, 16, 256), generator=torch.Generator().manual_seed(rank)).bfloat16().to(DEVICE)
    q = torch.empty(x.shape, dtype=torch.int8, device=DEVICE)
    scale = torch.empty(x.shape[:-1], dtype=torch.float32, device=DEVICE)
    poisoned = torch.full((2, 16, rank + 1), 7, dtype=torch.int32, device=DEVICE)
    accumulator = poisoned[..., :rank].contiguous()
    activations._quantise_into(x, q, scale, accumulator)
    assert torch.equal(accumulator.cpu(), torch.zeros((2, 16, rank), dtype=torch.int32))
    assert torch.equal(q.cpu(), _reference(x)[0].view(q.shape))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_prepare_rows_at_decode_matches(dtype):
    """16 rows per instance: the quantiser zeroing a k-split A·P_B's accumulator, then A·P_B."""
    gen = torch.Generator().manual_seed(5)
    rank, k = 64, 1024
    first = torch.randint(0, rank, (2, k), dtype=torch.int32, generator=gen)
    second = (first + torch.randint(1, rank, first.shape, dtype=torch.int32, generator=gen)) % rank
    p_b = dense_sparse_factor(first.to(DEVICE), second.to(DEVICE), rank)
    x = torch.randn((2, 16, k), generator=gen)
    x[1, 3] *= 2.0 ** -70  # a row below 2^-60: the boosted reciprocal
    x[0, 7] = 0.0  # an all-zero row: scale 1
    x = x.to(dtype).to(DEVICE)
    plan = activations._apb_plan(x.shape, p_b, 16)
    assert plan.splits > 1
    forked = []  # after_codes sees q once (the lagged pass forks its side chain there)
    q, scale, apb = activations.prepare_rows(x, p_b, rows_per_instance=16, after_codes=forked.append)
    assert len(forked) == 1 and forked[0] is q
    values = x.float().cpu()
    amax = values.abs().amax(-1)
    expected_scale = torch.where(amax > 0, amax / 64, torch.ones_like(amax))
    expected_q = torch.round(values / expected_scale[..., None]).to(torch.int8)
    assert torch.equal(q.cpu(), expected_q) and torch.equal(scale.cpu(), expected_scale)
    p = _dense(first, second, rank)
    for i in range(2):
        assert np.array_equal(apb[i].cpu().numpy(), expected_q[i].numpy().astype(np.int64) @ p[i])


def test_prepare_rows_makes_int8_codes_contiguous_before_a_times_p_b():
    """int8 codes pass through, but a strided view is copied before A·P_B's launch: the lagged
    GEMM overlaps A·P_B and reads q before waiting for it, so no copy may come between them."""
    gen = torch.Generator().manual_seed(8)
    rank, k = 16, 128
    first = torch.randint(0, rank, (1, k), dtype=torch.int32, generator=gen)
    second = (first + torch.randint(1, rank, first.shape, dtype=torch.int32, generator=gen)) % rank
    p_b = dense_sparse_factor(first.to(DEVICE), second.to(DEVICE), rank)
    codes = torch.randint(-64, 65, (1, 16, 2 * k), dtype=torch.int8, generator=gen).to(DEVICE)
    strided = codes[:, :, ::2]
    scale = torch.ones((1, 16), device=DEVICE)
    q, _, apb = activations.prepare_rows(strided, p_b, rows_per_instance=16, scale=scale)
    assert q.is_contiguous() and torch.equal(q.cpu(), strided.cpu())
    expected = strided[0].cpu().numpy().astype(np.int64) @ _dense(first, second, rank)[0]
    assert np.array_equal(apb[0].cpu().numpy(), expected)



def test_programmatic_dependent_launch_is_an_opt_out_lever(monkeypatch):
    """The launch keyword appears only when enabled; the interpreter never enables it, and
    PEARL_PDL=0 at import turns it off on a GPU too."""
    from kernels import triton_jit as _jit
    assert _jit.pdl_launch(True) == {"launch_pdl": True} and _jit.pdl_launch(False) == {}
    if _jit.INTERPRETING:
        assert not _jit.pdl_enabled()
    monkeypatch.setattr(_jit, "PDL", False)
    assert not _jit.pdl_enabled()
    code = "from kernels import triton_jit; print(triton_jit.PDL)"
    for value, expected in (("0", "False"), ("1", "True")):
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env={**os.environ, "PEARL_PDL": value}, timeout=120)
        assert run.stdout.strip() == expected, run.stderr[-500:]
