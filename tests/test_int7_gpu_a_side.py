"""kernels.int7.a_side (the fused decode A side) bit-exact against proof.int7 and a literal A·P_B,
and equal to the staged kernels, on random instances (interpreted on CPU, compiled on a GPU)."""
import numpy as np
import pytest
import torch

from kernels.int7.a_side import ASideError, fused_a_side, fused_applies, noised_a_side, side_chain_split
from kernels.int7.blake3 import bytes_from_words, words_from_bytes
from kernels.int7.noise import dense_sparse_factor, sparse_factor as device_sparse_factor
from proof.int7 import LABEL_B, commitment, noise_a_rows, noise_seeds, noised
from proof.int7.noise import sparse_factor

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _words(rows: list[bytes]) -> torch.Tensor:
    return torch.stack([words_from_bytes(r, DEVICE) for r in rows])


def _instances(seed, experts, rows, k, salted):
    """A job key, random int7 rows (E, M, K) and each instance's (s_B, s_A) by proof.int7."""
    rng = np.random.default_rng(seed)
    key = rng.bytes(32)
    acts = rng.integers(-64, 65, (experts, rows, k), dtype=np.int8)
    hashes_b = [rng.bytes(32) for _ in range(experts)]
    seeds = [noise_seeds(key, commitment(key, acts[e].tobytes()), hashes_b[e], salted=salted, m=rows, n=48)
             for e in range(experts)]
    return key, acts, seeds


@pytest.mark.parametrize("experts, rows, k, rank, salted, seed", [
    (2, 16, 512, 32, True, 1),    # 8 chunks per instance, one column block
    (1, 32, 192, 64, False, 2),   # K not a multiple of 128 (k steps of 64), 6 chunks, unsalted
    (1, 64, 256, 128, True, 3),   # 16 chunks, 2 column blocks of 128
    (2, 16, 64, 32, True, 4),     # a one-chunk tree (its leaf is the root)
])
def test_fused_a_side_matches_reference(experts, rows, k, rank, salted, seed):
    key, acts, seeds = _instances(seed, experts, rows, k, salted)
    s_b = _words([s for s, _ in seeds])
    first, second = device_sparse_factor(s_b, LABEL_B, k, rank)
    a_noised, apb, s_a = fused_a_side(torch.from_numpy(acts).to(DEVICE), s_b, _words([key]),
                                      dense_sparse_factor(first, second, rank), rank=rank, salted=salted)
    for e, (seed_b, seed_a) in enumerate(seeds):
        assert bytes_from_words(s_a[e]) == seed_a
        expected = noised(acts[e], noise_a_rows(seed_a, k, rank, range(rows)))
        assert np.array_equal(a_noised[e].cpu().numpy(), expected)
        plus, minus = sparse_factor(seed_b, LABEL_B, k, rank)
        p_b = np.zeros((k, rank), dtype=np.int64)  # literal dense P_B
        for row in range(k):
            p_b[row, plus[row]] += 1
            p_b[row, minus[row]] -= 1
        assert np.array_equal(apb[e].cpu().numpy(), acts[e].astype(np.int64) @ p_b)


@pytest.mark.parametrize("experts, rows, k, rank, salted, seed, warps, split", [
    (2, 16, 576, 32, True, 5, 4, 1),    # 256-column steps and a 64-column tail
    (1, 32, 320, 64, False, 6, 2, 1),   # 64-column steps, unsalted, two rounds of chunk lanes
    (1, 64, 192, 128, True, 7, 8, 1),   # 128 + 64
    (2, 16, 64, 32, False, 8, 4, 1),    # only the tail; a one-chunk tree (its leaf is the root)
    (2, 16, 576, 32, True, 9, 4, 3),    # three programs an instance: 256 + 256 + a 64-column tail
    (1, 32, 320, 64, False, 10, 2, 2),  # two: 192 + 128 columns
    (2, 16, 64, 32, False, 11, 4, 4),   # four, three of them with no columns
])
def test_side_chain_kernel_matches_reference(experts, rows, k, rank, salted, seed, warps, split):
    """The lagged pass's one-kernel side chain (`noised_a_side`) into static buffers: s_A and A'
    against proof.int7, K ending in a tail of the kernel's column loop; it also copies the rows
    and stores the row count (the lagged state), at every program width it takes, and with an
    instance's columns split over several programs (their hand-off words end zeroed)."""
    key, acts, seeds = _instances(seed, experts, rows, k, salted)
    a_noised = torch.zeros((experts, rows, k), dtype=torch.int8, device=DEVICE)
    s_a = torch.zeros((experts, 8), dtype=torch.int32, device=DEVICE)
    q_copy = torch.zeros_like(a_noised)
    valid = torch.zeros((experts,), dtype=torch.int32, device=DEVICE)
    sync = torch.zeros((2, experts), dtype=torch.int32, device=DEVICE)
    noised_a_side(torch.from_numpy(acts).to(DEVICE), _words([s for s, _ in seeds]), _words([key]),
                  rank=rank, salted=salted, a_noised=a_noised, s_a=s_a, q_copy=q_copy, valid=valid,
                  valid_rows=rows - 2, warps=warps, split=split, sync=sync)
    assert not sync.any()
    for e, (_, seed_a) in enumerate(seeds):
        assert bytes_from_words(s_a[e]) == seed_a
        expected = noised(acts[e], noise_a_rows(seed_a, k, rank, range(rows)))
        assert np.array_equal(a_noised[e].cpu().numpy(), expected)
    assert np.array_equal(q_copy.cpu().numpy(), acts)
    assert valid.tolist() == [rows - 2] * experts


