"""The Triton parts of the lagged decode pass on the CuTe GEMM: the stacked operand [READY A' ;
q] read through the phase word, and the served rows' peel A·B = A·B' − (A·P_B)·U_Bᵀ (exact int32,
bf16 within one step of the float32 product, since Triton's CPU interpreter may truncate where
the GPU rounds). Interpreted on CPU, compiled on a GPU."""
import numpy as np
import pytest
import torch

from kernels.int7.clean_peel import CleanPeelError, clean_peel
from kernels.int7.lag_operand import LagOperandError, stack_lagged_rows
from kernels.int7.mined_gemm import LagPhase, MinedGemmError
from kernels.int7.noise import dense_sparse_factor

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
E, M, N, K, R = 3, 16, 128, 384, 64


def _int8(rng, *shape, low=-64, high=65):
    return torch.from_numpy(rng.integers(low, high, shape).astype(np.int8)).to(DEVICE)


@pytest.mark.parametrize("phase", [0, 1])
def test_stacked_rows_take_ready_by_the_phase_word(phase):
    rng = np.random.default_rng(phase)
    sets = [(_int8(rng, E, M, K), torch.from_numpy(rng.integers(-2**31, 2**31, (E, 8)).astype(np.int32)).to(DEVICE),
             torch.from_numpy(rng.integers(0, M + 1, E).astype(np.int32)).to(DEVICE)) for _ in range(2)]
    words = E * M * K // 4 + E * 9 + 3  # set 1 starts this many words after set 0 (padded to 16)
    words += -words % 16
    flat = torch.zeros(2 * 4 * words, dtype=torch.uint8, device=DEVICE)
    views = []
    for s, (a, s_a, valid) in enumerate(sets):
        base = s * 4 * words
        a_view = flat[base:base + a.numel()].view(torch.int8).view(E, M, K)
        w = flat[base + a.numel():base + 4 * words].view(torch.int32)
        s_view, v_view = w[:E * 8].view(E, 8), w[E * 8:E * 9]
        a_view.copy_(a), s_view.copy_(s_a), v_view.copy_(valid)
        views.append((a_view, s_view, v_view))
    q = _int8(rng, E, M, K)
    out = torch.full((E, 2 * M, K), 7, dtype=torch.int8, device=DEVICE)
    s_a_out = torch.zeros((E, 8), dtype=torch.int32, device=DEVICE)
    valid_out = torch.zeros(E, dtype=torch.int32, device=DEVICE)
    lag = LagPhase(torch.tensor([phase], dtype=torch.int32, device=DEVICE), words)
    counter = torch.full((1,), 1234, dtype=torch.int32, device=DEVICE)  # a dynamic GEMM's count left behind
    stack_lagged_rows(*views[0], lag, q, out, s_a_out, valid_out, tile_counter=counter)
    ready = sets[phase]
    assert torch.equal(out[:, :M], ready[0]) and torch.equal(out[:, M:], q)
    assert torch.equal(s_a_out, ready[1]) and torch.equal(valid_out, ready[2])
    assert int(counter) == 0  # zeroed for the next launch of the GEMM


def test_stacked_rows_refuse_bad_shapes():
    q = torch.zeros((E, 8, K), dtype=torch.int8, device=DEVICE)
    lag = LagPhase(torch.zeros(1, dtype=torch.int32, device=DEVICE), 16)
    with pytest.raises(LagOperandError, match="multiple of 16"):
        stack_lagged_rows(q, torch.zeros((E, 8), dtype=torch.int32), torch.zeros(E, dtype=torch.int32), lag, q,
                          torch.empty((E, 16, K), dtype=torch.int8), torch.empty((E, 8), dtype=torch.int32),
                          torch.empty(E, dtype=torch.int32))


@pytest.mark.parametrize("rows, k", [(M, K), (48, 2 * K), (M, 65_000)])  # 48: a part-empty row block; K past 2^16 / 64·64
def test_clean_peel_is_a_times_b_exactly(rows, k):
    rng = np.random.default_rng(rows + k)
    a = rng.integers(-64, 65, (E, rows, 256)).astype(np.int64)
    b = rng.integers(-64, 65, (E, N, 256)).astype(np.int64)
    first = rng.integers(0, R, (E, 256))
    second = (first + rng.integers(1, R, (E, 256))) % R
    p_b = dense_sparse_factor(torch.from_numpy(first).int(), torch.from_numpy(second).int(), R).numpy().astype(np.int64)
    u_b = rng.integers(-32, 32, (E, N, R))
    b_noised = b + np.einsum("ekr,enr->enk", p_b, u_b)
    apb = np.einsum("emk,ekr->emr", a, p_b)
    if k != K:  # a long row's largest A·P_B (|A·P_B| ≤ 64·k): scale the row so its peel term is as large
        apb = apb * (k // 256)
    exact = np.einsum("emk,enk->emn", a, b_noised) - np.einsum("emr,enr->emn", apb, u_b)
    raw = np.zeros((E, 2 * rows, N), dtype=np.int64)
    raw[:, rows:] = exact + np.einsum("emr,enr->emn", apb, u_b)  # A·B' of the served rows, wrapped
    t = lambda x, dtype: torch.from_numpy(((x + 2**31) % 2**32 - 2**31).astype(np.int64)).to(dtype).to(DEVICE)  # noqa: E731
    scale_a = torch.rand(E, rows, device=DEVICE) / 64
    scale_b = torch.rand(E, N, device=DEVICE) / 64
    out = torch.empty((E, rows, N), dtype=torch.bfloat16, device=DEVICE)
    out_i32 = torch.empty((E, rows, N), dtype=torch.int32, device=DEVICE)
    clean_peel(t(raw, torch.int32), rows, t(apb, torch.int32), t(u_b, torch.int8), scale_a, scale_b, out, out_i32)
    assert np.array_equal(out_i32.cpu().numpy().astype(np.int64), (exact + 2**31) % 2**32 - 2**31)
    want = (out_i32.float() * scale_a[:, :, None] * scale_b[:, None, :]).bfloat16()
    step = want.float().abs() * 2.0 ** -7
    assert torch.all((out.float() - want.float()).abs() <= step)


def test_clean_peel_refuses_bad_shapes():
    out = torch.empty((E, M, 100), dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(CleanPeelError, match="multiple of"):
        clean_peel(torch.empty((E, 2 * M, 100), dtype=torch.int32), M, torch.empty((E, M, R), dtype=torch.int32),
                   torch.empty((E, 100, R), dtype=torch.int8), torch.empty((E, M)), torch.empty((E, 100)), out)
    out = torch.empty((E, M, N), dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(MinedGemmError, match="apb"):
        clean_peel(torch.empty((E, 2 * M, N), dtype=torch.int32, device=DEVICE), M,
                   torch.empty((E, M, R), dtype=torch.int64, device=DEVICE),
                   torch.empty((E, N, R), dtype=torch.int8, device=DEVICE), torch.empty((E, M), device=DEVICE),
                   torch.empty((E, N), device=DEVICE), out)
