"""GPU check of the lottery in the CuTe GEMM's epilogue (kernels.fp8mine.lottery_epilogue; skipped
without a GPU): on an uneven routing (an empty expert, row counts not a multiple of 4, a partial
last M tile) the fused kernel's accumulator is bitwise the plain raw-fp32 GEMM's, every whole
4×64 tile's ticket equals the lottery pass's (lottery.py, itself checked against proof.fp8), and
the latch publishes one winning tile's record when every tile wins and nothing when none does.
"""
import numpy as np
import pytest
import torch

from kernels.grouped_gemm_config import GroupedGemmConfig

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CONFIGS = ["128x128x128_c2x1_coop", "128x128x128_c1x1_coop", "64x128x128_c1x1_pp", "64x128x128_c1x2_coop"]
SIZES = [37, 0, 130, 259, 6]  # rows per expert
N, K = 384, 384


def _operands(seed: int):
    gen = np.random.default_rng(seed)
    codes = gen.integers(0, 256, size=(sum(SIZES), K), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x3C  # no NaN codes
    weights = gen.integers(0, 256, size=(len(SIZES), N, K), dtype=np.uint8)
    weights[(weights & 0x7F) == 0x7F] = 0x38
    a = torch.from_numpy(codes).cuda().view(torch.float8_e4m3fn)
    b = torch.from_numpy(weights).cuda().view(torch.float8_e4m3fn)
    return a, b


def _table():
    from kernels.fp8mine.routing import RoutingTable
    bounds = np.concatenate([[0], np.cumsum(SIZES)]).astype(np.int32)
    return RoutingTable(torch.arange(sum(SIZES), dtype=torch.int32, device="cuda"), torch.from_numpy(bounds).cuda())


def _latch(key_seed: int, threshold_word: int):
    from kernels.fp8mine.lottery import LotteryLatch
    latch = LotteryLatch("cuda", {})
    latch.set_header(sum(SIZES), len(SIZES) * N, K, 3, sum(SIZES) * K, sum(SIZES) * K // 4)
    key = torch.from_numpy(np.random.default_rng(key_seed).integers(-2**31, 2**31, 8, dtype=np.int64)
                           .astype(np.int32)).cuda()
    threshold = torch.full((8,), threshold_word, dtype=torch.int32, device="cuda")
    seed_b = torch.arange(8, dtype=torch.int32, device="cuda")
    return latch, key, threshold, seed_b


@pytest.mark.parametrize("key", CONFIGS)
def test_epilogue_tickets_match_the_lottery_pass(key: str) -> None:
    from kernels.fp8mine.lottery_epilogue import fits, mined_grouped_gemm
    from kernels.fp8mine.routing import row_tiles
    from kernels.grouped_gemm import grouped_gemm

    config = GroupedGemmConfig.from_key(key)
    assert fits(config, N)
    a, b = _operands(1)
    table = _table()
    latch, pow_key, threshold, seed_b = _latch(2, 0)
    out = torch.empty((a.shape[0], N), dtype=torch.float32, device="cuda")
    tickets = torch.zeros((a.shape[0], N // 64, 8), dtype=torch.int32, device="cuda")
    mined_grouped_gemm(a, b, table.bounds, out, latch.buffers(pow_key, threshold, seed_b), config, tickets)
    plain = grouped_gemm(a, b, table.bounds, config=config)
    assert torch.equal(out.view(torch.int32), plain.view(torch.int32))

    tiles = row_tiles(table)
    want = torch.zeros((tiles.row_start.shape[0], N // 64, 8), dtype=torch.int32, device="cuda")
    latch.run(plain, tiles, pow_key, threshold, seed_b, {}, tickets=want)
    starts = tiles.row_start.cpu().numpy()
    live = starts[starts >= 0]
    assert len(live) == sum(size // 4 for size in SIZES)
    assert torch.equal(tickets[torch.from_numpy(live).cuda().long()], want[torch.from_numpy(starts >= 0).cuda()])
    torch.cuda.synchronize()
    assert int(latch.record[0]) == 0  # threshold 0: no ticket wins


@pytest.mark.parametrize("key", CONFIGS[:1] + CONFIGS[2:3])
def test_epilogue_latches_one_winner(key: str) -> None:
    from kernels.fp8mine.lottery import LotteryLatch
    from kernels.fp8mine.lottery_epilogue import mined_grouped_gemm

    a, b = _operands(3)
    table = _table()
    latch, pow_key, threshold, seed_b = _latch(4, -1)  # every ticket ≤ 2²⁵⁶ − 1
    out = torch.empty((a.shape[0], N), dtype=torch.float32, device="cuda")
    tickets = torch.zeros((a.shape[0], N // 64, 8), dtype=torch.int32, device="cuda")
    mined_grouped_gemm(a, b, table.bounds, out, latch.buffers(pow_key, threshold, seed_b),
                       GroupedGemmConfig.from_key(key), tickets)
    latch.publish()
    torch.cuda.synchronize()
    record = LotteryLatch.poll(latch)
    assert record is not None and int(latch.fresh[0]) == 1
    starts = np.concatenate([[0], np.cumsum(SIZES)])
    assert 0 <= record.group_id < len(SIZES) and 4 * record.tile_row + 3 < SIZES[record.group_id]
    row = int(starts[record.group_id]) + 4 * record.tile_row
    assert record.ticket == tickets[row, record.tile_column].cpu().numpy().astype("<i4").tobytes()
    assert record.pow_key == pow_key.cpu().numpy().astype("<i4").tobytes()
    assert (record.m, record.n, record.k) == (sum(SIZES), len(SIZES) * N, K)
