"""kernels.int7 seeds, noise and quantisation against proof.int7 (bit-exact)."""
import numpy as np
import pytest
import torch

from kernels.int7 import noise as device_noise
from kernels.int7.blake3 import bytes_from_words, words_from_bytes
from kernels.int7.quant import QuantError, quantize_int7
from kernels.int7.seeds import SeedError, noise_seed_a, noise_seed_b
from proof.int7 import noise as ref_noise
from proof.int7 import noise_seeds

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _w(data: bytes) -> torch.Tensor:
    return words_from_bytes(data, DEVICE).view(1, 8)


@pytest.mark.parametrize("salted, s_b, s_a", [
    (False, "add6f7ea5feebf89c8a77e2ebfa0d82442e7dbb0046dbd48971861d12fcb0177",
     "483b07b6f73105030b9482255f37723f3fed69ae916724ee8291848b8c28794b"),
    (True, "60ed9b73c5a9599b200b6cd563e7f0d5d9a67d2402d85fd4ef966c580080d0e5",
     "301784168005ec833ab0aa60006f7fe7faaa95307d8c1fc6819b2ffdd717eccf"),
])
def test_seed_chain_pinned_vectors(salted, s_b, s_a):
    device_s_b = noise_seed_b(_w(b"\x11" * 32), _w(b"\xbb" * 32), salted_seeds=salted, n=320)
    device_s_a = noise_seed_a(device_s_b, _w(b"\xaa" * 32), salted_seeds=salted, m=192)
    assert bytes_from_words(device_s_b).hex() == s_b
    assert bytes_from_words(device_s_a).hex() == s_a


@pytest.mark.parametrize("salted", [False, True])
def test_moe_seed_chain_matches_reference(salted):
    rng = np.random.default_rng(int(salted))
    job_key, h_a, h_b, h_r, h_o = (rng.bytes(32) for _ in range(5))
    expected = noise_seeds(job_key, h_a, h_b, salted=salted, m=48, n=64, routing_hash=h_r, offsets_hash=h_o)
    s_b = noise_seed_b(_w(job_key), _w(h_b), salted_seeds=salted, n=64)
    s_a = noise_seed_a(s_b, _w(h_a), salted_seeds=salted, m=48, routing_hash=_w(h_r), offsets_hash=_w(h_o))
    assert (bytes_from_words(s_b), bytes_from_words(s_a)) == expected


def test_seed_arguments_are_checked():
    with pytest.raises(SeedError, match="need n"):
        noise_seed_b(_w(bytes(32)), _w(bytes(32)), salted_seeds=True)
    with pytest.raises(SeedError, match="both routing_hash and offsets_hash"):
        noise_seed_a(_w(bytes(32)), _w(bytes(32)), salted_seeds=False, routing_hash=_w(bytes(32)))


@pytest.mark.parametrize("rank, k", [(32, 1024 + 8), (128, 2048)])
def test_noise_factors_and_noised_operands_match_reference(rank, k):
    rng = np.random.default_rng(rank)
    keys = [rng.bytes(32), rng.bytes(32)]
    key_words = torch.stack([words_from_bytes(key, DEVICE) for key in keys])
    rows = 3
    uniform = device_noise.uniform_factor(key_words, ref_noise.LABEL_B, rows, rank)
    first, second = device_noise.sparse_factor(key_words, ref_noise.LABEL_A, k, rank)
    x = torch.from_numpy(rng.integers(-64, 65, (2, rows, k), dtype=np.int8)).to(DEVICE)
    x_noised = device_noise.noised(x, uniform, first, second)
    for i, key in enumerate(keys):
        ref_u = ref_noise.uniform_factor(key, ref_noise.LABEL_B, range(rows), rank)
        ref_first, ref_second = ref_noise.sparse_factor(key, ref_noise.LABEL_A, k, rank)
        assert np.array_equal(uniform[i].cpu().numpy(), ref_u)
        assert np.array_equal(first[i].cpu().numpy(), ref_first)
        assert np.array_equal(second[i].cpu().numpy(), ref_second)
        expected = ref_noise.noised(x[i].cpu().numpy(), ref_noise.apply_sparse(ref_u, ref_first, ref_second))
        assert np.array_equal(x_noised[i].cpu().numpy(), expected)


def test_sparse_product_and_limbs_are_exact():
    rng = np.random.default_rng(11)
    rank, k = 32, 1024
    first = torch.from_numpy(rng.integers(0, rank, (1, k))).to(DEVICE)
    second = (first ^ 1).to(DEVICE)
    x = torch.from_numpy(rng.integers(-64, 65, (1, 5, k), dtype=np.int8)).to(DEVICE)
    product = device_noise.sparse_product(x, first, second, rank)
    p = np.zeros((k, rank), dtype=np.int64)
    p[np.arange(k), first[0].cpu().numpy()] = 1
    p[np.arange(k), second[0].cpu().numpy()] = -1
    assert np.array_equal(product[0].cpu().numpy(), x[0].cpu().numpy().astype(np.int64) @ p)
    values = torch.tensor([0, 1, -1, 127, -128, 40000, -4_194_304, 8_355_711, -8_355_711], dtype=torch.int32)
    limbs = device_noise.int8_limbs(values).long()
    assert torch.equal(limbs[0] + 256 * limbs[1] + 65536 * limbs[2], values.long())


def test_quantize_int7_range_and_scale():
    x = torch.tensor([[0.5, -2.0, 1.0], [0.0, 0.0, 0.0], [3.0, 1.5, -0.75]], dtype=torch.bfloat16)
    q, scale = quantize_int7(x)
    assert q.dtype == torch.int8 and int(q.abs().max()) == 64
    assert q[0].tolist() == [16, -64, 32] and q[1].tolist() == [0, 0, 0] and q[2].tolist() == [64, 32, -16]
    assert torch.allclose(scale, torch.tensor([2.0 / 64, 1.0, 3.0 / 64]))
    with pytest.raises(QuantError, match="floating-point"):
        quantize_int7(torch.zeros(2, 2, dtype=torch.int8))
