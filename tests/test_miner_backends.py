"""The CPU mining backends and the mined layer: served output, winners, proofs, rules, OOM."""
import numpy as np
import pytest
import torch

from miner.accounting import MiningStats
from miner.backend import LaunchResult, expert_token_lists
from miner.cpu_fp8 import CpuFp8Backend, opened
from miner.cpu_int7 import CpuInt7Backend, quantize_rows
from miner.jobs import MiningJob
from miner.layer import MinedLayer
from miner.model.moe import grouped_fc1
from node_client import rules
from proof.chain import BlockHeader

EASY = 0x1E010000  # the regtest pow limit
HARD = 0x03000001  # target 1: no ticket ever wins
EXPERTS, TOP_K, N_OUT, K = 8, 2, 256, 2048


def header76(bits: int) -> bytes:
    return BlockHeader(1, b"\x11" * 32, b"\x22" * 32, 1_700_000_000, bits).incomplete_bytes()


def int7_job(bits: int, cert: int = 3, height: int = 5) -> MiningJob:
    return MiningJob.of(header76(bits), 1, cert, height=height)


@pytest.fixture(scope="module")
def launch_inputs():
    gen = torch.Generator().manual_seed(0)
    w13 = torch.randn(EXPERTS, N_OUT, K, generator=gen) * K ** -0.5
    x = torch.randn(48, K, generator=gen)
    ids = torch.stack([torch.randperm(EXPERTS, generator=gen)[:TOP_K] for _ in range(48)])
    return x, ids, w13


def test_quantize_rows_is_symmetric_int7() -> None:
    x = np.random.default_rng(1).standard_normal((5, 64)).astype(np.float32)
    x[2] = 0
    codes, scales = quantize_rows(x)
    assert codes.dtype == np.int8 and np.abs(codes).max() == 64 and (codes[2] == 0).all()
    assert np.abs(codes * scales[:, None] - x).max() <= scales.max() / 2 + 1e-6


@pytest.mark.parametrize("mode", ["int7-moe", "int7-dense"])
def test_int7_launch_serves_the_committed_product_and_its_winners_verify(launch_inputs, mode) -> None:
    from miner.modes import Mode

    x, ids, w13 = launch_inputs
    backend = CpuInt7Backend(Mode(mode), 0, EXPERTS, TOP_K)
    backend.prepare_job(int7_job(EASY), w13)
    result = backend.mine_launch(x, ids)
    # served output: exactly the dequantised int7 product, slot by slot
    a_codes, a_scales = quantize_rows(x.numpy())
    b_codes, b_scales = quantize_rows(w13.reshape(-1, K).numpy())
    for t in (0, 17, 47):
        for s in range(TOP_K):
            e = int(ids[t, s])
            rows = slice(e * N_OUT, (e + 1) * N_OUT)
            want = (b_codes[rows].astype(np.int64) @ a_codes[t].astype(np.int64)) * a_scales[t] * b_scales[rows]
            np.testing.assert_allclose(result.output[t, s].numpy(), want, rtol=1e-5, atol=1e-6)
    reference = grouped_fc1(x, ids, w13)
    assert float((result.output - reference).norm() / reference.norm()) < 0.05
    # work and tiles: whole 4-row tiles per expert (MoE) / per expert instance (dense)
    tokens = expert_token_lists(ids, EXPERTS)
    whole = sum(len(t) - len(t) % 4 for t in tokens)
    assert result.credited_work == whole * N_OUT * K
    assert result.tickets == (whole // 4) * (N_OUT // 64) * 8
    assert result.winners, "the easy target should give winners"
    for record in result.winners[:2]:
        built = backend.build_proof(record)
        assert backend.verify(record, built) == (True, "ok")
        assert (len(built.public_data) > 164) == (mode == "int7-moe")
        rules.check_certificate("regtest", 5, 3, built.public_data, EASY)
    if mode == "int7-moe":
        with pytest.raises(rules.RuleViolation, match="dense-only"):
            rules.check_certificate("mainnet@100000", 100_000, 3, built.public_data, EASY)
    else:
        rules.check_certificate("mainnet@100000", 100_000, 3, built.public_data, EASY)


def test_int7_v1_proofs_use_the_legacy_form(launch_inputs) -> None:
    from miner.modes import Mode

    x, ids, w13 = launch_inputs
    backend = CpuInt7Backend(Mode.INT7_DENSE, 0, EXPERTS, TOP_K)
    backend.prepare_job(int7_job(EASY, cert=1), w13)
    record = backend.mine_launch(x, ids).winners[0]
    built = backend.build_proof(record)
    assert built.cert_version == 1 and backend.verify(record, built) == (True, "ok")


def test_hard_target_gives_no_winner(launch_inputs) -> None:
    from miner.modes import Mode

    x, ids, w13 = launch_inputs
    backend = CpuInt7Backend(Mode.INT7_MOE, 0, EXPERTS, TOP_K)
    backend.prepare_job(int7_job(HARD), w13)
    result = backend.mine_launch(x, ids)
    assert result.winners == [] and result.tickets > 0


def test_int7_backend_refuses_bad_setup(launch_inputs) -> None:
    from miner.modes import Mode

    with pytest.raises(ValueError, match="int7"):
        CpuInt7Backend(Mode.FP8_MOE, 0, EXPERTS, TOP_K)
    backend = CpuInt7Backend(Mode.INT7_MOE, 0, 4, TOP_K)
    with pytest.raises(ValueError, match="experts"):
        backend.prepare_job(int7_job(EASY), launch_inputs[2])
    with pytest.raises(RuntimeError, match="prepare_job"):
        backend.mine_launch(launch_inputs[0], launch_inputs[1])


def test_fp8_launch_finds_a_verifying_v4_proof() -> None:
    gen = torch.Generator().manual_seed(2)
    experts, n_out, k, m = 2, 128, 1024, 16
    w13 = torch.randn(experts, n_out, k, generator=gen) * 0.03
    x = torch.randn(m, k, generator=gen)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:1] for _ in range(m)])
    parent = BlockHeader(1, b"\x01" * 32, b"\x02" * 32, 1_700_000_000, EASY).to_bytes()
    proposed = BlockHeader(1, BlockHeader.from_bytes(parent).block_hash(), b"\x03" * 32, 1_700_000_001, EASY)
    # a target far above the pow limit makes nearly every tile win (the job's target is what counts)
    job = MiningJob.of(proposed.incomplete_bytes(), 2**240, 4, (parent,), height=2)
    backend = CpuFp8Backend(0, experts)
    backend.prepare_job(job, w13)
    result = backend.mine_launch(x, ids)
    a, b = opened(x.numpy()), opened(w13.reshape(-1, k).numpy()).reshape(experts, n_out, k)
    for t in range(m):
        np.testing.assert_allclose(result.output[t, 0].numpy(), b[int(ids[t, 0])] @ a[t], rtol=1e-4, atol=1e-4)
    assert len(result.winners) == 1
    record = result.winners[0]
    built = backend.build_proof(record)
    assert built.cert_version == 4 and backend.verify(record, built) == (True, "ok")
    rules.check_certificate("regtest-fp8", 2, 4, built.public_data, EASY)
    with pytest.raises(ValueError, match="cert V4"):
        backend.prepare_job(MiningJob.of(proposed.incomplete_bytes(), 1, 3), w13)


