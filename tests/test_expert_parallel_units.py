"""The expert-parallel pieces that need no second process: the expert plan, the meta packing,
the per-rank proof builder, rank 0's sink, the run summary and the entry point's argument checks."""
from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import grpc
import pytest
import torch
import torch.distributed as dist

from miner.accounting import MiningStats
from miner.backend import BuiltProof, WinnerRecord
from miner.events import EventBus
from miner.expert_parallel import scaling
from miner.expert_parallel.distributed import connect, disconnect
from miner.expert_parallel.moe import pack_meta, unpack_meta
from miner.expert_parallel.plan import ExpertPlan
from miner.expert_parallel.run import load_factory, main
from miner.expert_parallel.runtime import ExpertParallelWorker, local_config, serving_figures, summarize
from miner.expert_parallel.sync import Control, StepSync
from miner.expert_parallel.winners import CompletionSink, Outcome, ProofBuilder, RelayedBackend, RelayedWinner
from miner.model import preset
from miner.service import ControlClient, serve
from miner.worker import WorkerConfig
from test_expert_parallel_support import PlantedBackend, job
from test_miner_support import wait_until


@pytest.mark.parametrize("experts, world", [(8, 1), (8, 2), (8, 4), (6, 4), (7, 3), (5, 5)])
def test_plan_owners_match_a_literal_assignment(experts: int, world: int) -> None:
    plan = ExpertPlan(experts, world)
    literal = [r for e in range(experts) for r in range(world)
               if r * experts // world <= e < (r + 1) * experts // world]
    assert plan.owners(torch.arange(experts)).tolist() == literal
    assert sum(plan.local_count(r) for r in range(world)) == experts
    assert all(plan.local_count(r) >= 1 for r in range(world))
    assert [plan.local_slice(r).start for r in range(world)] == plan.boundaries()[:-1].tolist()


def test_plan_refuses_bad_shapes() -> None:
    with pytest.raises(ValueError, match="at least one expert"):
        ExpertPlan(3, 4)
    with pytest.raises(ValueError, match="world_size must be positive"):
        ExpertPlan(8, 0)
    with pytest.raises(ValueError, match="rank 3 is outside"):
        ExpertPlan(8, 2).first(3)


def test_meta_round_trips_ids_and_weight_bits() -> None:
    ids = torch.tensor([0, 3, 1, 2])
    weights = torch.tensor([0.5, -1e-30, float("inf"), 0.123456789], dtype=torch.float32)
    got_ids, got_weights = unpack_meta(pack_meta(ids, weights))
    assert torch.equal(got_ids, ids)
    assert torch.equal(got_weights.view(torch.int32), weights.view(torch.int32))


def test_local_config_is_the_ranks_experts_with_one_row_per_slot() -> None:
    cfg = local_config(preset("deepseek_v3", num_experts=8, top_k=2), 2)
    assert (cfg.num_experts, cfg.top_k, cfg.n_group, cfg.topk_group, cfg.shared_experts) == (2, 1, 1, 1, 0)


class FakeBackend:
    name = "fake"

    def __init__(self, fail: str = "", verdict: tuple[bool, str] = (True, "ok")) -> None:
        self.fail, self.verdict, self.built = fail, verdict, 0

    def build_proof(self, record: WinnerRecord) -> BuiltProof:
        if self.fail:
            raise RuntimeError(self.fail)
        self.built += 1
        return BuiltProof(f"p{record.tile_row}", b"pd", record.job.cert_version)

    def verify(self, record: WinnerRecord, built: BuiltProof) -> tuple[bool, str]:
        return self.verdict


def record(mining_job, tile: int, expert: int = 1) -> WinnerRecord:
    return WinnerRecord(mining_job, "int7-moe", 0, expert, tile, 0, bytes([tile]) * 32, retained=object())


def finished(builder: ProofBuilder) -> list[RelayedWinner]:
    assert builder.flush(10)
    return builder.take()


def test_builder_proves_once_per_job_then_relays_redundant_and_stale() -> None:
    current = {"job": job(1)}
    builder = ProofBuilder(rank=2, expert_offset=4, current_job=lambda: current["job"])
    backend = FakeBackend()
    assert builder.offer(backend, record(job(1), 0))
    first = finished(builder)
    assert [(w.outcome, w.rank, w.record.expert, w.built.proof_b64) for w in first] == \
        [(Outcome.PROOF, 2, 5, "p0")]
    assert first[0].record.retained is None and first[0].verdict == (True, "ok")
    assert not builder.offer(backend, record(job(1), 1))  # the job already holds a verified proof
    current["job"] = job(2)
    assert builder.offer(backend, record(job(3), 2))  # job 3 is not current on this rank
    out = finished(builder)
    assert [w.outcome for w in out] == [Outcome.REDUNDANT, Outcome.STALE]
    assert backend.built == 1 and builder.take() == []


def test_builder_keeps_building_after_a_failed_verification_and_reports_errors() -> None:
    builder = ProofBuilder(0, 0, lambda: job(1))
    builder.offer(FakeBackend(verdict=(False, "bad opening")), record(job(1), 0))
    builder.offer(FakeBackend(fail="boom"), record(job(1), 1))
    builder.offer(FakeBackend(), record(job(1), 2))
    out = finished(builder)
    assert [(w.outcome, w.verdict) for w in out] == [
        (Outcome.PROOF, (False, "bad opening")), (Outcome.ERROR, (False, "RuntimeError: boom")),
        (Outcome.PROOF, (True, "ok"))]


class FakeCompletion:
    def __init__(self) -> None:
        self.offered: list = []

    def offer(self, backend, rec: WinnerRecord) -> bool:
        self.offered.append((backend, rec))
        return True


def relayed(outcome: Outcome, verdict=(True, "ok")) -> RelayedWinner:
    rec = dataclasses.replace(record(job(1), 3), retained=None)
    built = BuiltProof("p3", b"pd", 3) if outcome == Outcome.PROOF else None
    return RelayedWinner(1, rec, outcome, built, verdict)


def test_sink_sends_proofs_to_completion_and_accounts_the_rest() -> None:
    completion, stats, events = FakeCompletion(), MiningStats(), EventBus()
    sink = CompletionSink(completion, stats, events)
    for outcome in Outcome:
        sink.deliver(relayed(outcome, verdict=(False, "boom") if outcome == Outcome.ERROR else (True, "ok")))
    (backend, rec), = completion.offered
    assert isinstance(backend, RelayedBackend) and rec.retained.outcome == Outcome.PROOF
    assert backend.build_proof(rec).proof_b64 == "p3" and backend.verify(rec, rec.retained.built) == (True, "ok")
    assert (stats.winners, stats.dropped_stale) == (3, 1)  # completion counts the proved one itself
    assert any(e.kind == "error" and "boom" in e.message for e in events.recent())


def test_relayed_backend_names_the_rank_of_a_failed_verification() -> None:
    winner = relayed(Outcome.PROOF, verdict=(False, "bad opening"))
    rec = dataclasses.replace(winner.record, retained=winner)
    assert RelayedBackend().verify(rec, winner.built) == (False, "on rank 1: bad opening")
    no_proof = relayed(Outcome.STALE)
    with pytest.raises(ValueError, match="rank 1 relayed no proof"):
        RelayedBackend().build_proof(dataclasses.replace(no_proof.record, retained=no_proof))


def test_summary_adds_ranks_and_divides_by_the_slowest() -> None:
    ranks = [{"rank": r, "requests": 4, "prefill_tokens": 100, "decode_tokens": 20, "prefill_ms": 1000,
              "decode_ms": 1000 + 1000 * r, "credited_work": 10, "tickets": 5, "launches_mined": 2,
              "launches_unmined": 1, "launches_held": 0, "oom_events": 0, "mining_errors": 0} for r in range(2)]
    serving = serving_figures(ranks)
    assert serving == {"requests": 8, "prefill_tokens": 200, "decode_tokens": 40, "prefill_tokens_per_s": 200.0,
                       "decode_tokens_per_s": 20.0, "tokens_per_s": 80.0}
    out = summarize(ranks, {"winners": 7}, {0: 3, 1: 4}, 0, preset("qwen3_moe"), "cpu")
    assert out["tokens"] == 240 and out["tokens_per_s"] == 80.0 and out["decode_tokens_per_s"] == 20.0
    assert out["credited_work"] == 20 and out["relayed_by_rank"] == {"0": 3, "1": 4} and out["winners"] == 7


def test_entry_point_refuses_bad_arguments_before_joining(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="MODULE:NAME"):
        load_factory("miner.worker")
    with pytest.raises(ValueError, match="no_such"):
        load_factory("miner.worker:no_such")
    assert main(["--model", "no-such-model"]) == 2
    assert "no-such-model" in capsys.readouterr().err
    assert main(["--max-batches", "2", "--warmup-batches", "2"]) == 2
    assert main([]) == 2  # not under torchrun
    assert "RANK and WORLD_SIZE" in capsys.readouterr().err


def test_scaling_commands_and_table() -> None:
    args = scaling.parser().parse_args(["--procs", "1", "2", "4", "--global-batch", "8", "--batches", "5",
                                        "--warmup-batches", "1", "--", "--min-mining-tokens", "8"])
    assert [scaling.batch_per_rank(args, n) for n in (1, 2, 4)] == [8, 4, 2]
    cmd = scaling.run_command(args, 4, "auto", Path("s.json"), Path("d"))
    joined = " ".join(cmd)
    for part in ("torch.distributed.run --standalone --nproc-per-node=4 -m miner.expert_parallel.run",
                 "--batch-size 2", "--max-batches 6", "--warmup-batches 1", "--summary s.json",
                 "--mode auto", "--min-mining-tokens 8"):
        assert part in joined, part
    runs = [{"world_size": n, "mode": "auto", "tokens_per_s": rate, "decode_tokens_per_s": rate / 2,
             "ranks": [{"prefill_ms": 500, "decode_ms": 1500}], "credited_work": 10, "tickets": 1, "winners": 1, "submitted": 1,
             "accepted": 1} for n, rate in ((2, 180.0), (1, 100.0), (4, 300.0))]
    rows = scaling.table(runs).splitlines()[2:]
    assert [row.split(" | ")[4:6] for row in rows] == [["1.00x", "100%"], ["1.80x", "90%"], ["3.00x", "75%"]]
    assert scaling.main(["--procs", "3", "--global-batch", "8"]) == 2


def test_step_sync_broadcasts_control_only_when_it_changes(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    calls = Counter()
    for name in ("broadcast_object_list", "gather_object"):
        real = getattr(dist, name)
        monkeypatch.setattr(dist, name, lambda *a, _real=real, _name=name, **k: (calls.update([_name]),
                                                                              _real(*a, **k))[1])
    ctx = connect(0, 1, "cpu", f"file://{tmp_path / 'store'}")
    try:
        sync = StepSync(0, 1, ctx.control_group)
        first = Control(job(1), "auto", False, False)
        assert sync.exchange(first, [], [5, 6]) == (first, [], [[5, 6]])
        assert sync.exchange(first, [], [7, 8]) == (first, [], [[7, 8]])
        assert calls == {"broadcast_object_list": 1}
        second = dataclasses.replace(first, paused=True)
        winner = relayed(Outcome.REDUNDANT)
        assert sync.exchange(second, [winner], [9, 9]) == (second, [winner], [[9, 9]])
        assert calls == {"broadcast_object_list": 2, "gather_object": 1}
        with pytest.raises(ValueError, match="only rank 0"):
            sync.exchange(None, [], [])
    finally:
        disconnect()


class FixedSource:
    def fetch_job(self):
        return job(1)

    def submit(self, plain_proof_b64: str, mining_job) -> str:
        return "submitted"


def one_rank_worker(tmp_path: Path, factory) -> ExpertParallelWorker:
    """A world of one (file store) running a small model with ``factory``'s backends."""
    ctx = connect(0, 1, "cpu", f"file://{tmp_path / 'store'}")
    cfg = WorkerConfig(model=preset("qwen3_moe", hidden_size=256, num_layers=1, num_heads=4, num_kv_heads=2,
                                    head_dim=64, vocab_size=512, num_experts=4, expert_intermediate=32,
                                    max_seq_len=64),
                       network="regtest", data_dir=tmp_path / "data", batch_size=2, prompt_len=8,
                       max_new_tokens=2, min_mining_tokens=1, poll_interval=0.02)
    worker = ExpertParallelWorker(cfg, ctx, FixedSource(), factory, max_batches=2)
    worker.start()
    host = worker.host
    assert host is not None
    wait_until(lambda: host.poller.current == job(1), 10, "the first job")
    return worker


def test_rank0_status_pause_and_mode_over_grpc(tmp_path: Path) -> None:
    """The figures reach rank 0's status; the gRPC service controls every rank."""
    try:
        worker = one_rank_worker(tmp_path, lambda mode, layer, cfg: PlantedBackend(layer))
        server, port = serve(worker, "127.0.0.1:0")
        client = ControlClient(f"127.0.0.1:{port}")
        try:
            worker.serve()
            status = client.status()
            assert (status.state, status.mode, status.backend) == ("mining", "int7-moe", "planted")
            # figures as of the last step: both prefills (2 × 2 × 8 tokens) are in, requests count at a batch's end
            assert status.serving.prefill_tokens == 32 and status.serving.requests >= 2
            assert status.mining.launches_mined > 0 and status.mining.credited_work == status.mining.launches_mined
            assert client.pause("test").state == "paused"
            mined = worker.stats.launches_mined
            worker.serve()
            assert worker.stats.launches_mined == mined  # paused ranks serve unmined
            client.resume()
            client.set_max_slowdown(0.25)  # every rank takes it with the next step's Control
            worker.serve()
            assert worker.governor.max_slowdown == 0.25 and client.status().mining.max_slowdown == 0.25
            with pytest.raises(grpc.RpcError) as err:
                client.set_max_slowdown(-1.0)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            client.set_max_slowdown(0.0)
            worker.serve()
            assert worker.governor.max_slowdown is None
            client.set_mode("off")
            worker.serve()
            assert worker.mode.value == "off" and client.status().mode_preference == "off"
        finally:
            client.close()
            server.stop(0)
            worker.shutdown()
    finally:
        disconnect()


class BrokenBackend(PlantedBackend):
    def mine_launch(self, activations: torch.Tensor, routing: torch.Tensor):
        raise RuntimeError("kernel fault")


def test_a_mining_fault_serves_unmined_and_is_counted(tmp_path: Path) -> None:
    try:
        worker = one_rank_worker(tmp_path, lambda mode, layer, cfg: BrokenBackend(layer))
        try:
            worker.serve()
            assert worker.stats.mining_errors >= 1 and worker.stats.launches_mined == 0
            assert worker.status()["mining"]["mining_errors"] >= 1
            assert worker.generator.stats.decode_tokens == 2 * 2 * 2  # served all the same
        finally:
            worker.shutdown()
    finally:
        disconnect()


def test_abort_drains_rank0_without_collectives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        worker = one_rank_worker(tmp_path, lambda mode, layer, cfg: PlantedBackend(layer))
        worker.serve()
        monkeypatch.setattr(worker.sync, "exchange", lambda *a: pytest.fail("abort made a collective"))
        worker.abort()
        assert not worker.preparer._thread.is_alive()
        assert any(e.kind == "stopped" for e in worker.events.recent())
    finally:
        disconnect()
