"""kernels.int7.codes_and_leaves: the quantiser that hashes the codes it writes gives the quantiser's
scales and its codes except at exact ties (there: round-half-even of the exact product
x · fl(1/scale)), and leaves whose trees have `proof.blake3tree`'s roots over those codes, on random
rows with planted ties: bf16 / fp16 / fp32, several rows-per-program splits (K = 1024 · c), dense
instances and one MoE instance, partial last programs; and it refuses what it does not take. Runs
in Triton's interpreter without a GPU."""
import struct

import numpy as np
import pytest
import torch

from kernels.int7 import codes_and_leaves as fused, pipeline
from kernels.int7.activations import ActivationError, quantise_rows
from kernels.int7.blake3 import trees_from_leaves
from kernels.int7.pipeline import MinedPass, bound_words, prepare_job
from proof.blake3tree import keyed_tree_root
from proof.int7 import MiningConfig, commit_instance, instance_tickets, ticket_value, verify_plain_proof

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BITS = 0x207FFFFF  # an easy target: every ticket meets T0·h·w·D
HEADER = struct.pack("<I", 0) + b"\x01" * 32 + b"\x02" * 32 + struct.pack("<II", 0x66666666, BITS)


@pytest.fixture
def small_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Test-sized launches: the prefill threshold lowered (it only picks where the kernel runs)."""
    monkeypatch.setattr(fused, "MIN_ROWS", 16)


def _random_keys(instances: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randint(-2**31, 2**31, (instances, 8), generator=gen, dtype=torch.int64).to(torch.int32).to(DEVICE)


def _product_codes(x: torch.Tensor) -> torch.Tensor:
    """The codes of bf16 / fp16 rows by the product: round-half-even of x·boost·fl(1/(scale·boost))
    taken exactly (a product of two float32 values is exact in float64)."""
    xf = x.float()
    amax = xf.abs().amax(-1, keepdim=True)
    scale = torch.where(amax > 0, amax / 64, torch.ones_like(amax))
    boost = torch.where(amax < 2.0 ** -60, torch.full_like(amax, 2.0 ** 64), torch.ones_like(amax))
    inv = torch.ones_like(scale) / (scale * boost)  # float32, rounded to nearest
    return torch.round((xf * boost).double() * inv.double()).to(torch.int8)


def _plant_ties(x: torch.Tensor) -> None:
    """Row 2 of instance 0: max 3 (scale 3/64, whose reciprocal is inexact) and a few values at
    exact half-integer quotients (k + ½)·3/64 that the product rounds away from the even code."""
    x[0, 2] = 0
    x[0, 2, 0] = 3.0
    x[0, 2, 1:5] = torch.tensor([0.5, 2.5, -4.5, 10.5]) * 3 / 64


def _protocol_roots(keys: torch.Tensor, q: torch.Tensor, instances: int) -> torch.Tensor:
    """Each instance's keyed 1024-byte-leaf tree root over its codes, by proof.blake3tree."""
    data = q.cpu().view(instances, -1)
    key_rows = keys.cpu().expand(instances, 8)
    roots = [keyed_tree_root(key_rows[i].numpy().astype("<i4").tobytes(), data[i].numpy().tobytes(), 1024)
             for i in range(instances)]
    return torch.frombuffer(bytearray(b"".join(roots)), dtype=torch.int32).view(instances, 8)


