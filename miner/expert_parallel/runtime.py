"""One rank of the expert-parallel worker: its share of the model, its mined layers, its proofs.

Every rank builds the same seeded model, keeps its experts (``moe``), serves its own request
stream (data-parallel attention), and mines its local experts' FC1 as its own instances: each
rank's backend sees only its experts, one routed row per (token, slot) (top-k 1), so its
commitments and lottery are independent of the other ranks'. Before each forward pass the ranks
exchange the control state and the finished winners (``sync``); rank 0 also runs ``HostSide``.
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from miner.accounting import LAUNCH_COUNTERS, SUBMISSION_COUNTERS, MiningStats
from miner.events import EventBus
from miner.expert_parallel.distributed import EPContext
from miner.expert_parallel.host import HostSide
from miner.expert_parallel.moe import shard_model
from miner.expert_parallel.plan import ExpertPlan
from miner.expert_parallel.sync import Control, StepSync
from miner.expert_parallel.winners import ProofBuilder, WinnerSink
from miner.generation import Generator, ServeStats, file_prompts, generated_prompts
from miner.jobs import JobSource, MiningJob
from miner.governor import SlowdownGovernor
from miner.layer import MinedLayer
from miner.model import ModelConfig, build_model
from miner.modes import Mode, choose_mode
from miner.worker import BackendFactory, WorkerConfig, cpu_backend

log = logging.getLogger(__name__)

HOST_COUNTERS = SUBMISSION_COUNTERS
MINING_FIGURES = LAUNCH_COUNTERS
SERVING_FIGURES = ("requests", "prefill_tokens", "decode_tokens", "prefill_ms", "decode_ms")
RANK_FIGURES = SERVING_FIGURES + MINING_FIGURES  # what every rank reports with every step


def local_config(cfg: ModelConfig, experts: int) -> ModelConfig:
    """The model config a rank's backends see: its local experts, one routed row per (token, slot)."""
    return dataclasses.replace(cfg, num_experts=experts, top_k=1, n_group=1, topk_group=1, shared_experts=0)


class JobPreparer:
    """A daemon thread that prepares the backends for the latest requested (job, preference);
    launches before it finishes serve unmined. Older requests are skipped."""

    def __init__(self, worker: ExpertParallelWorker) -> None:
        self.worker = worker
        self._wanted: tuple[MiningJob | None, str] | None = None
        self._stop = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="ep-job-prep", daemon=True)
        self._thread.start()

    def request(self, job: MiningJob | None, preference: str) -> None:
        with self._cond:
            self._wanted = (job, preference)
            self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._wanted is None and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                wanted, self._wanted = self._wanted, None
            try:
                self.worker.prepare(*wanted)
            except Exception:  # a backend's bug must not end job handling; launches stay unmined
                log.exception("rank %d: preparing the job failed", self.worker.ctx.rank)


class _SteppedModel:
    """The model as the generator calls it: the step exchange runs before every forward pass;
    everything else (``cfg``, ``embed``, ...) is the model's own."""

    def __init__(self, worker: ExpertParallelWorker) -> None:
        self.worker = worker

    def __getattr__(self, name: str) -> Any:
        return getattr(self.worker.model, name)

    def __call__(self, *args: Any) -> torch.Tensor:
        self.worker.step()
        device = self.worker.ctx.device
        return self.worker.model(*(a.to(device) if isinstance(a, torch.Tensor) else a for a in args))


