"""The peel as its own pass: Qᵀ = B'·P_A is exact, and raw A'·B' minus both rank-r terms is A·B
bit for bit (three and four digits of Q), and the bf16 output is those values dequantised."""
import numpy as np
import pytest
import torch

from kernels.int7.mined_gemm import MinedGemmError, Tiling
from kernels.int7.noise import dense_sparse_factor
from kernels.int7.split_peel import noise_product, peel_digits, peel_operands, q_limbs, split_peel

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
E, M, N, K, R = 2, 32, 64, 512, 64


def _sparse(rng, k):
    first = rng.integers(0, R, (E, k))
    second = (first + rng.integers(1, R, (E, k))) % R  # never equal to first
    return first, second


def _noised(x, u, first, second):
    """X + U·Pᵀ with P row l = +1 at first[l], −1 at second[l]."""
    return x + np.take_along_axis(u, first[:, None, :], 2) - np.take_along_axis(u, second[:, None, :], 2)


def _dense(first, second):
    return dense_sparse_factor(torch.from_numpy(first).int().to(DEVICE), torch.from_numpy(second).int().to(DEVICE), R)


@pytest.fixture(scope="module")
def operands():
    rng = np.random.default_rng(5)
    a = rng.integers(-64, 65, (E, M, K)).astype(np.int64)
    b = rng.integers(-64, 65, (E, N, K)).astype(np.int64)
    u_a, u_b = rng.integers(-32, 32, (E, M, R)), rng.integers(-32, 32, (E, N, R))
    fa, sa_idx = _sparse(rng, K)
    fb, sb_idx = _sparse(rng, K)
    a_noised, b_noised = _noised(a, u_a, fa, sa_idx), _noised(b, u_b, fb, sb_idx)
    p_a, p_b = _dense(fa, sa_idx), _dense(fb, sb_idx)
    t = lambda x, dtype: torch.from_numpy(np.ascontiguousarray(x)).to(dtype).to(DEVICE)  # noqa: E731
    return {
        "exact": np.einsum("emk,enk->emn", a, b),
        "raw": np.einsum("emk,enk->emn", a_noised, b_noised).astype(np.int32),
        "bt_noised": t(b_noised, torch.int8), "b_noised": b_noised, "p_a_np": p_a.cpu().numpy().astype(np.int64),
        "p_a_t": p_a.transpose(1, 2).contiguous(),
        "u_a": t(u_a, torch.int8), "u_b": t(u_b, torch.int8),
        "apb": t(np.einsum("emk,ekr->emr", a, p_b.cpu().numpy().astype(np.int64)), torch.int32),
        "scale_a": torch.rand(E, M, device=DEVICE), "scale_b": torch.rand(E, N, device=DEVICE),
    }


def test_noise_product_is_b_noised_times_p_a(operands):
    q_t = torch.empty((E, N, R), dtype=torch.int32, device=DEVICE)
    noise_product(operands["bt_noised"], operands["p_a_t"], q_t)
    expected = np.einsum("enk,ekr->enr", operands["b_noised"], operands["p_a_np"])
    assert np.array_equal(q_t.cpu().numpy(), expected)


@pytest.mark.parametrize("k_bound", [K, 70_000])  # three digits of Q, and all four past 2^23 / 127
def test_split_peel_recovers_a_times_b_exactly(operands, k_bound):
    assert q_limbs(k_bound) == (3 if k_bound == K else 4)
    q_t = torch.empty((E, N, R), dtype=torch.int32, device=DEVICE)
    noise_product(operands["bt_noised"], operands["p_a_t"], q_t)
    raw = torch.from_numpy(operands["raw"].copy()).to(DEVICE)  # peeled in place
    out = torch.empty((E, M, N), dtype=torch.bfloat16, device=DEVICE)
    split_peel(raw, operands["u_a"], q_t, operands["apb"], operands["u_b"], operands["scale_a"],
               operands["scale_b"], k=k_bound, out=out, exact_in_place=True,
               tiling=Tiling(16, 32, 32, num_warps=4))  # 4 k steps a digit, several blocks
    assert np.array_equal(raw.cpu().numpy(), operands["exact"])
    dequant = raw.float() * operands["scale_a"][:, :, None] * operands["scale_b"][:, None, :]
    # one bf16 step: the GPU rounds to nearest even, Triton's CPU interpreter may truncate
    assert torch.allclose(out.float(), dequant, rtol=2 ** -7, atol=0)


def test_bad_shapes_are_named(operands):
    raw = torch.zeros((E, M, N), dtype=torch.int32, device=DEVICE)
    q_t = torch.zeros((E, N, R), dtype=torch.int32, device=DEVICE)
    out = torch.empty((E, M, N), dtype=torch.bfloat16, device=DEVICE)
    args = (operands["u_a"], q_t, operands["apb"], operands["u_b"], operands["scale_a"], operands["scale_b"])
    with pytest.raises(MinedGemmError, match="q_t must be contiguous"):
        split_peel(raw, operands["u_a"], q_t[:, :, :32], *args[2:], k=K, out=out)
    with pytest.raises(MinedGemmError, match="not a multiple of the peel block 48"):
        split_peel(raw, *args, k=K, out=out, tiling=Tiling(16, 48, 32))
    left, right = peel_operands(E, M, N, R, K, DEVICE)
    with pytest.raises(MinedGemmError, match="digit columns for rank"):
        peel_digits(raw, left[:, :, :R], right, operands["scale_a"], operands["scale_b"], rank=R, out=out)
    with pytest.raises(MinedGemmError, match="right must be contiguous"):
        peel_digits(raw, left, right[:, :M], operands["scale_a"], operands["scale_b"], rank=R, out=out)
    with pytest.raises(MinedGemmError, match="nothing would be written"):
        noise_product(operands["bt_noised"], operands["p_a_t"], None)
