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


def _launch(backend, x, ids) -> LaunchResult:
    """One launch on DEVICE, its output on the CPU."""
    result = backend.mine_launch(x.to(DEVICE), ids.to(DEVICE))
    return LaunchResult(result.output.cpu(), result.winners, result.credited_work, result.tickets)


def _mine(backend, x, ids) -> LaunchResult:
    """One launch; on CUDA a doorbell may ring after the launch returns (the backend never waits):
    then the next launch (same inputs) reports the held winner."""
    result = _launch(backend, x, ids)
    if not result.winners and DEVICE.type == "cuda":
        torch.cuda.synchronize()
        return LaunchResult(result.output, _launch(backend, x, ids).winners, result.credited_work, result.tickets)
    return result


def _counts(ids) -> list[int]:
    return torch.bincount(ids.reshape(-1), minlength=EXPERTS).tolist()


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


def _header(bits: int, merkle_root: bytes = b"\x22" * 32) -> bytes:
    return BlockHeader(1, b"\x11" * 32, merkle_root, 1_700_000_000, bits).incomplete_bytes()


def _check_int7_winner(backend, mode, record, job) -> None:
    """The record's proof verifies under its job and passes the chain's rules; the record is spent."""
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


def _check_int7_output(result, x, ids, w13) -> None:
    """The served output is the exact int7 product, dequantised, in bf16: within one bf16 ulp
    (2^-7 relative; Triton's interpreter does not round the final cast to nearest)."""
    torch.testing.assert_close(result.output, _int7_reference(x, ids, w13), rtol=2**-7, atol=1e-6)
    reference = grouped_fc1(x, ids, w13)
    assert float((result.output - reference).norm() / reference.norm()) < 0.05


