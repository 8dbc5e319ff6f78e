"""GPU check of the INT7 split pass on the CuTe GEMM (skipped without a GPU): the transcript GEMM
(kernels.int7.transcript_gemm) on an uneven grouped launch (an empty expert, row counts that are
not multiples of the tile) gives A'·B' exactly and every whole 2 × 128 tile's 16 words as
proof.int7's transcript; the peel GEMM (kernels.int7.peel_gemm) gives the Triton peel's bf16 bits;
through the pipeline (MinedPass(cute_split=True)) a planted winner's PlainProof verifies and the
tickets and outputs equal the Triton kernels'.
"""
import struct

import numpy as np
import pytest
import torch

from kernels.grouped_gemm_config import GroupedGemmConfig
from proof.int7 import MiningConfig, commit_instance, instance_tickets, ticket_value, tile_transcripts, verify_plain_proof

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SIZES = [38, 0, 130, 256, 6]
N, K = 384, 640
CONFIGS = ["128x128x128_c2x1_coop", "128x128x128_c1x1_coop", "128x128x128_c1x2_coop",
           "64x128x128_c1x1_pp", "64x128x128_c1x2_coop", "128x256x128_c1x1_coop"]  # the last: PREFILL_CONFIG


@pytest.mark.parametrize("key", CONFIGS)
def test_transcript_words_and_product_match_the_reference(key: str) -> None:
    from kernels.int7.transcript_gemm import transcript_gemm

    gen = np.random.default_rng(3)
    rows, experts = sum(SIZES), len(SIZES)
    a = gen.integers(-127, 128, size=(rows, K), dtype=np.int8)
    bt = gen.integers(-127, 128, size=(experts, N, K), dtype=np.int8)
    bounds = np.concatenate([[0], np.cumsum(SIZES)]).astype(np.int32)
    out = torch.empty((rows, N), dtype=torch.int32, device="cuda")
    words = torch.full((rows // 2, N // 128, 16), -1, dtype=torch.int32, device="cuda")
    transcript_gemm(torch.from_numpy(a).cuda(), torch.from_numpy(bt).cuda(), torch.from_numpy(bounds).cuda(),
                    out, words, GroupedGemmConfig.from_key(key))
    got = words.cpu().numpy().view(np.uint32)
    for e, size in enumerate(SIZES):
        lo = bounds[e]
        product = a[lo:lo + size].astype(np.int64) @ bt[e].astype(np.int64).T
        assert np.array_equal(out[lo:lo + size].cpu().numpy(), product.astype(np.int32)), f"expert {e} product"
        if size:
            want = tile_transcripts(a[lo:lo + size], bt[e], 128, np.arange(size).reshape(-1, 2),
                                    np.arange(N).reshape(-1, 128))
            assert np.array_equal(got[lo // 2:(lo + size) // 2], want), f"expert {e} transcript words"


@pytest.mark.parametrize("key", ["128x128x128_c1x1_coop", "64x128x128_c1x1_pp", "128x256x128_c1x1_coop"])
def test_gathered_rows_give_the_copied_rows_results(key: str) -> None:
    """MoE: the GEMM reading A′ rows through the routing gives the product and words of the same
    GEMM on the rows copied into expert order."""
    from kernels.int7.transcript_gemm import transcript_gemm

    gen = np.random.default_rng(4)
    rows, experts, tokens = sum(SIZES), len(SIZES), 97
    a = torch.from_numpy(gen.integers(-127, 128, size=(tokens, K), dtype=np.int8)).cuda()
    bt = torch.from_numpy(gen.integers(-127, 128, size=(experts, N, K), dtype=np.int8)).cuda()
    bounds = torch.from_numpy(np.concatenate([[0], np.cumsum(SIZES)]).astype(np.int32)).cuda()
    a_idx = torch.from_numpy(gen.integers(0, tokens, rows).astype(np.int32)).cuda()
    results = []
    for rows_in, idx in ((a[a_idx.long()], None), (a, a_idx)):
        out = torch.empty((rows, N), dtype=torch.int32, device="cuda")
        words = torch.full((rows // 2, N // 128, 16), -1, dtype=torch.int32, device="cuda")
        transcript_gemm(rows_in, bt, bounds, out, words, GroupedGemmConfig.from_key(key), a_idx=idx)
        results.append((out, words))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


@pytest.mark.parametrize("key", [None, "64x256x128_c1x1_pp"])  # the selector's; peel_gemm.PREFILL_CONFIG
def test_peel_gemm_gives_the_triton_peel_bits(key: str | None) -> None:
    from kernels.int7.peel_gemm import peel_gemm
    from kernels.int7.split_peel import peel_digits

    experts, m, n, depth = 3, 128, 256, 768
    gen = torch.Generator(device="cuda").manual_seed(5)
    left = torch.randint(-128, 128, (experts, m, depth), dtype=torch.int8, device="cuda", generator=gen)
    right = torch.randint(-128, 128, (experts, n, depth), dtype=torch.int8, device="cuda", generator=gen)
    raw = torch.randint(-2**31, 2**31 - 1, (experts, m, n), dtype=torch.int32, device="cuda", generator=gen)
    scale_a = torch.rand((experts, m), device="cuda", generator=gen) / 64
    scale_b = torch.rand((experts, n), device="cuda", generator=gen) / 64
    want = torch.empty((experts, m, n), dtype=torch.bfloat16, device="cuda")
    peel_digits(raw, left, right, scale_a, scale_b, rank=128, out=want)
    got = torch.empty_like(want)
    bounds = torch.arange(experts + 1, dtype=torch.int32, device="cuda") * m
    peel_gemm(left.view(-1, depth), right, bounds, raw.view(-1, n), scale_a.view(-1), scale_b, got.view(-1, n),
              None if key is None else GroupedGemmConfig.from_key(key))
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


BITS = 0x207FFFFF  # an easy target: every ticket meets the bound
HEADER = struct.pack("<I", 0) + b"\x01" * 32 + b"\x02" * 32 + struct.pack("<II", 0x66666666, BITS)


def test_pipeline_planted_winner_verifies_and_tickets_equal_the_triton_kernels() -> None:
    from kernels.int7.mined_gemm import DUMP_WORDS
    from kernels.int7.pipeline import SPLIT_PEEL_FROM_ROWS, MinedPass, bound_words, prepare_job

    experts, m, n, k = 2, SPLIT_PEEL_FROM_ROWS, 256, 2048
    rng = np.random.default_rng(31)
    weights = rng.integers(-64, 65, (experts, n, k), dtype=np.int8)
    acts = rng.integers(-64, 65, (experts, m, k), dtype=np.int8)
    config = MiningConfig(k, 128, list(range(2)), list(range(128)), 0, 0)
    refs = [commit_instance(HEADER, config, acts[e], weights[e], cert_version=3) for e in range(experts)]
    job = prepare_job(torch.from_numpy(weights).cuda(), torch.ones(experts, n, device="cuda"),
                      header76=HEADER, config=config, cert_version=3, bound=0, moe=False)
    dumps = {}
    for cute in (False, True):
        mined = MinedPass(job, m, write_i32=True, split_peel=True, cute_split=cute)
        mined.dump = torch.zeros((experts, m // 2, n // 128, DUMP_WORDS), dtype=torch.int32, device="cuda")
        mined.run_quantized(torch.from_numpy(acts).cuda(), torch.ones(experts, m, device="cuda"))
        torch.cuda.synchronize()
        dumps[cute] = mined.dump.cpu()
    assert torch.equal(dumps[True], dumps[False])
    served = {}
    for cute in (False, True):  # without write_i32 the CuTe pass also peels on the CuTe GEMM
        mined = MinedPass(job, m, split_peel=True, cute_split=cute)
        served[cute] = mined.run_quantized(torch.from_numpy(acts).cuda(), torch.ones(experts, m, device="cuda"))
    assert torch.equal(served[True].view(torch.int16), served[False].view(torch.int16))
    wins = [(e, w) for e, ref in enumerate(refs) for w in instance_tickets(ref)]
    expert, best = min(wins, key=lambda w: ticket_value(w[1].ticket))
    job.bound.copy_(bound_words(ticket_value(best.ticket), "cuda"))
    mined = MinedPass(job, m, write_i32=True, split_peel=True, cute_split=True)
    mined.run_quantized(torch.from_numpy(acts).cuda(), torch.ones(experts, m, device="cuda"))
    expected = np.einsum("emk,enk->emn", acts.astype(np.int64), weights.astype(np.int64))
    assert np.array_equal(mined.out_i32.cpu().numpy(), expected)
    assert mined.winner_record() == {"instance": expert, "t_rows": best.t_rows, "t_cols": best.t_cols,
                                     "ticket": best.ticket}
    assert verify_plain_proof(HEADER, mined.take_proof(), bits=BITS, cert_version=3) == (True, "ok")


@pytest.mark.parametrize("gather", [False, True])
def test_moe_pipeline_on_the_cute_split_pass_and_its_winner_verifies(gather: bool, monkeypatch) -> None:
    """MoE (cert V2) on the CuTe split pass, with A′ rows copied into expert order or (gather) read
    through the routing: the served output equals the Triton split pass's bits, A·B is exact, a
    planted winner verifies."""
    from kernels.int7 import pipeline
    from kernels.int7.pipeline import SPLIT_PEEL_FROM_ROWS, MinedPass, bound_words, prepare_job

    monkeypatch.setattr(pipeline, "GATHER_A_ROWS", gather)

    experts, top_k, m, n, k = 4, 2, SPLIT_PEEL_FROM_ROWS, 256, 2048
    tokens = experts * m // top_k
    rng = np.random.default_rng(47)
    weights = rng.integers(-64, 65, (experts, n, k), dtype=np.int8)
    acts = rng.integers(-64, 65, (tokens, k), dtype=np.int8)
    routing = [[t for t in range(tokens) if t % 2 == e % 2] for e in range(experts)]
    config = MiningConfig(k, 128, list(range(2)), list(range(128)), experts, top_k)
    ref = commit_instance(HEADER, config, acts, weights.reshape(experts * n, k), cert_version=2, routing=routing)
    job = prepare_job(torch.from_numpy(weights).cuda(), torch.ones(experts, n, device="cuda"),
                      header76=HEADER, config=config, cert_version=2, bound=0, moe=True)
    codes, scales = torch.from_numpy(acts).cuda(), torch.ones(tokens, device="cuda")
    ids = torch.tensor(routing, dtype=torch.int32, device="cuda")
    served = {}
    for cute in (False, True):
        mined = MinedPass(job, m, tokens=tokens, split_peel=True, cute_split=cute)
        assert (mined._transcript is not None) == cute
        served[cute] = mined.run_quantized(codes, scales, ids).clone()
    assert torch.equal(served[True].view(torch.int16), served[False].view(torch.int16))
    best = min(instance_tickets(ref), key=lambda w: ticket_value(w.ticket))
    job.bound.copy_(bound_words(ticket_value(best.ticket), "cuda"))
    mined = MinedPass(job, m, tokens=tokens, write_i32=True, split_peel=True, cute_split=True)
    mined.run_quantized(codes, scales, ids)
    expected = np.einsum("emk,enk->emn", acts[np.array(routing)].astype(np.int64), weights.astype(np.int64))
    assert np.array_equal(mined.out_i32.cpu().numpy(), expected)
    assert mined.winner_record() == {"instance": best.expert, "t_rows": best.t_rows, "t_cols": best.t_cols,
                                     "ticket": best.ticket}
    proof = mined.take_proof()
    assert proof.moe is not None and proof.moe.expert_idx == best.expert
    assert verify_plain_proof(HEADER, proof, bits=BITS, cert_version=2) == (True, "ok")


@pytest.mark.parametrize("fused_a, dynamic", [(True, False), (False, False), (True, True)])
def test_lagged_pass_on_the_cute_gemm_serves_exactly_and_mines_the_previous_launch(fused_a: bool, dynamic: bool,
                                                                                 monkeypatch) -> None:
    """MinedPass(lagged=True, cute_lag=True): every launch serves A_t·B exactly and with the Triton
    lagged pass's bf16 bits; the first mines nothing; a winner planted on launch t−1's rows is
    recorded at launch t and its proof (opening A_{t−1}) verifies. dynamic: with the GEMM's tiles
    from a counter and READY's tickets drawn on the side stream (`CUTE_LAGGED_DYNAMIC`)."""
    from kernels.int7 import pipeline
    from kernels.int7.pipeline import MinedPass, bound_words, prepare_job
    monkeypatch.setattr(pipeline, "CUTE_LAGGED_DYNAMIC", dynamic)

    experts, m, n, k = 2, 16, 256, 2048
    config = MiningConfig(k, 128, [0, 1], list(range(128)), 0, 0)
    gen = np.random.default_rng(12)
    weights = gen.integers(-64, 65, (experts, n, k), dtype=np.int8)
    job = prepare_job(torch.from_numpy(weights).cuda(), torch.from_numpy(gen.uniform(1e-3, 2e-2, (experts, n))
                                                                         .astype(np.float32)).cuda(),
                      header76=HEADER, config=config, cert_version=3, bound=0, moe=False)
    launches = [(gen.integers(-64, 65, (experts, m, k), dtype=np.int8),
                 torch.from_numpy(gen.uniform(1e-3, 2e-2, (experts, m)).astype(np.float32)).cuda()) for _ in range(3)]
    cute = MinedPass(job, m, lagged=True, cute_lag=True, write_i32=True, fused_a=fused_a)
    triton = MinedPass(job, m, lagged=True, cute_lag=False, fused_a=fused_a)
    assert cute._cute_lag is not None and triton._cute_lag is None
    for t, (acts, scale) in enumerate(launches):
        if t == 2:  # plant the smallest ticket of launch 1's rows
            refs = [commit_instance(HEADER, config, launches[1][0][e], weights[e], cert_version=3)
                    for e in range(experts)]
            expert, best = min(((e, w) for e, ref in enumerate(refs) for w in instance_tickets(ref)),
                               key=lambda item: ticket_value(item[1].ticket))
            job.bound.copy_(bound_words(ticket_value(best.ticket), "cuda"))
        codes = torch.from_numpy(acts).cuda()
        served = cute.run_quantized(codes, scale).clone()
        reference = triton.run_quantized(codes, scale)
        torch.cuda.synchronize()
        exact = np.einsum("emk,enk->emn", acts.astype(np.int64), weights.astype(np.int64))
        assert np.array_equal(cute.out_i32.cpu().numpy(), exact), f"launch {t}"
        assert torch.equal(served.view(torch.int16), reference.view(torch.int16)), f"launch {t}"
        if t < 2:
            assert cute.winner_record() is None
    assert cute.winner_record() == {"instance": expert, "t_rows": best.t_rows, "t_cols": best.t_cols,
                                    "ticket": best.ticket}
    proof = cute.take_proof()
    assert proof.a.proof.root == refs[expert].hash_a
    assert verify_plain_proof(HEADER, proof, bits=BITS, cert_version=3) == (True, "ok")
