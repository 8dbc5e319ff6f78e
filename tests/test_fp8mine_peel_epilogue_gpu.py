"""GPU check of the peel in the GEMM's epilogue (kernels.fp8mine.peel_epilogue; skipped without a
GPU): on an uneven routing with an empty expert, operands whose rows carry their peel rows as
128-byte tails (strided views, as the pipeline passes them), the epilogue's bf16 output is the
peel pass's (peel.peel_and_unscale on the plain raw accumulator) within two bf16 steps, and its
folded lanes are bitwise the fold epilogue's; reading token rows through an index (the gather)
gives bitwise what the rows copied into expert order give.
"""
import numpy as np
import pytest
import torch

from kernels.grouped_gemm_config import GroupedGemmConfig

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SIZES = [37, 0, 130, 259, 6]
N, K = 384, 384


def _with_tails(codes: np.ndarray, peel: torch.Tensor, alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, K) e4m3 codes in a (rows, K + 128) buffer, each row's peel row after it, as the
    pipeline writes them: (the padded rows, 1/α of each row)."""
    from kernels.fp8mine.peel import TAIL_BYTES, write_tails
    from kernels.fp8mine.quant import NoisySide
    rows = codes.reshape(-1, K).shape[0]
    buffer = torch.zeros((rows, K + TAIL_BYTES), dtype=torch.uint8, device="cuda")
    buffer[:, :K] = torch.from_numpy(codes.reshape(-1, K)).cuda()
    side = NoisySide(buffer[:, :K].view(torch.float8_e4m3fn), alpha.reshape(rows), alpha.reshape(rows),
                     torch.zeros((rows, 32), dtype=torch.uint8, device="cuda"))
    padded, inv = write_tails(side, peel.reshape(rows, 64))
    return padded.view(torch.float8_e4m3fn), inv


def _operands(seed: int, a_rows: int):
    """Random e4m3 codes (no NaN) for a_rows A rows and the experts' B rows, each padded with its
    random peel row (`_with_tails`): (padded A, 1/α_A, A peel, α_A), (padded B, 1/α_B, B peel, α_B)."""
    gen = np.random.default_rng(seed)
    codes = gen.integers(0, 256, size=(a_rows, K), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x3C
    weights = gen.integers(0, 256, size=(len(SIZES), N, K), dtype=np.uint8)
    weights[(weights & 0x7F) == 0x7F] = 0x38
    sides = []
    for rows_codes, shape in ((codes, (a_rows,)), (weights, (len(SIZES), N))):
        peel = (torch.randn(*shape, 64, device="cuda") * 300).to(torch.bfloat16)
        alpha = (torch.rand(*shape, device="cuda") * 30 + 1).to(torch.bfloat16)
        sides.append((*_with_tails(rows_codes, peel, alpha), peel, alpha))
    return sides


@pytest.mark.parametrize("key", ["128x128x128_c2x1_coop", "64x128x128_c1x1_pp", "128x128x128_c1x1_coop"])
def test_epilogue_peel_matches_the_peel_pass(key: str) -> None:
    from kernels.fp8mine.fold_epilogue import folded_grouped_gemm
    from kernels.fp8mine.peel import TAIL_BYTES, peel_and_unscale
    from kernels.fp8mine.peel_epilogue import peeled_grouped_gemm
    from kernels.fp8mine.routing import RoutingTable

    config = GroupedGemmConfig.from_key(key)
    rows, experts = sum(SIZES), len(SIZES)
    (padded_a, inv_a, a_peel, alpha_a), (padded_b, inv_b, b_peel, alpha_b) = _operands(5, rows)
    assert torch.equal(inv_a, 1.0 / alpha_a.float()) and torch.equal(inv_b, 1.0 / alpha_b.float().reshape(-1))
    a, b = padded_a[:, :K], padded_b[:, :K].view(experts, N, K)
    bounds = torch.from_numpy(np.concatenate([[0], np.cumsum(SIZES)]).astype(np.int32)).cuda()
    table = RoutingTable(torch.arange(rows, dtype=torch.int32, device="cuda"), bounds)

    raw = torch.empty((rows, N), dtype=torch.float32, device="cuda")
    want_lanes = torch.full((rows // 4, N // 64, 16), -1, dtype=torch.int32, device="cuda")
    folded_grouped_gemm(a, b, bounds, raw, want_lanes, config)
    want = peel_and_unscale(raw, a_peel, alpha_a, b_peel, alpha_b, table)

    lanes = torch.full_like(want_lanes, -1)
    out = torch.empty((rows, N), dtype=torch.bfloat16, device="cuda")
    peeled_grouped_gemm(padded_a, padded_b.view(experts, N, K + TAIL_BYTES), bounds, out, lanes, inv_a,
                        inv_b.view(experts, N), config)
    assert torch.equal(lanes, want_lanes)
    diff = (out.float() - want.float()).abs()
    assert float((diff - 2 ** -7 * want.float().abs()).max()) <= 1e-3 * float(want.float().abs().max())


@pytest.mark.parametrize("key", ["128x128x128_c2x1_coop", "64x128x128_c1x1_pp"])
def test_gathered_rows_peel_as_the_rows_copied_into_expert_order(key: str) -> None:
    """`GATHER_IN_GEMM` with the peel: output row r reads token row a_idx[r] of the padded
    token-order operand, tails included (tokens repeated across experts, as top-k routes them);
    the output and lanes are bitwise those of the same rows copied into expert order first."""
    from kernels.fp8mine.peel import TAIL_BYTES
    from kernels.fp8mine.peel_epilogue import peeled_grouped_gemm

    config = GroupedGemmConfig.from_key(key)
    rows, experts, tokens = sum(SIZES), len(SIZES), 150
    (padded_tokens, inv_tokens, _, _), (padded_b, inv_b, _, _) = _operands(9, tokens)
    a_idx = torch.from_numpy(np.random.default_rng(10).integers(0, tokens, size=rows).astype(np.int32)).cuda()
    bounds = torch.from_numpy(np.concatenate([[0], np.cumsum(SIZES)]).astype(np.int32)).cuda()
    inv_rows = inv_tokens.index_select(0, a_idx)
    b = padded_b.view(experts, N, K + TAIL_BYTES)

    want_lanes = torch.full((rows // 4, N // 64, 16), -1, dtype=torch.int32, device="cuda")
    want = torch.empty((rows, N), dtype=torch.bfloat16, device="cuda")
    copied = padded_tokens.view(torch.uint8).index_select(0, a_idx.long()).view(torch.float8_e4m3fn)
    peeled_grouped_gemm(copied, b, bounds, want, want_lanes, inv_rows, inv_b.view(experts, N), config)
    lanes = torch.full_like(want_lanes, -1)
    out = torch.empty_like(want)
    peeled_grouped_gemm(padded_tokens, b, bounds, out, lanes, inv_rows, inv_b.view(experts, N), config, a_idx=a_idx)
    assert torch.equal(lanes, want_lanes)
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))