@pytest.mark.slow
def test_int7_moe_backend_mines_same_launch_and_its_winner_verifies():
    n = 32
    x, ids, w13 = _inputs(n, 6, seed=5)
    backend = backend_factory(Mode.INT7_MOE, _Layer(n // 2), DEVICE)
    job = MiningJob.of(_header(LOOSE), 1, 3, height=100_000)
    backend.prepare_job(job, w13.to(DEVICE))
    result = _mine(backend, x, ids)
    assert [p.lagged for p in backend._passes.values()] == [False]  # the pipeline mines MoE same-launch
    _check_int7_output(result, x, ids, w13)
    assert result.credited_work == sum(c - c % 2 for c in _counts(ids)) * n * K
    # M = 16 rows per expert; 2-row tiles 16 wide (an MoE tile is narrower than the expert's N, §7)
    assert result.tickets == EXPERTS * (16 // 2) * (n // 16)
    assert len(result.winners) == 1  # the pass latches one winner
    _check_int7_winner(backend, Mode.INT7_MOE, result.winners[0], job)


@pytest.mark.slow
def test_int7_dense_decode_mines_lagged_within_one_job_and_its_winner_verifies(monkeypatch):
    """Every tile wins at LOOSE: a launch that hashed rows would latch a winner. The first launch
    of a job's pass mines nothing; rows served under the old job are not mined under the new one;
    the next launch mines (and credits) the previous launch's rows, and that winner verifies.
    (The layer is tiny, so the weight-bytes floor for lagging is lifted.)"""
    monkeypatch.setattr("miner.gpu.int7.LAGGED_MIN_WEIGHT_BYTES", 0)
    n = 32
    x, ids, w13 = _inputs(n, 6, seed=5)
    x2, ids2, _ = _inputs(n, 6, seed=7)
    backend = backend_factory(Mode.INT7_DENSE, _Layer(n // 2), DEVICE)
    old = MiningJob.of(_header(LOOSE), 1, 3, height=100_000)
    backend.prepare_job(old, w13.to(DEVICE))
    first = _launch(backend, x, ids)
    assert [p.lagged for p in backend._passes.values()] == [True]  # M = 16 per expert: decode
    _check_int7_output(first, x, ids, w13)
    assert (first.credited_work, first.tickets, first.winners) == (0, 0, [])
    job = MiningJob.of(_header(LOOSE, b"\x33" * 32), 1, 3, height=100_000)
    backend.prepare_job(job, w13.to(DEVICE))
    changed = _launch(backend, x2, ids2)  # the old job's pending rows are gone with its passes
    _check_int7_output(changed, x2, ids2, w13)
    assert (changed.credited_work, changed.tickets, changed.winners) == (0, 0, [])
    result = _mine(backend, x, ids)  # mines x2's rows
    _check_int7_output(result, x, ids, w13)
    assert result.credited_work == sum(c - c % 2 for c in _counts(ids2)) * n * K
    assert result.tickets == EXPERTS * (16 // 2) * (n // 32)  # dense: tiles as wide as N = 32
    assert len(result.winners) == 1
    _check_int7_winner(backend, Mode.INT7_DENSE, result.winners[0], job)


def _fp8_job(parent: bytes, merkle_root: bytes) -> MiningJob:
    """A V4 job on ``parent`` whose target saturates the tile threshold: every hashed tile wins."""
    proposed = BlockHeader(1, BlockHeader.from_bytes(parent).block_hash(), merkle_root, 1_700_000_001, EASY)
    return MiningJob.of(proposed.incomplete_bytes(), 2**240, 4, (parent,), height=2)


def _check_fp8_output(result, x, ids, w13) -> None:
    reference = grouped_fc1(x, ids, w13)
    assert float((result.output - reference).norm() / reference.norm()) < 0.1


@pytest.mark.slow
def test_fp8_decode_mines_lagged_within_one_job_and_its_winner_verifies():
    """16 tokens · top 2 over 4 experts: 8 rows per expert, a lagged decode launch. Every tile wins:
    a launch that drew tickets would latch a winner. The first launch mines nothing; rows served
    under the old job are not mined under the new one (set_job empties the lag buffers); a
    launch's GEMM hashes the previous launch's rows and the launch after draws their tickets, so
    the third launch of the job credits the first one's rows, and that winner verifies."""
    n = 64
    x, ids, w13 = _inputs(n, 16, seed=6)
    x2, ids2, _ = _inputs(n, 16, seed=8)
    parent = BlockHeader(1, b"\x01" * 32, b"\x02" * 32, 1_700_000_000, EASY).to_bytes()
    backend = backend_factory(Mode.FP8_MOE, _Layer(n // 2), DEVICE)
    with pytest.raises(ValueError, match="cert V4"):
        backend.prepare_job(MiningJob.of(_fp8_job(parent, b"\x03" * 32).header76, 1, 3), w13)
    backend.prepare_job(_fp8_job(parent, b"\x03" * 32), w13.to(DEVICE))
    first = _launch(backend, x, ids)
    assert [g.lagged for g in backend._gemms.values()] == [True]
    _check_fp8_output(first, x, ids, w13)
    assert (first.credited_work, first.tickets, first.winners) == (0, 0, [])
    job = _fp8_job(parent, b"\x04" * 32)
    backend.prepare_job(job, w13.to(DEVICE))
    changed = _launch(backend, x2, ids2)
    _check_fp8_output(changed, x2, ids2, w13)
    assert (changed.credited_work, changed.tickets, changed.winners) == (0, 0, [])
    hashed = _launch(backend, x2, ids2)  # its GEMM hashes x2's rows; their tickets are drawn next
    assert (hashed.credited_work, hashed.tickets, hashed.winners) == (0, 0, [])
    result = _mine(backend, x, ids)  # draws the tickets of x2's rows
    _check_fp8_output(result, x, ids, w13)
    counts = _counts(ids2)
    assert result.credited_work == sum(c - c % 4 for c in counts) * n * K
    assert result.tickets == sum(c // 4 for c in counts) * (n // 64)
    assert len(result.winners) == 1
    record = result.winners[0]
    assert record.job == job
    built = backend.build_proof(record)
    assert built.cert_version == 4 and backend.verify(record, built) == (True, "ok")
    rules.check_certificate("regtest-fp8", 2, 4, built.public_data, EASY)
    small = _mine(backend, x[:3], ids[:3])  # too few rows for a lottery tile: served unmined
    assert (small.credited_work, small.tickets) == (0, 0)
    torch.testing.assert_close(small.output, grouped_fc1(x[:3], ids[:3], w13.to(torch.bfloat16).float()),
                               rtol=1e-2, atol=1e-2)