def test_side_chain_split_keeps_about_64_programs():
    """2 programs an instance at E = 32 (GLM-5, DeepSeek-V3), 4 at E = 16 (Qwen3): the H200's best;
    at most 4, at least 1."""
    assert [side_chain_split(e) for e in (1, 8, 16, 32, 48, 64, 256)] == [4, 4, 4, 2, 1, 1, 1]


def test_noised_a_side_refuses_bad_buffers():
    experts, rows, k, rank = 2, 16, 128, 32
    a_noised = torch.zeros((experts, rows, k), dtype=torch.int8, device=DEVICE)
    s_a = torch.zeros((experts, 8), dtype=torch.int32, device=DEVICE)
    with pytest.raises(ASideError, match="a_noised must be"):
        noised_a_side(a_noised, s_a, s_a[:1], rank=rank, salted=True, a_noised=a_noised[:, :8], s_a=s_a)
    with pytest.raises(ASideError, match="must be contiguous"):
        noised_a_side(a_noised, s_a, s_a[:1], rank=rank, salted=True, a_noised=a_noised,
                      s_a=torch.zeros((8, experts), dtype=torch.int32, device=DEVICE).t())
    with pytest.raises(ASideError, match="q_copy must be"):
        noised_a_side(a_noised, s_a, s_a[:1], rank=rank, salted=True, a_noised=a_noised, s_a=s_a,
                      q_copy=a_noised[:1])
    with pytest.raises(ASideError, match="takes"):
        noised_a_side(a_noised, s_a, s_a[:1], rank=rank, salted=True, a_noised=a_noised, s_a=s_a, warps=16)
    with pytest.raises(ASideError, match="split must be"):
        noised_a_side(a_noised, s_a, s_a[:1], rank=rank, salted=True, a_noised=a_noised, s_a=s_a, split=0)
    with pytest.raises(ASideError, match="sync must be"):
        noised_a_side(a_noised, s_a, s_a[:1], rank=rank, salted=True, a_noised=a_noised, s_a=s_a, split=2,
                      sync=torch.zeros((2, experts + 1), dtype=torch.int32, device=DEVICE))


def test_fused_a_side_shapes_and_bad_input():
    assert fused_applies(16, 6144, 128) and fused_applies(64, 4096, 128)
    assert not fused_applies(48, 4096, 128) and not fused_applies(128, 4096, 128)
    assert not fused_applies(16, 4096 + 32, 128) and not fused_applies(16, 4096, 512)
    q = torch.zeros((1, 16, 128), dtype=torch.int8, device=DEVICE)
    s_b = torch.zeros((1, 8), dtype=torch.int32, device=DEVICE)
    p_b = torch.zeros((1, 128, 32), dtype=torch.int8, device=DEVICE)
    with pytest.raises(ASideError, match="M in"):
        fused_a_side(torch.zeros((1, 48, 128), dtype=torch.int8, device=DEVICE), s_b, s_b, p_b,
                     rank=32, salted=True)
    with pytest.raises(ASideError, match="q must be"):
        fused_a_side(q.float(), s_b, s_b, p_b, rank=32, salted=True)
    with pytest.raises(ASideError, match="p_b must be"):
        fused_a_side(q, s_b, s_b, p_b[:, :64], rank=32, salted=True)
    with pytest.raises(ASideError, match="key_words must be"):
        fused_a_side(q, s_b, s_b.view(8), p_b, rank=32, salted=True)
