"""GPU check of the lottery fold in the CuTe GEMM's epilogue (kernels.fp8mine.fold_epilogue; skipped
without a GPU): on an uneven routing (an empty expert, row counts not a multiple of 4, a partial
last M tile) the folding kernel's accumulator is bitwise the plain raw-fp32 GEMM's, and the
tickets drawn from its lanes (`LotteryLatch.run_folded`) equal the lottery pass's on the
accumulator (lottery.py, itself checked against proof.fp8) for every whole 4×64 tile; the latch
then publishes a winning tile's record.
"""
import numpy as np
import pytest
import torch

from kernels.grouped_gemm_config import GroupedGemmConfig

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CONFIGS = ["128x128x128_c2x1_coop", "128x128x128_c1x1_coop", "64x128x128_c1x1_pp", "64x128x128_c1x2_coop",
           "128x192x128_c2x1_coop", "64x192x128_c1x1_pp"]
SIZES = [37, 0, 130, 259, 6]  # rows per expert
N, K = 384, 384


def _operands(seed: int):
    gen = np.random.default_rng(seed)
    codes = gen.integers(0, 256, size=(sum(SIZES), K), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x3C  # no NaN codes
    weights = gen.integers(0, 256, size=(len(SIZES), N, K), dtype=np.uint8)
    weights[(weights & 0x7F) == 0x7F] = 0x38
    return (torch.from_numpy(codes).cuda().view(torch.float8_e4m3fn),
            torch.from_numpy(weights).cuda().view(torch.float8_e4m3fn))


def _table():
    from kernels.fp8mine.routing import RoutingTable
    bounds = np.concatenate([[0], np.cumsum(SIZES)]).astype(np.int32)
    return RoutingTable(torch.arange(sum(SIZES), dtype=torch.int32, device="cuda"), torch.from_numpy(bounds).cuda())


def _words(value: int) -> torch.Tensor:
    return torch.full((8,), value, dtype=torch.int32, device="cuda")


@pytest.mark.parametrize("key", CONFIGS)
def test_folded_lanes_draw_the_lottery_pass_tickets(key: str) -> None:
    from kernels.fp8mine.fold_epilogue import fits, folded_grouped_gemm
    from kernels.fp8mine.lottery import LotteryLatch
    from kernels.fp8mine.routing import row_tiles
    from kernels.grouped_gemm import grouped_gemm

    config = GroupedGemmConfig.from_key(key)
    assert fits(config, N)
    a, b = _operands(1)
    table = _table()
    out = torch.empty((a.shape[0], N), dtype=torch.float32, device="cuda")
    lanes = torch.full((a.shape[0] // 4, N // 64, 16), -1, dtype=torch.int32, device="cuda")
    folded_grouped_gemm(a, b, table.bounds, out, lanes, config)
    plain = grouped_gemm(a, b, table.bounds, config=config)
    assert torch.equal(out.view(torch.int32), plain.view(torch.int32))

    tiles = row_tiles(table)
    pow_key = torch.arange(8, dtype=torch.int32, device="cuda") * 0x01010101
    latch = LotteryLatch("cuda", {})
    latch.set_header(sum(SIZES), len(SIZES) * N, K, 3, sum(SIZES) * K, sum(SIZES) * K // 4)
    want = torch.zeros((tiles.row_start.shape[0], N // 64, 8), dtype=torch.int32, device="cuda")
    got = torch.zeros_like(want)
    latch.run(plain, tiles, pow_key, _words(0), _words(7), {}, tickets=want)
    latch.run_folded(lanes, tiles, pow_key, _words(0), _words(7), {}, tickets=got)
    live = tiles.row_start >= 0
    assert int(live.sum()) == sum(size // 4 for size in SIZES)
    assert torch.equal(got[live], want[live])
    latch.run_folded(lanes, tiles, pow_key, _words(-1), _words(7), {})  # every ticket ≤ 2²⁵⁶ − 1
    latch.publish()
    torch.cuda.synchronize()
    record = latch.poll()
    assert record is not None and 4 * record.tile_row + 3 < SIZES[record.group_id]
    slot = int(torch.nonzero((tiles.expert == record.group_id) & (tiles.local == record.tile_row) & live)[0, 0])
    assert record.ticket == want[slot, record.tile_column].cpu().numpy().astype("<i4").tobytes()


@pytest.mark.parametrize("key", ["128x128x128_c2x1_coop", "64x128x128_c1x1_pp"])
def test_bf16_accumulator_is_the_fp32_one_rounded(key: str) -> None:
    """Stored as bf16 (matmul.BF16_FOLDED_ACC), the accumulator is the fp32 one rounded to nearest
    even bit for bit, and the lanes are the ones folded from the fp32 values."""
    from kernels.fp8mine.fold_epilogue import folded_grouped_gemm

    config = GroupedGemmConfig.from_key(key)
    a, b = _operands(3)
    bounds = _table().bounds
    results = []
    for dtype in (torch.float32, torch.bfloat16):
        out = torch.empty((a.shape[0], N), dtype=dtype, device="cuda")
        lanes = torch.full((a.shape[0] // 4, N // 64, 16), -1, dtype=torch.int32, device="cuda")
        results.append((folded_grouped_gemm(a, b, bounds, out, lanes, config), lanes))
    (fp32, fp32_lanes), (bf16, bf16_lanes) = results
    assert bf16.dtype == torch.bfloat16
    assert torch.equal(bf16.view(torch.int16), fp32.to(torch.bfloat16).view(torch.int16))
    assert torch.equal(bf16_lanes, fp32_lanes)


def test_tile_counter_schedule_keeps_the_bits_of_the_static_one() -> None:
    """The lagged pass's GEMM (shared SMs, READY rows folded by lottery_bounds) taking its tiles
    from a zeroed counter (`tile_counter`, pipeline.LAGGED_DYNAMIC) writes the static schedule's
    accumulator and lanes bit for bit, on the whole GPU and on 8 SMs (most tiles then taken from
    the counter), launch after launch with the counter zeroed between them."""
    from kernels.fp8mine.fold_epilogue import folded_grouped_gemm
    from kernels.fp8mine.pipeline import LAGGED_SIDE_SMEM

    config = GroupedGemmConfig.from_key("64x128x128_c1x1_pp")
    a, b = _operands(5)
    bounds = _table().bounds
    ready = [16, 0, 20, 33, 6]  # each expert's first rows are folded (READY), whole 4-row tiles only
    lottery_bounds = torch.tensor(np.concatenate([[0], np.cumsum(ready)]), dtype=torch.int32, device="cuda")

    def launch(counter, max_sms=None):
        out = torch.empty((a.shape[0], N), dtype=torch.bfloat16, device="cuda")
        lanes = torch.full((sum(ready) // 4, N // 64, 16), -1, dtype=torch.int32, device="cuda")
        folded_grouped_gemm(a, b, bounds, out, lanes, config, lottery_bounds=lottery_bounds, max_sms=max_sms,
                            side_smem=LAGGED_SIDE_SMEM, tile_counter=counter)
        return out.view(torch.int16), lanes

    want_out, want_lanes = launch(None)
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    for max_sms in (None, 8, 8):
        counter.zero_()
        out, lanes = launch(counter, max_sms)
        assert torch.equal(out, want_out) and torch.equal(lanes, want_lanes)
        assert int(counter) > 0  # the CTAs took tiles from it


def test_compact_store_keeps_the_whole_tile_stores_bits_nan_included() -> None:
    """The compact store (`compact_bounds`, the lagged pass's clean rows) writes each kept row as
    the whole-tile bf16 store (TMA, F2FP) does, bit for bit, with NaN codes planted in some rows
    of A so that WGMMA's canonical NaN reaches the store (the integer rounding it replaced
    stored it as −0); the folded lanes are the whole-tile kernel's."""
    from kernels.fp8mine.fold_epilogue import folded_grouped_gemm
    from kernels.fp8mine.pipeline import LAGGED_SIDE_SMEM

    config = GroupedGemmConfig.from_key("64x128x128_c1x1_pp")
    a, b = _operands(7)
    nan_rows = torch.tensor([20, 60, 200, 300, 425], device="cuda")  # kept rows of experts 0, 2 and 3
    a.view(torch.uint8)[torch.cat([nan_rows, torch.tensor([40], device="cuda")]), 5] = 0xFF  # e4m3 −NaN; 40 is folded
    bounds = _table().bounds
    ready = torch.tensor([16, 0, 20, 33, 6])  # each expert's first rows are folded, the rest kept
    lottery_bounds = torch.cat([torch.zeros(1), ready.cumsum(0)]).to(torch.int32).cuda()
    kept = torch.tensor(SIZES) - ready
    compact_bounds = torch.cat([torch.zeros(1), kept.cumsum(0)]).to(torch.int32).cuda()
    results = []
    for compact in (False, True):
        out = torch.empty((int(kept.sum()) if compact else a.shape[0], N), dtype=torch.bfloat16, device="cuda")
        lanes = torch.full((int(ready.sum()) // 4, N // 64, 16), -1, dtype=torch.int32, device="cuda")
        folded_grouped_gemm(a, b, bounds, out, lanes, config, lottery_bounds=lottery_bounds, side_smem=LAGGED_SIDE_SMEM,
                            compact_bounds=compact_bounds if compact else None)
        results.append((out.view(torch.int16), lanes))
    (whole, whole_lanes), (compact, compact_lanes) = results
    starts = _table().bounds.tolist()
    rows = torch.cat([torch.arange(starts[w] + int(ready[w]), starts[w + 1]) for w in range(len(SIZES))]).cuda()
    assert torch.equal(compact, whole[rows])
    assert torch.equal(compact_lanes, whole_lanes)
    assert torch.isnan(compact.view(torch.bfloat16)).any(dim=1).sum() == len(nan_rows)


def test_signalling_gemm_counts_each_experts_tiles() -> None:
    """`expert_done` (`LAGGED_PEEL_POLLS`): after the compact-storing GEMM each expert's count is
    the number the polling peel waits for, ceil(rows_w / tile_m) · ceil(n / tile_n) (0 for the
    empty expert, several M tiles for the long ones), with the static schedule and with the tile
    counter on 8 SMs; its compact rows and lanes are the non-signalling kernel's. A count above
    that number would only show on the GPU as the peel's fallback wait, never as a wrong output,
    so this is where the formula is checked."""
    from kernels.fp8mine.fold_epilogue import folded_grouped_gemm
    from kernels.fp8mine.pipeline import LAGGED_SIDE_SMEM

    config = GroupedGemmConfig.from_key("64x128x128_c1x1_coop")  # the lagged pass's shared-SM shape
    a, b = _operands(9)
    bounds = _table().bounds
    ready = torch.tensor([16, 0, 20, 33, 6])
    lottery_bounds = torch.cat([torch.zeros(1), ready.cumsum(0)]).to(torch.int32).cuda()
    kept = torch.tensor(SIZES) - ready
    compact_bounds = torch.cat([torch.zeros(1), kept.cumsum(0)]).to(torch.int32).cuda()
    expected = torch.tensor([-(-rows // config.tile_m) * -(-N // config.tile_n) for rows in SIZES],
                            dtype=torch.int32, device="cuda")

    def launch(done, counter=None, max_sms=None):
        out = torch.empty((int(kept.sum()), N), dtype=torch.bfloat16, device="cuda")
        lanes = torch.full((int(ready.sum()) // 4, N // 64, 16), -1, dtype=torch.int32, device="cuda")
        folded_grouped_gemm(a, b, bounds, out, lanes, config, lottery_bounds=lottery_bounds, max_sms=max_sms,
                            side_smem=LAGGED_SIDE_SMEM, tile_counter=counter, compact_bounds=compact_bounds,
                            expert_done=done)
        return out.view(torch.int16), lanes

    want_out, want_lanes = launch(None)
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    for dynamic, max_sms in ((False, None), (True, None), (True, 8)):
        done = torch.zeros(len(SIZES), dtype=torch.int32, device="cuda")
        counter.zero_()
        out, lanes = launch(done, counter if dynamic else None, max_sms)
        assert torch.equal(done, expected), (dynamic, max_sms, done.tolist(), expected.tolist())
        assert torch.equal(out, want_out) and torch.equal(lanes, want_lanes)