class ExpertParallelWorker:
    """``source`` (and optionally ``sink``) on rank 0 only; every rank calls the same methods."""

    def __init__(self, config: WorkerConfig, ctx: EPContext, source: JobSource | None = None,
                 backend_factory: BackendFactory = cpu_backend, sink: WinnerSink | None = None,
                 max_batches: int | None = None, warmup_batches: int = 0) -> None:
        if (source is None) != (ctx.rank != 0):
            raise ValueError("rank 0, and only rank 0, holds the job source")
        if max_batches is not None and max_batches <= warmup_batches:
            raise ValueError(f"max_batches ({max_batches}) must exceed warmup_batches ({warmup_batches})")
        if warmup_batches < 0:
            raise ValueError(f"warmup_batches must not be negative, got {warmup_batches}")
        self.config, self.ctx, self.backend_factory = config, ctx, backend_factory
        self.max_batches, self.warmup_batches = max_batches, warmup_batches
        self.plan = ExpertPlan(config.model.num_experts, ctx.world_size)
        self.local_cfg = local_config(config.model, self.plan.local_count(ctx.rank))
        model = build_model(config.model, config.weights, config.seed)
        self.shards = shard_model(model, self.plan, ctx.rank, ctx.group)
        self.model = model.to(ctx.device)
        self.stats = MiningStats()
        self.control = Control(None, config.mode, False, False)  # the last one applied
        self.mode, self.mode_reason = Mode.OFF, "no current job"
        self.cooldown_until = 0.0
        self.steps = 0
        self._lock = threading.Lock()
        self.builder = ProofBuilder(ctx.rank, self.plan.first(ctx.rank), lambda: self.control.job)
        self.governor = SlowdownGovernor(self._rank_cap(config.max_slowdown))
        self.layers = [MinedLayer(s.layer_id, self.stats, self.may_mine, self.builder.offer, self._mining_fault,
                                  config.min_mining_tokens, self.governor) for s in self.shards]
        for shard, layer in zip(self.shards, self.layers):
            shard.launcher = layer
        self.sync = StepSync(ctx.rank, ctx.world_size, ctx.control_group)
        self.host = HostSide(config, source, self.stats, sink) if source is not None else None
        self.generator = Generator(_SteppedModel(self), config.batch_size, config.max_new_tokens)  # type: ignore[arg-type]
        self.preparer = JobPreparer(self)

    # -- mining state -------------------------------------------------------------------------
    def _rank_cap(self, max_slowdown: float | None) -> float | None:
        """This rank's share of the model's slowdown cap. The ranks run in lockstep (every MoE
        layer waits on its all-to-all), so a rank's mined launch stalls them all and the ranks'
        extra times add up in the worst case: each rank gets cap / world_size, which keeps the
        model within the cap however the ranks' mined launches fall."""
        return None if max_slowdown is None else max_slowdown / self.ctx.world_size

    def may_mine(self) -> bool:
        return (not self.control.paused and self.mode != Mode.OFF
                and time.monotonic() >= self.cooldown_until)

    def _mining_fault(self, exc: Exception) -> None:
        """A launch's mining failed on this rank (it was served unmined): cool down and count."""
        self.cooldown_until = time.monotonic() + self.config.oom_cooldown_s
        oom = isinstance(exc, (MemoryError, torch.OutOfMemoryError))
        self.stats.add("oom_events" if oom else "mining_errors")
        log.warning("rank %d: %s while mining (%s); unmined for %.0f s", self.ctx.rank,
                    "out of memory" if oom else type(exc).__name__, exc, self.config.oom_cooldown_s)

    def prepare(self, job: MiningJob | None, preference: str) -> None:
        """Backends for this rank's layers (job thread); installed only if still the wanted job."""
        decision = choose_mode(job, self.config.network, preference)
        mode, reason = decision.mode, decision.reason
        backends = []
        if job is not None and mode != Mode.OFF:
            try:
                for layer, shard in zip(self.layers, self.shards):
                    backend = self.backend_factory(mode, layer.layer_id, self.local_cfg)
                    backend.prepare_job(job, shard.w13)
                    backends.append(backend)
            except (NotImplementedError, ValueError) as exc:
                backends, mode, reason = [], Mode.OFF, f"cannot mine {mode.value}: {exc}"
        with self._lock:
            if (self.control.job, self.control.preference) != (job, preference):
                return  # a newer job arrived meanwhile
            for layer, backend in itertools.zip_longest(self.layers, backends):
                layer.backend = backend
            changed = (mode, reason) != (self.mode, self.mode_reason)
            self.mode, self.mode_reason = mode, reason
        if changed and self.host is not None:
            self.host.events.publish("mode", f"{mode.value}: {reason}")

    # -- the per-step exchange (serving thread, every rank) -----------------------------------
    def figures(self) -> list[int]:
        """This rank's running figures, in ``RANK_FIGURES`` order."""
        s, m = self.generator.stats, self.stats
        serving = [s.requests, s.prefill_tokens, s.decode_tokens, round(s.prefill_seconds * 1000),
                   round(s.decode_seconds * 1000)]
        return serving + [getattr(m, name) for name in MINING_FIGURES]

    def step(self) -> None:
        control, relayed, figures = self.sync.exchange(
            self.host.control() if self.host is not None else None, self.builder.take(), self.figures())
        if self.host is not None:
            self.host.deliver(relayed)
            self.host.record_figures([dict(zip(RANK_FIGURES, row)) for row in figures])
        if (control.job, control.preference) != (self.control.job, self.control.preference):
            with self._lock:
                for layer in self.layers:
                    layer.backend = None  # the old job's launches would only make stale winners
                self.control = control
            self.preparer.request(control.job, control.preference)
        else:
            self.control = control
        if self._rank_cap(control.max_slowdown) != self.governor.max_slowdown:
            self.governor.set_cap(self._rank_cap(control.max_slowdown))
        self.steps += 1

    # -- serving ------------------------------------------------------------------------------
    def prompts(self) -> Iterator[list[int]]:
        """This rank's request stream: every world_size-th line of the prompt file, or its own
        generated prompts."""
        cfg = self.config
        if cfg.prompts is not None:
            return itertools.islice(file_prompts(cfg.prompts, cfg.model.vocab_size), self.ctx.rank, None,
                                    self.ctx.world_size)
        return generated_prompts(cfg.prompt_len, cfg.model.vocab_size, cfg.seed + self.ctx.rank)

    def start(self) -> None:
        if self.host is not None:
            self.host.start()

    def serve(self, on_batch: Callable[[], None] = lambda: None) -> None:
        """Serve batches in lockstep until rank 0 says stop (or ``max_batches`` on every rank);
        the serving figures restart after ``warmup_batches``."""
        batches = 0
        for _ in self.generator.serve(self.prompts()):
            batches += 1
            if batches == self.warmup_batches:
                self.generator.stats = ServeStats()
            if self.host is not None:
                self.host.check_blocks()
            on_batch()
            if self.control.stop or (self.max_batches is not None and batches >= self.max_batches):
                return

    def shutdown(self, build_timeout_s: float = 60.0) -> dict[str, Any] | None:
        """Finish every rank's proofs, relay them, drain the submitter; rank 0 returns the summary."""
        if not self.builder.flush(build_timeout_s):
            log.error("rank %d: proofs still building after %.0f s are not relayed", self.ctx.rank,
                      build_timeout_s)
        self.step()  # the last winners; every rank makes this call once more, so all match
        self.preparer.stop()
        persisted = self.host.shutdown() if self.host is not None else 0
        return self._summary(persisted)

    def abort(self) -> None:
        """After a failure on this rank: no more collectives (the other ranks may be anywhere);
        rank 0 still drains its submitter and persists unsent proofs."""
        self.preparer.stop()
        if self.host is not None:
            self.host.shutdown()

    def _summary(self, persisted: int) -> dict[str, Any] | None:
        """Rank 0: the run's figures, from what every rank reported at the last step."""
        if self.host is None:
            return None
        mine = self.stats.snapshot()
        ranks = [{"rank": r, "local_experts": self.plan.local_count(r), "steps": self.steps, **figures}
                 for r, figures in enumerate(self.host.fleet)]
        return summarize(ranks, {name: mine[name] for name in HOST_COUNTERS}, self.host.relayed_by_rank,
                         persisted, self.config.model, str(self.ctx.device))

    # -- control and status on rank 0 (what miner.service needs) ------------------------------
    def _host(self) -> HostSide:
        if self.host is None:
            raise RuntimeError(f"rank {self.ctx.rank} is not the host's rank 0")
        return self.host

    @property
    def events(self) -> EventBus:
        return self._host().events

    def pause(self, reason: str) -> None:
        self._host().pause(reason)

    def resume(self) -> None:
        self._host().resume()

    def set_mode(self, mode: str) -> None:
        self._host().set_mode(mode)

    def set_max_slowdown(self, max_slowdown: float | None) -> None:
        self._host().set_max_slowdown(max_slowdown)

    def state(self) -> str:
        host = self._host()
        if host.paused:
            return "paused"
        if time.monotonic() < self.cooldown_until:
            return "cooldown"
        return "mining" if self.mode != Mode.OFF and host.poller.current is not None else "waiting"

    def status(self) -> dict[str, Any]:
        """The whole host in ``miner.worker.Worker.status``'s shape: serving and mining figures
        summed over the ranks as of the last step, submissions from rank 0."""
        host = self._host()
        job = host.poller.current
        mining = self.stats.snapshot()
        mining.update({name: host.total(name) for name in MINING_FIGURES})
        mining["hashrate"] = host.hashrate
        mining["pending_winners"] = host.completion.pending
        mining.update(self.governor.snapshot())  # rank 0's measured slowdown
        mining["max_slowdown"] = host.max_slowdown or 0.0  # the model's cap, as set (rank 0 has it first)
        backend = self.layers[0].backend if self.layers else None
        return {
            "state": self.state(), "mode": self.mode.value, "mode_preference": host.preference,
            "mode_reason": self.mode_reason, "network": self.config.network,
            "job_id": job.job_id if job else "", "cert_version": job.cert_version if job else 0,
            "height": job.height if job is not None and job.height is not None else -1,
            "source_connected": host.poller.failures == 0, "source_error": host.poller.last_error,
            "model": self.config.model.style, "backend": backend.name if backend is not None else "",
            "uptime_s": time.monotonic() - host.started,
            "serving": serving_figures(host.fleet), "mining": mining,
        }


