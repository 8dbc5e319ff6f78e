"""kernels.int7 seeds, noise and the A-side row preparation against proof.int7 and literal
references (bit-exact)."""
import numpy as np
import pytest
import torch

from kernels.int7 import noise as device_noise
from kernels.int7.blake3 import bytes_from_words, words_from_bytes
from kernels.int7 import activations
from kernels.int7.activations import ActivationError, prepare_rows
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
    with pytest.raises(SeedError, match="need the dimension"):
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
    together = device_noise.noise_factors(key_words, ref_noise.LABEL_A, rows, k, rank)  # one launch
    assert torch.equal(together[1], first) and torch.equal(together[2], second)
    assert torch.equal(together[0], device_noise.uniform_factor(key_words, ref_noise.LABEL_A, rows, rank))
    for i, key in enumerate(keys):
        ref_u = ref_noise.uniform_factor(key, ref_noise.LABEL_B, range(rows), rank)
        ref_first, ref_second = ref_noise.sparse_factor(key, ref_noise.LABEL_A, k, rank)
        assert np.array_equal(uniform[i].cpu().numpy(), ref_u)
        assert np.array_equal(first[i].cpu().numpy(), ref_first)
        assert np.array_equal(second[i].cpu().numpy(), ref_second)
        expected = ref_noise.noised(x[i].cpu().numpy(), ref_noise.apply_sparse(ref_u, ref_first, ref_second))
        assert np.array_equal(x_noised[i].cpu().numpy(), expected)


def _dense_p(first: np.ndarray, second: np.ndarray, rank: int) -> np.ndarray:
    p = np.zeros((len(first), rank), dtype=np.int64)
    p[np.arange(len(first)), first] = 1
    p[np.arange(len(first)), second] = -1
    return p


def test_prepare_rows_quantises_like_torch_round_and_computes_a_times_p_b():
    rng = np.random.default_rng(12)
    rank, k, instances, rows = 64, 1024 + 64, 2, 16
    key_words = torch.from_numpy(rng.integers(-2**31, 2**31, (instances, 8), dtype=np.int32)).to(DEVICE)
    first, second = device_noise.sparse_factor(key_words, ref_noise.LABEL_B, k, rank)
    x = torch.from_numpy(rng.standard_normal((instances, rows, k)).astype(np.float32)).to(DEVICE)
    x[0, 3] = 0.0  # an all-zero row keeps scale 1
    x[1, 5, :4] = torch.tensor([1.0, 0.5 / 64, 1.5 / 64, -2.5 / 64])  # exact halves: ties to even
    x[1, 5, 4:] = 0.0
    x = x.bfloat16()
    p_b = device_noise.dense_sparse_factor(first, second, rank)
    q, scale, apb = prepare_rows(x, p_b, rows_per_instance=rows)
    values = x.float()
    amax = values.abs().amax(-1)
    expected_scale = torch.where(amax > 0, amax / 64, torch.ones_like(amax))
    expected_q = torch.round(values / expected_scale[..., None]).clamp(-64, 64).to(torch.int8)
    assert torch.equal(scale, expected_scale) and torch.equal(q, expected_q)
    assert q[1, 5, :4].tolist() == [64, 0, 2, -2]
    for i in range(instances):
        p = _dense_p(first[i].cpu().numpy(), second[i].cpu().numpy(), rank)
        assert np.array_equal(p_b[i].cpu().numpy(), p)
        assert np.array_equal(apb[i].cpu().numpy(), q[i].cpu().numpy().astype(np.int64) @ p)


@pytest.mark.parametrize("target_programs", [264, 1])  # k-split with atomics; one split, plain stores
def test_prepare_rows_on_int7_codes_with_a_shared_factor(monkeypatch, target_programs):
    monkeypatch.setattr(activations, "_TARGET_PROGRAMS", target_programs)
    rng = np.random.default_rng(13)
    rank, k = 32, 1024
    first = torch.from_numpy(rng.integers(0, rank, (1, k), dtype=np.int32)).to(DEVICE)
    second = first ^ 1
    p_b = device_noise.dense_sparse_factor(first, second, rank)
    codes = torch.from_numpy(rng.integers(-64, 65, (32, k), dtype=np.int8)).to(DEVICE)
    scale = torch.rand(32, device=DEVICE)
    q, out_scale, apb = prepare_rows(codes, p_b, rows_per_instance=32, scale=scale)
    assert q is codes and out_scale is scale
    p = _dense_p(first[0].cpu().numpy(), second[0].cpu().numpy(), rank)
    assert np.array_equal(apb.cpu().numpy(), codes.cpu().numpy().astype(np.int64) @ p)
    with pytest.raises(ActivationError, match="multiple of 16"):
        prepare_rows(codes, p_b, rows_per_instance=24, scale=scale)
    with pytest.raises(ActivationError, match="with their scale"):
        prepare_rows(codes, p_b, rows_per_instance=32)
    with pytest.raises(ActivationError, match="int8 P_B"):
        prepare_rows(codes, p_b[:, :512], rows_per_instance=32, scale=scale)


@pytest.mark.parametrize("instances, rows, k, rank, shared", [
    (2, 64, 1024 + 8, 32, False),  # 64-row programs (4 warps), a part-empty last column step
    (1, 128, 300, 128, True),      # two 64-row programs, one factor for every instance
    (1, 192, 256, 256, False),     # 192 rows: 64-row programs; rank 256
])
def test_noised_on_the_tensor_cores_matches_reference_and_the_gather_kernel(monkeypatch, instances, rows, k,
                                                                            rank, shared):
    gen = torch.Generator().manual_seed(rows + k)
    x = torch.randint(-64, 65, (instances, rows, k), dtype=torch.int8, generator=gen)
    uniform = torch.randint(-32, 32, (instances, rows, rank), dtype=torch.int8, generator=gen)
    first = torch.randint(0, rank, (1 if shared else instances, k), dtype=torch.int32, generator=gen)
    second = (first + torch.randint(1, rank, first.shape, dtype=torch.int32, generator=gen)) % rank
    args = [t.to(DEVICE) for t in (x, uniform, first, second)]
    on_tensor_cores = device_noise.noised(*args)
    for i in range(instances):
        f, s = first[0 if shared else i].numpy(), second[0 if shared else i].numpy()
        expected = ref_noise.noised(x[i].numpy(), ref_noise.apply_sparse(uniform[i].numpy(), f, s))
        assert np.array_equal(on_tensor_cores[i].cpu().numpy(), expected)
    monkeypatch.setattr(device_noise, "LOAD_DENSE_P", not device_noise.LOAD_DENSE_P)  # the other form of P
    assert torch.equal(device_noise.noised(*args), on_tensor_cores)
    monkeypatch.setattr(device_noise, "_MMA_ROWS", ())  # every row count takes the gather kernel
    assert torch.equal(device_noise.noised(*args), on_tensor_cores)