class FlakyBackend:
    name = "flaky"

    def __init__(self, error: Exception) -> None:
        self.calls, self.error = 0, error

    def mine_launch(self, x: torch.Tensor, ids: torch.Tensor) -> LaunchResult:
        self.calls += 1
        raise self.error


def test_mined_layer_serves_unmined_when_mining_cannot_run(launch_inputs) -> None:
    x, ids, w13 = launch_inputs
    stats, faults, allowed = MiningStats(), [], [True]
    layer = MinedLayer(0, stats, lambda: allowed[0], lambda b, r: None, faults.append, min_tokens=16)
    reference = grouped_fc1(x, ids, w13)
    torch.testing.assert_close(layer.launch(x, ids, w13), reference)  # no backend yet
    for error in (MemoryError("host"), torch.OutOfMemoryError("device"), ValueError("values must be finite")):
        layer.backend = FlakyBackend(error)  # type: ignore[assignment]
        torch.testing.assert_close(layer.launch(x, ids, w13), reference)  # served unmined
    assert [type(f) for f in faults] == [MemoryError, torch.OutOfMemoryError, ValueError]
    torch.testing.assert_close(layer.launch(x[:8], ids[:8], w13), reference[:8])  # too few tokens
    allowed[0] = False
    layer.launch(x, ids, w13)  # paused / cooling down
    assert layer.backend.calls == 1 and stats.launches_unmined == 6 and stats.launches_mined == 0


def test_a_backend_that_cannot_prepare_switches_mining_off(tmp_path) -> None:
    from miner.modes import Mode
    from miner.worker import Worker
    from test_miner_support import tiny_config

    class NoSource:
        def fetch_job(self) -> MiningJob:
            raise AssertionError("not polled here")

        def submit(self, proof: str, job: MiningJob) -> str:
            raise AssertionError("nothing to submit")

    class Broken(CpuInt7Backend):
        def prepare_job(self, job: MiningJob, weights: torch.Tensor) -> None:
            raise RuntimeError("CUDA error: no kernel image")

    def broken(mode: Mode, layer_id: int, cfg) -> CpuInt7Backend:
        return Broken(mode, layer_id, cfg.num_experts, cfg.top_k)

    worker = Worker(tiny_config(tmp_path), NoSource(), broken)
    worker._on_job(int7_job(EASY))
    status = worker.status()
    assert status["mode"] == "off" and "CUDA error" in status["mode_reason"]
    assert all(layer.backend is None for layer in worker.layers)