def _rate(tokens: int, seconds: float) -> float:
    return tokens / seconds if seconds else 0.0


def serving_figures(ranks: list[dict[str, int]]) -> dict[str, Any]:
    """Requests, tokens and tokens/s of all ranks together. They serve in lockstep, so the host's
    time is the slowest rank's."""
    prefill, decode = sum(r["prefill_tokens"] for r in ranks), sum(r["decode_tokens"] for r in ranks)
    prefill_s = max((r["prefill_ms"] for r in ranks), default=0) / 1000
    decode_s = max((r["decode_ms"] for r in ranks), default=0) / 1000
    busy_s = max((r["prefill_ms"] + r["decode_ms"] for r in ranks), default=0) / 1000
    return {"requests": sum(r["requests"] for r in ranks), "prefill_tokens": prefill, "decode_tokens": decode,
            "prefill_tokens_per_s": _rate(prefill, prefill_s), "decode_tokens_per_s": _rate(decode, decode_s),
            "tokens_per_s": _rate(prefill + decode, busy_s)}


def summarize(ranks: list[dict[str, Any]], host: dict[str, Any], relayed_by_rank: dict[int, int],
              persisted: int, model: ModelConfig, device: str) -> dict[str, Any]:
    """Whole-run figures: serving over all ranks, the ranks' mining totals, rank 0's submission
    counters, and every rank's own figures."""
    serving = serving_figures(ranks)
    return {
        "world_size": len(ranks), "device": device, "model": dataclasses.asdict(model),
        "tokens": serving["prefill_tokens"] + serving["decode_tokens"],
        "tokens_per_s": serving["tokens_per_s"], "decode_tokens_per_s": serving["decode_tokens_per_s"],
        **{name: sum(r[name] for r in ranks) for name in MINING_FIGURES},
        **host, "persisted_at_exit": persisted,
        "relayed_by_rank": {str(r["rank"]): relayed_by_rank.get(r["rank"], 0) for r in ranks},
        "ranks": ranks,
    }
