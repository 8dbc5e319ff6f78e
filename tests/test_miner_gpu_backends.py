"""The GPU-pipeline backends on CUDA when there is one, else on torch's CPU backend (Triton's
interpreter runs the same kernels): served output, credited work, winners whose proofs verify and
pass the chain's rules.

Slow on the CPU: the interpreter hashes and multiplies (about a minute per backend on two cores)."""
import pytest
import torch

from miner.backend import LaunchResult
from miner.gpu import backend_factory
from miner.jobs import MiningJob
from miner.model import preset
from miner.model.moe import grouped_fc1
from miner.modes import Mode
from node_client import rules
from proof.chain import BlockHeader

EASY = 0x1E010000  # the regtest pow limit (and of <network>@H rehearsals)
LOOSE = 0x207FFFFF  # the largest target: every INT7 tile wins
K, EXPERTS, TOP_K = 2048, 4, 2
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class _Layer:
    def __init__(self, n_e: int) -> None:
        self.layer_id = 3
        self.cfg = preset("qwen3_moe", hidden_size=K, num_experts=EXPERTS, top_k=TOP_K, expert_intermediate=n_e)


def _inputs(n: int, tokens: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    w13 = torch.randn(EXPERTS, n, K, generator=gen) * K ** -0.5
    x = torch.randn(tokens, K, generator=gen)
    ids = torch.stack([torch.randperm(EXPERTS, generator=gen)[:TOP_K] for _ in range(tokens)])
    return x, ids, w13


def _mine(backend, x, ids) -> LaunchResult:
    """One launch on DEVICE, its output on the CPU. On CUDA a doorbell may ring after the launch
    returns (the backend never waits): the next launch reports the held winner."""
    result = backend.mine_launch(x.to(DEVICE), ids.to(DEVICE))
    winners = result.winners
    if not winners and DEVICE.type == "cuda":
        torch.cuda.synchronize()
        winners = backend.mine_launch(x.to(DEVICE), ids.to(DEVICE)).winners
    return LaunchResult(result.output.cpu(), winners, result.credited_work, result.tickets)


def _int7_rows(values: torch.Tensor):
    """Literal per-row int7: scale = max|v| / 64, codes = round-half-even(v / scale) in [-64, 64]."""
    scale = values.abs().amax(dim=-1) / 64
    scale[scale == 0] = 1
    return torch.round(values / scale[..., None]).clamp(-64, 64).to(torch.int64), scale


def _int7_reference(x, ids, w13):
    """Slot by slot: the int7 codes' exact product, dequantised (float32)."""
    qa, sa = _int7_rows(x)
    qb, sb = _int7_rows(w13)
    out = torch.empty(*ids.shape, w13.shape[1])
    for t in range(ids.shape[0]):
        for s in range(TOP_K):
            e = int(ids[t, s])
            exact = (qb[e] @ qa[t]).to(torch.float32)
            out[t, s] = exact * sa[t] * sb[e]
    return out


def _header(bits: int) -> bytes:
    return BlockHeader(1, b"\x11" * 32, b"\x22" * 32, 1_700_000_000, bits).incomplete_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("mode", [Mode.INT7_DENSE, Mode.INT7_MOE])
def test_int7_backend_serves_the_int7_product_and_its_winner_verifies(mode):
    n = 32
    x, ids, w13 = _inputs(n, 6, seed=5)
    backend = backend_factory(mode, _Layer(n // 2), DEVICE)
    job = MiningJob.of(_header(LOOSE), 1, 3, height=100_000)
    backend.prepare_job(job, w13.to(DEVICE))
    result = _mine(backend, x, ids)
    # the served output is the exact int7 product, dequantised, in bf16: within one bf16 ulp
    # (2^-7 relative; Triton's interpreter does not round the final cast to nearest)
    torch.testing.assert_close(result.output, _int7_reference(x, ids, w13), rtol=2**-7, atol=1e-6)
    reference = grouped_fc1(x, ids, w13)
    assert float((result.output - reference).norm() / reference.norm()) < 0.05
    counts = torch.bincount(ids.reshape(-1), minlength=EXPERTS).tolist()
    assert result.credited_work == sum(c - c % 2 for c in counts) * n * K
    # M = 16 rows per expert; 2-row tiles as wide as the GEMM block: the whole N = 32 for dense,
    # 16 for MoE (where a tile must be narrower than the expert's N, protocol §7)
    width = 32 if mode == Mode.INT7_DENSE else 16
    assert result.tickets == EXPERTS * (16 // 2) * (n // width)
    assert len(result.winners) == 1  # the pass latches one winner
    record = result.winners[0]
    assert (record.mode, record.layer_id, record.job) == (mode.value, 3, job)
    built = backend.build_proof(record)
    assert built.cert_version == 3 and backend.verify(record, built) == (True, "ok")
    rules.check_certificate("regtest", 5, 3, built.public_data, LOOSE)
    if mode == Mode.INT7_DENSE:
        rules.check_certificate("mainnet@100000", 100_000, 3, built.public_data, LOOSE)
    else:
        with pytest.raises(rules.RuleViolation, match="dense-only"):
            rules.check_certificate("mainnet@100000", 100_000, 3, built.public_data, LOOSE)
    with pytest.raises(RuntimeError, match="no longer holds"):
        backend.build_proof(record)  # re-armed: the record is spent


@pytest.mark.slow
def test_fp8_backend_serves_the_layer_and_its_winner_verifies():
    n = 64
    x, ids, w13 = _inputs(n, 16, seed=6)
    parent = BlockHeader(1, b"\x01" * 32, b"\x02" * 32, 1_700_000_000, EASY).to_bytes()
    proposed = BlockHeader(1, BlockHeader.from_bytes(parent).block_hash(), b"\x03" * 32, 1_700_000_001, EASY)
    job = MiningJob.of(proposed.incomplete_bytes(), 2**240, 4, (parent,), height=2)
    backend = backend_factory(Mode.FP8_MOE, _Layer(n // 2), DEVICE)
    with pytest.raises(ValueError, match="cert V4"):
        backend.prepare_job(MiningJob.of(proposed.incomplete_bytes(), 1, 3), w13)
    backend.prepare_job(job, w13.to(DEVICE))
    result = _mine(backend, x, ids)
    reference = grouped_fc1(x, ids, w13)
    assert float((result.output - reference).norm() / reference.norm()) < 0.1
    counts = torch.bincount(ids.reshape(-1), minlength=EXPERTS).tolist()
    assert result.credited_work == sum(c - c % 4 for c in counts) * n * K
    assert result.tickets == sum(c // 4 for c in counts) * (n // 64)
    assert len(result.winners) == 1
    record = result.winners[0]
    built = backend.build_proof(record)
    assert built.cert_version == 4 and backend.verify(record, built) == (True, "ok")
    rules.check_certificate("regtest-fp8", 2, 4, built.public_data, EASY)
    small = _mine(backend, x[:3], ids[:3])  # too few rows for a lottery tile: served unmined
    assert (small.credited_work, small.tickets) == (0, 0)
    torch.testing.assert_close(small.output, grouped_fc1(x[:3], ids[:3], w13.to(torch.bfloat16).float()),
                               rtol=1e-2, atol=1e-2)
