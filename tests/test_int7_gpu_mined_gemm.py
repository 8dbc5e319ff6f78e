"""The mined GEMM kernel against proof.int7: every tile's 16 transcript words and ticket, the
first-winner record, tile eligibility, the exact peel and the bf16 output."""
import numpy as np
import pytest
import torch

from kernels.int7 import noise as device_noise
from kernels.int7.activations import prepare_rows
from kernels.int7.blake3 import bytes_from_words
from kernels.int7.mined_gemm import (DUMP_WORDS, RECORD_WORDS, LagPhase, MinedGemmError, Tiling,
                                     lottery_tile, mined_gemm, plain_gemm)
from kernels.int7.pipeline import bound_words
from proof.int7 import LABEL_A, LABEL_B, ticket, ticket_value, tile_transcripts

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
E, M, N, K, RANK, H, W = 2, 32, 64, 1024 + 64, 64, 4, 32  # k mod r = 64: an untranscribed tail
TILING = Tiling(16, W, 64)  # a lottery tile spans the block's width


def _operands(seed):
    gen = torch.Generator().manual_seed(seed)
    a = torch.randint(-64, 65, (E, M, K), dtype=torch.int8, generator=gen).to(DEVICE)
    bt = torch.randint(-64, 65, (E, N, K), dtype=torch.int8, generator=gen).to(DEVICE)
    s_a = torch.randint(-2**31, 2**31 - 1, (E, 8), dtype=torch.int32, generator=gen).to(DEVICE)
    s_b = torch.randint(-2**31, 2**31 - 1, (E, 8), dtype=torch.int32, generator=gen).to(DEVICE)
    u_a = device_noise.uniform_factor(s_a, LABEL_A, M, RANK)
    u_b = device_noise.uniform_factor(s_b, LABEL_B, N, RANK)
    p_a = device_noise.sparse_factor(s_a, LABEL_A, K, RANK)
    p_b = device_noise.sparse_factor(s_b, LABEL_B, K, RANK)
    return dict(a=a, bt=bt, s_a=s_a, u_b=u_b, p_b=p_b,
                a_noised=device_noise.noised(a, u_a, *p_a),
                bt_noised=device_noise.noised(bt, u_b, *p_b))


