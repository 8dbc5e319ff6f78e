"""Winners from every rank reach the one submitter on rank 0 exactly once.

Three gloo ranks run the expert-parallel worker with a backend that plants one winner per local
expert per launch, while rank 0's job source moves to a new job every few polls (so winners turn
stale and redundant as well as proved). Every planted winner must appear in rank 0's ledger once:
none lost, none twice. A second run, through torchrun and the entry point, mines real INT7 proofs
on two ranks against the devnet.
"""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

from miner.expert_parallel.runtime import ExpertParallelWorker
from miner.expert_parallel.winners import Outcome, RelayedWinner
from miner.jobs import MiningJob
from miner.model import preset
from miner.worker import WorkerConfig
from node_client.devnet import start_devnet
from test_expert_parallel_support import EPContext, PlantedBackend, job, load_all, run_ranks, save

SMALL = dict(hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=64, vocab_size=512,
             num_experts=6, expert_intermediate=64, max_seq_len=64)
TINY_INT7 = dict(SMALL, hidden_size=2048, num_layers=1, num_experts=4, expert_intermediate=128)


class MovingSource:
    """A job source whose job changes every ``every`` polls; submissions are not expected."""

    def __init__(self, every: int) -> None:
        self.every, self.polls = every, 0

    def fetch_job(self) -> MiningJob:
        self.polls += 1
        return job(nonce=self.polls // self.every)

    def submit(self, plain_proof_b64: str, mining_job: MiningJob) -> str:
        raise AssertionError("the ledger sink submits nothing")


class LedgerSink:
    def __init__(self) -> None:
        self.ledger: list[RelayedWinner] = []

    def deliver(self, relayed: RelayedWinner) -> None:
        self.ledger.append(relayed)


def _planted_body(ctx: EPContext, out_dir: Path) -> None:
    backends: list[PlantedBackend] = []

    def factory(mode, layer_id, cfg) -> PlantedBackend:
        backends.append(PlantedBackend(layer_id))
        return backends[-1]

    config = WorkerConfig(model=preset("qwen3_moe", **SMALL), network="regtest", data_dir=out_dir / "data",
                          batch_size=2, prompt_len=8, max_new_tokens=4, min_mining_tokens=1,
                          poll_interval=0.02)
    sink = LedgerSink() if ctx.rank == 0 else None
    worker = ExpertParallelWorker(config, ctx, MovingSource(every=3) if ctx.rank == 0 else None, factory,
                                  sink=sink, max_batches=6)
    worker.start()
    worker.serve()
    worker.shutdown()
    offset = worker.plan.first(ctx.rank)
    emitted = [(ctx.rank, r.layer_id, r.expert + offset, r.tile_row, r.tile_col, r.ticket)
               for b in backends for r in b.emitted]
    save(out_dir, ctx.rank, {"emitted": emitted, "ledger": sink.ledger if sink else None})


def test_planted_winners_from_every_rank_reach_rank0_exactly_once(tmp_path: Path) -> None:
    run_ranks(3, _planted_body, tmp_path)
    ranks = load_all(tmp_path, 3)
    emitted = [key for r in ranks for key in r["emitted"]]
    ledger = ranks[0]["ledger"]
    assert {key[0] for key in emitted} == {0, 1, 2}, "every rank planted winners"
    received = Counter(w.key for w in ledger)
    assert max(received.values()) == 1, "a winner reached the submitter twice"
    assert sorted(received) == sorted(emitted), "planted and received winners differ"
    assert len(emitted) == len(set(emitted))
    outcomes = Counter((w.rank, w.outcome) for w in ledger)
    for rank in range(3):
        assert outcomes[rank, Outcome.PROOF] >= 1, f"rank {rank} relayed no proof"
    assert sum(n for (_, o), n in outcomes.items() if o == Outcome.REDUNDANT) > 0
    for w in ledger:
        assert w.record.retained is None  # no operands cross the wire
        if w.outcome == Outcome.PROOF:
            assert w.built.proof_b64 == "proof-" + w.record.ticket.hex() and w.verdict == (True, "ok")


def test_torchrun_two_ranks_mine_accepted_devnet_blocks(tmp_path: Path) -> None:
    """The entry point under torchrun: 2 gloo ranks mine real INT7 proofs for a devnet."""
    model = tmp_path / "model.json"
    model.write_text(json.dumps({"model_type": "qwen3_moe", **TINY_INT7}))
    with start_devnet("regtest", datadir=tmp_path / "chain") as devnet:
        start = devnet.chain.height
        done = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
             "-m", "miner.expert_parallel.run", "--device", "cpu", "--model", str(model),
             "--batch-size", "2", "--prompt-len", "32", "--max-new-tokens", "2", "--min-mining-tokens", "4",
             "--gateway", devnet.gateway_address, "--pearld", devnet.pearld_url,
             "--pearld-user", devnet.rpc_user, "--pearld-password", devnet.rpc_password,
             "--max-blocks", "2", "--duration", "150", "--data-dir", str(tmp_path / "data"),
             "--summary", str(tmp_path / "summary.json")],
            capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        devnet.gateway.wait_idle()
        results = devnet.gateway.results()
        height = devnet.chain.height
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["accepted"] >= 2 and height >= start + 2
    assert all(summary["relayed_by_rank"][str(rank)] > 0 for rank in range(2)), summary["relayed_by_rank"]
    assert summary["submitted"] == len(results) and all(r.status in ("accepted", "stale") for r in results)
    assert summary["verify_failed"] == 0 and summary["refused_by_rules"] == 0
    assert all(r["credited_work"] > 0 and r["local_experts"] == 2 for r in summary["ranks"])