@pytest.mark.parametrize("k, rows_per_instance, instances, dtype, per_instance_keys", [
    (1024, 16, 3, torch.bfloat16, False),  # a chunk a row: 128 rows a program (48 live)
    (3072, 25, 2, torch.bfloat16, True),  # 2048 + 1024 in registers, 42 rows a program: an instance
    # boundary inside the first program, the second partial
    (6144, 24, 1, torch.bfloat16, False),  # GLM-5's K (4096 + 2048), one instance (MoE), 21 rows a program
    (2048, 16, 2, torch.float16, True),
    (3072, 16, 2, torch.float32, False),  # fp32 rows divide
])
def test_codes_and_leaves_equal_the_quantiser_and_the_chunk_kernel(small_rows, k, rows_per_instance, instances,
                                                                    dtype, per_instance_keys) -> None:
    gen = torch.Generator().manual_seed(k + rows_per_instance)
    x = (torch.randn(instances, rows_per_instance, k, generator=gen) * 2).to(dtype)
    x[0, 1] = 0  # an all-zero row: scale 1
    _plant_ties(x)
    x = x.to(DEVICE)
    keys = _random_keys(instances if per_instance_keys else 1, gen)
    q, scale, leaves = fused.codes_and_leaves(x, keys, rows_per_instance=rows_per_instance)
    q_ref, scale_ref = quantise_rows(x)
    assert torch.equal(scale, scale_ref)
    if dtype == torch.float32:  # fp32 rows divide, as the quantiser does
        assert torch.equal(q, q_ref)
    else:
        assert torch.equal(q.cpu(), _product_codes(x.cpu()))
        differ = (q != q_ref).cpu()
        quotient = x.double() / scale_ref.double()[..., None]
        assert bool(((quotient.cpu() % 1) == 0.5)[differ].all())  # only at exact ties
        assert int(differ[0, 2].sum()) >= 2  # the planted ties the product rounds off even
    assert leaves.shape == (instances, rows_per_instance * k // 1024, 8)
    assert torch.equal(trees_from_leaves(keys, leaves).roots.cpu(), _protocol_roots(keys, q, instances))


@pytest.mark.parametrize("shape, dtype, rows_per_instance, why", [
    ((64, 1000), torch.bfloat16, 64, "multiple of 1024"),
    ((64, 1024), torch.int8, 64, "floating"),
    ((64, 65536), torch.bfloat16, 64, "one pass"),
    ((64, 1024), torch.bfloat16, 1, "more than one chunk"),
    ((64, 1024), torch.bfloat16, 48, "instances"),
])
def test_what_it_does_not_take_is_refused(small_rows, shape, dtype, rows_per_instance, why) -> None:
    x = torch.zeros(shape, dtype=dtype)
    assert not fused.fits(x, rows_per_instance), why
    with pytest.raises(ActivationError, match="codes_and_leaves needs"):
        fused.codes_and_leaves(x, torch.zeros(1, 8, dtype=torch.int32), rows_per_instance=rows_per_instance)


def test_decode_sized_launches_and_bad_keys_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.zeros(64, 2048, dtype=torch.bfloat16)
    assert not fused.fits(x, 64)  # below MIN_ROWS: the decode A side keeps these
    monkeypatch.setattr(fused, "MIN_ROWS", 16)
    with pytest.raises(ActivationError, match="keys must be int32"):
        fused.codes_and_leaves(x, torch.zeros(3, 8, dtype=torch.int32), rows_per_instance=32)


@pytest.mark.parametrize("moe", [False, True])
def test_the_mined_pass_with_codes_and_leaves_serves_a_b_and_its_planted_winner_verifies(small_rows, monkeypatch,
                                                                                         moe) -> None:
    """Floating rows whose codes are known (each row's maximum is 64, so its scale is 1 and its
    codes are its values) through `MinedPass.run` with the switch on: A·B exact, and the proof of
    a planted winner verifies with proof.int7 (dense V3 salted, MoE V2)."""
    monkeypatch.setattr(pipeline, "CODES_AND_LEAVES", True)
    experts, m, n, k, top_k = 4 if moe else 2, 16, 32, 1024, 2
    tokens = experts * m // top_k
    rng = np.random.default_rng(31 + moe)
    weights = rng.integers(-64, 65, (experts, n, k), dtype=np.int8)
    acts = rng.integers(-63, 64, (tokens, k) if moe else (experts, m, k), dtype=np.int8)
    acts[..., 7] = 64
    routing = [[t for t in range(tokens) if t % 2 == e % 2] for e in range(experts)]  # 16 tokens an expert
    config = MiningConfig(k, 64, list(range(2)), list(range(16)), experts if moe else 0, top_k if moe else 0)
    refs = ([commit_instance(HEADER, config, acts, weights.reshape(experts * n, k), cert_version=2, routing=routing)]
            if moe else [commit_instance(HEADER, config, acts[e], weights[e], cert_version=3) for e in range(experts)])
    job = prepare_job(torch.from_numpy(weights).to(DEVICE), torch.ones(experts, n, device=DEVICE), header76=HEADER,
                      config=config, cert_version=2 if moe else 3, bound=0, moe=moe)
    wins = [(w.expert if moe else e, w) for e, ref in enumerate(refs) for w in instance_tickets(ref)]
    best = min(wins, key=lambda w: ticket_value(w[1].ticket))
    job.bound.copy_(bound_words(ticket_value(best[1].ticket), DEVICE))
    mined = MinedPass(job, m, tokens=tokens if moe else None, write_i32=True, fused_a=False)
    x = torch.from_numpy(acts).to(torch.bfloat16).to(DEVICE)
    mined.run(x, torch.tensor(routing, dtype=torch.int32, device=DEVICE) if moe else None)
    rows = acts[np.array(routing)] if moe else acts
    expected = np.einsum("emk,enk->emn", rows.astype(np.int64), weights.astype(np.int64))
    assert np.array_equal(mined.out_i32.cpu().numpy(), expected)
    assert mined.winner_record()["ticket"] == best[1].ticket
    assert verify_plain_proof(HEADER, mined.take_proof(), bits=BITS, cert_version=2 if moe else 3) == (True, "ok")