def _run(ops, bound, rows_valid=M, dump=True):
    record = torch.zeros(RECORD_WORDS, dtype=torch.int32, device=DEVICE)
    out = torch.empty((E, M, N), dtype=torch.bfloat16, device=DEVICE)
    out_i32 = torch.empty((E, M, N), dtype=torch.int32, device=DEVICE)
    dumped = torch.zeros((E, M // H, N // W, DUMP_WORDS), dtype=torch.int32, device=DEVICE) if dump else None
    scale_a = torch.linspace(0.5, 2.0, E * M, device=DEVICE).view(E, M)
    scale_b = torch.linspace(0.01, 0.1, E * N, device=DEVICE).view(E, N)
    _, _, apb = prepare_rows(ops["a"], device_noise.dense_sparse_factor(*ops["p_b"], RANK),
                             rows_per_instance=M, scale=scale_a)
    mined_gemm(ops["a_noised"], ops["a"], ops["bt_noised"], apb, ops["u_b"], ops["s_a"],
               bound_words(bound, DEVICE), torch.full((E,), rows_valid, dtype=torch.int32, device=DEVICE),
               record, scale_a, scale_b, rank=RANK, tile_h=H, tile_w=W, out=out, out_i32=out_i32,
               dump=dumped, tiling=TILING)
    return record.cpu(), out.cpu(), out_i32.cpu(), dumped, scale_a.cpu(), scale_b.cpu()


@pytest.fixture(scope="module")
def mined():
    ops = _operands(1)
    return ops, _run(ops, bound=0)


def test_every_tile_transcript_and_ticket_match_reference(mined):
    ops, (record, _, _, dumped, _, _) = mined
    rows = np.arange(M).reshape(-1, H)
    cols = np.arange(N).reshape(-1, W)
    for e in range(E):
        words = tile_transcripts(ops["a_noised"][e].cpu().numpy(), ops["bt_noised"][e].cpu().numpy(),
                                 RANK, rows, cols)
        assert np.array_equal(dumped[e, :, :, :16].cpu().numpy().view(np.uint32), words)
        key = bytes_from_words(ops["s_a"][e])
        for i in range(rows.shape[0]):
            for j in range(cols.shape[0]):
                assert bytes_from_words(dumped[e, i, j, 16:]) == ticket(key, words[i, j])
    assert record[0] == 0  # bound 0: nobody wins


def test_peel_is_exact_and_output_is_dequantised(mined):
    ops, (_, out, out_i32, _, scale_a, scale_b) = mined
    expected = torch.einsum("emk,enk->emn", ops["a"].cpu().long(), ops["bt"].cpu().long())
    assert torch.equal(out_i32.long(), expected)
    dequantised = expected.double() * scale_a[:, :, None].double() * scale_b[:, None, :].double()
    assert torch.allclose(out.double(), dequantised, rtol=1e-2, atol=1e-3)


def test_first_winner_is_recorded_and_ineligible_rows_never_win(mined):
    ops, (_, _, _, dumped, _, _) = mined
    tickets = [[[bytes_from_words(dumped[e, i, j, 16:]) for j in range(N // W)] for i in range(M // H)]
               for e in range(E)]
    # Plant: the bound equals the smallest ticket among the first half of each instance's rows.
    half = M // 2
    best = min(((ticket_value(tickets[e][i][j]), e, i, j) for e in range(E) for i in range(half // H)
                for j in range(N // W)))
    record, *_ = _run(ops, bound=best[0], rows_valid=half, dump=False)
    assert record[0] == 1
    assert record[1:4].tolist() == [best[1], best[2] * H, best[3] * W]
    assert bytes_from_words(record[4:12]) == tickets[best[1]][best[2]][best[3]]


@pytest.mark.parametrize("phase", [0, 1])
def test_phased_gemm_reads_the_ready_set(mined, phase):
    """lag: A', s_A and the row counts are set 0 of a two-set buffer and the kernel reads set
    `phase` (the lagged pass's READY): the same dump, record and output as the plain call on that
    set, while the other set holds garbage."""
    ops, (record, out, out_i32, dumped, scale_a, scale_b) = mined
    words = -(-(E * M * K + E * 9 * 4) // 64) * 16  # a set: A', s_A, the row counts; 64-byte padded
    flat = torch.randint(-128, 128, (2 * 4 * words,), dtype=torch.int8, device=DEVICE)
    sets = []
    for i in range(2):
        base = flat[i * 4 * words:(i + 1) * 4 * words]
        tail = base[E * M * K:].view(torch.int32)
        sets.append((base[:E * M * K].view(E, M, K), tail[:E * 8].view(E, 8), tail[E * 8:E * 9]))
    a_noised, s_a, valid = sets[phase]
    a_noised.copy_(ops["a_noised"])
    s_a.copy_(ops["s_a"])
    valid.fill_(M)
    got = torch.zeros(RECORD_WORDS, dtype=torch.int32, device=DEVICE)
    out2 = torch.empty((E, M, N), dtype=torch.bfloat16, device=DEVICE)
    out2_i32 = torch.empty((E, M, N), dtype=torch.int32, device=DEVICE)
    dump2 = torch.zeros_like(dumped)
    _, _, apb = prepare_rows(ops["a"], device_noise.dense_sparse_factor(*ops["p_b"], RANK),
                             rows_per_instance=M, scale=scale_a.to(DEVICE))
    lag = LagPhase(torch.full((1,), phase, dtype=torch.int32, device=DEVICE), words)
    mined_gemm(*sets[0][:1], ops["a"], ops["bt_noised"], apb, ops["u_b"], sets[0][1], bound_words(0, DEVICE),
               sets[0][2], got, scale_a.to(DEVICE), scale_b.to(DEVICE), rank=RANK, tile_h=H, tile_w=W, out=out2,
               out_i32=out2_i32, dump=dump2, tiling=TILING, lag=lag)
    assert torch.equal(dump2, dumped) and torch.equal(got.cpu(), record)
    assert torch.equal(out2.cpu(), out) and torch.equal(out2_i32.cpu(), out_i32)
    with pytest.raises(MinedGemmError, match="lag.words"):
        mined_gemm(*sets[0][:1], ops["a"], ops["bt_noised"], apb, ops["u_b"], sets[0][1], bound_words(0, DEVICE),
                   sets[0][2], got, scale_a.to(DEVICE), scale_b.to(DEVICE), rank=RANK, tile_h=H, tile_w=W,
                   out=out2, tiling=TILING, lag=LagPhase(lag.phase, words + 4))


def test_plain_gemm_is_the_unmined_product():
    ops = _operands(2)
    out = torch.empty((E, M, N), dtype=torch.bfloat16, device=DEVICE)
    out_i32 = torch.empty((E, M, N), dtype=torch.int32, device=DEVICE)
    ones_a = torch.ones((E, M), device=DEVICE)
    ones_b = torch.ones((E, N), device=DEVICE)
    plain_gemm(ops["a"], ops["bt"], ones_a, ones_b, out=out, out_i32=out_i32, tiling=TILING)
    expected = torch.einsum("emk,enk->emn", ops["a"].cpu().long(), ops["bt"].cpu().long())
    assert torch.equal(out_i32.cpu().long(), expected)


def test_unpeeled_gemm_writes_the_noised_product_and_the_same_tickets(mined):
    """peel=False (the split pass): A'·B' as int32 and the same dump, without the peel's operands
    or the scales (None)."""
    ops, (_, _, _, dumped, _, _) = mined
    raw = torch.empty((E, M, N), dtype=torch.int32, device=DEVICE)
    dump = torch.zeros_like(dumped)
    mined_gemm(ops["a_noised"], None, ops["bt_noised"], None, None, ops["s_a"], bound_words(0, DEVICE),
               torch.full((E,), M, dtype=torch.int32, device=DEVICE),
               torch.zeros(RECORD_WORDS, dtype=torch.int32, device=DEVICE), None, None, rank=RANK, tile_h=H,
               tile_w=W, out=None, out_i32=raw, dump=dump, tiling=TILING, peel=False)
    expected = torch.einsum("emk,enk->emn", ops["a_noised"].cpu().long(), ops["bt_noised"].cpu().long())
    assert torch.equal(raw.cpu().long(), expected)
    assert torch.equal(dump, dumped)


def test_bad_shapes_are_named():
    ops = _operands(3)
    out = torch.empty((E, M, N), dtype=torch.bfloat16, device=DEVICE)
    ones_a = torch.ones((E, M), device=DEVICE)
    ones_b = torch.ones((E, N), device=DEVICE)
    with pytest.raises(MinedGemmError, match="block_n=48"):
        plain_gemm(ops["a"], ops["bt"], ones_a, ones_b, out=out, tiling=Tiling(16, 48, 64))
    with pytest.raises(MinedGemmError, match="bt must be contiguous"):
        plain_gemm(ops["a"], ops["bt"].transpose(1, 2), ones_a, ones_b, out=out)
    apb = torch.zeros((E, M, RANK), dtype=torch.int32, device=DEVICE)
    args = (ops["a"], ops["a"], ops["bt"], apb, ops["u_b"], ops["s_a"], ops["s_a"][0],
            torch.full((E,), M, dtype=torch.int32, device=DEVICE),
            torch.zeros(RECORD_WORDS, dtype=torch.int32, device=DEVICE), ones_a, ones_b)
    with pytest.raises(MinedGemmError, match="tile width 16 must equal block_n=32"):
        mined_gemm(*args, rank=RANK, tile_h=2, tile_w=16, out=out, tiling=Tiling(16, 32, 64))
    with pytest.raises(MinedGemmError, match="tile height 6 must be even and divide block_m=16"):
        mined_gemm(*args, rank=RANK, tile_h=6, tile_w=32, out=out, tiling=Tiling(16, 32, 64))


@pytest.mark.parametrize("n, k, rank, tile", [
    (4096, 6144, 128, (2, 128)), (3072, 4096, 128, (2, 128)), (96, 2048, 128, (2, 32)),
    (4096, 32768, 128, (2, 64)),  # (2 + 128)·D > 2^22: the next width that fits
])
def test_lottery_tile_is_the_widest_block_that_fits(n, k, rank, tile):
    assert lottery_tile(n, k, rank) == tile
    assert lottery_tile(128, 2048, 128, moe=True) == (2, 64)  # MoE opens fewer than N columns
    with pytest.raises(MinedGemmError, match="no lottery tile"):
        lottery_tile(40, 2048, 128)
