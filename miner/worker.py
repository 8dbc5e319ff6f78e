"""The worker: serves the model, mines inside its MoE layers, and wires every part together.

Threads: the serving loop (the caller's), ``job-poller`` (jobs, mode changes and per-job backend
preparation), ``mining-completion`` (proofs and submissions), the gRPC server's pool and the
metrics server. Inference never waits on the network: the poller and completion threads do.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from miner.accounting import MiningStats
from miner.backend import MiningBackend
from miner.completion import CompletionWorker
from miner.cpu_fp8 import CpuFp8Backend
from miner.cpu_int7 import CpuInt7Backend
from miner.events import EventBus
from miner.generation import Generator, file_prompts, generated_prompts, prompt_lines
from miner.governor import SlowdownGovernor, slowdown_cap_text
from miner.jobs import Backoff, JobPoller, JobSource, MiningJob, POLL_ERRORS
from miner.layer import MinedLayer
from miner.model import ModelConfig, build_model
from miner.model.weights import check_weights_file
from miner.modes import AUTO, CHOICES, Mode, choose_mode, job_height
from miner.persistence import SubmissionStore

log = logging.getLogger(__name__)


@dataclass
class WorkerConfig:
    model: ModelConfig
    network: str
    data_dir: Path
    weights: Path | None = None
    seed: int = 0
    device: str = "cpu"
    prompts: Path | None = None
    batch_size: int = 4
    prompt_len: int = 64
    max_new_tokens: int = 16
    min_mining_tokens: int = 16
    max_slowdown: float | None = None  # cap on mining's slowdown of serving (miner.governor); None: none
    mode: str = AUTO
    poll_interval: float = 1.0
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    oom_cooldown_s: float = 30.0  # after any mining fault, OOM or not (name kept for callers)
    duration_s: float | None = None
    max_blocks: int | None = None

    def check(self) -> None:
        """Refuse a configuration that could only fail later (a bad mode, a missing file, a device
        this torch cannot use, a non-positive size), with a ValueError that names the setting,
        before anything is started."""
        if self.mode not in CHOICES:
            raise ValueError(f"mode {self.mode!r} is not one of {', '.join(CHOICES)}")
        for name in ("batch_size", "prompt_len", "max_new_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.max_new_tokens >= self.model.max_seq_len:
            raise ValueError(f"max_new_tokens ({self.max_new_tokens}) leaves no room for a prompt in the "
                             f"model's {self.model.max_seq_len} positions")
        if self.min_mining_tokens < 0:
            raise ValueError(f"min_mining_tokens must be 0 or more, got {self.min_mining_tokens}")
        for name in ("duration_s", "max_blocks"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive when given, got {getattr(self, name)}")
        if self.weights is not None:
            check_weights_file(self.weights)
        if self.prompts is not None:
            prompt_lines(self.prompts)
        _check_device(self.device)


def _check_device(device: str) -> None:
    """A device string torch parses and can use here (a CUDA device needs a CUDA build and the card)."""
    try:
        parsed = torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"device {device!r} is not a torch device: {exc}") from None
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r}: this torch build or machine has no usable CUDA device")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) here")
    elif parsed.type != "cpu":
        raise ValueError(f"device {device!r}: the worker runs on cuda or cpu")


BackendFactory = Callable[[Mode, int, ModelConfig], MiningBackend]


def cpu_backend(mode: Mode, layer_id: int, cfg: ModelConfig) -> MiningBackend:
    """The CPU reference backends: torch GEMMs, mining with proof/'s CPU pieces."""
    if mode in (Mode.INT7_MOE, Mode.INT7_DENSE):
        return CpuInt7Backend(mode, layer_id, cfg.num_experts, cfg.top_k)
    if mode == Mode.FP8_MOE:
        return CpuFp8Backend(layer_id, cfg.num_experts)
    raise NotImplementedError(f"no CPU backend mines {mode.value}")


@dataclass
class _Control:
    paused: str = ""  # reason, empty when not paused
    cooldown_until: float = 0.0
    preference: str = AUTO
    mode: Mode = Mode.OFF
    mode_reason: str = "no current job"
    backend: str = ""
    started: float = field(default_factory=time.monotonic)


class Worker:
    """One serving process: the model with mined layers, the job poller, the completion thread,
    and the state the control service reads and changes."""

    def __init__(self, config: WorkerConfig, source: JobSource,
                 backend_factory: BackendFactory = cpu_backend) -> None:
        config.check()
        self.config, self.source, self.backend_factory = config, source, backend_factory
        self.events = EventBus()
        self.stats = MiningStats()
        self.store = SubmissionStore(config.data_dir)
        self.model = build_model(config.model, config.weights, config.seed).to(config.device)
        self.generator = Generator(self.model, config.batch_size, config.max_new_tokens)
        self.poller = JobPoller(source, interval=config.poll_interval,
                                backoff=Backoff(config.backoff_initial_s, config.backoff_max_s))
        self.completion = CompletionWorker(source, self.store, self.stats, self.events, config.network,
                                           lambda: self.poller.current)
        self.control = _Control(preference=config.mode)
        self._lock = threading.Lock()
        self.stop_requested = threading.Event()
        self.governor = SlowdownGovernor(config.max_slowdown)
        self.layers = [MinedLayer(block.layer_id, self.stats, self.may_mine, self.completion.offer,
                                  self._mining_fault, config.min_mining_tokens, self.governor)
                       for block in self.model.moe_blocks]
        for block, layer in zip(self.model.moe_blocks, self.layers):
            block.launcher = layer
        self.poller.subscribe(self._on_job)

    # -- state --------------------------------------------------------------------------------
    def may_mine(self) -> bool:
        c = self.control
        return not c.paused and time.monotonic() >= c.cooldown_until and c.mode != Mode.OFF

    def state(self) -> str:
        c = self.control
        if c.paused:
            return "paused"
        if time.monotonic() < c.cooldown_until:
            return "cooldown"
        return "mining" if c.mode != Mode.OFF and self.poller.current is not None else "waiting"

    def _mining_fault(self, exc: Exception) -> None:
        """A launch's mining failed (it was served unmined): cool down, count, tell."""
        self.control.cooldown_until = time.monotonic() + self.config.oom_cooldown_s
        oom = isinstance(exc, (MemoryError, torch.OutOfMemoryError))
        self.stats.add("oom_events" if oom else "mining_errors")
        what = "out of memory while mining" if oom else f"mining failed ({type(exc).__name__})"
        self.events.publish("oom" if oom else "error",
                            f"{what}: {exc}; serving unmined for {self.config.oom_cooldown_s:.0f} s")

    # -- jobs and modes (job thread) ----------------------------------------------------------
    def _on_job(self, job: MiningJob | None) -> None:
        if job is None:
            self.events.publish("source_down", f"job retired, mining paused: {self.poller.last_error}")
        else:
            height = job.height if job.height is not None else \
                f"unknown (rules judged at {job_height(job, self.config.network)})"
            self.events.publish("job", f"job {job.job_id} cert V{job.cert_version} height {height}")
        self._apply_mode(job)
        self.completion.wake()

    def _apply_mode(self, job: MiningJob | None) -> None:
        with self._lock:
            decision = choose_mode(job, self.config.network, self.control.preference)
            for layer in self.layers:
                layer.backend = None
            mode, reason, name = decision.mode, decision.reason, ""
            if job is not None and mode != Mode.OFF:
                try:
                    for layer, block in zip(self.layers, self.model.moe_blocks):
                        backend = self.backend_factory(mode, layer.layer_id, self.config.model)
                        backend.prepare_job(job, block.w13)
                        layer.backend, name = backend, backend.name
                except Exception as exc:  # a backend that cannot prepare leaves inference serving
                    log.warning("cannot prepare %s: %s", mode.value, exc)
                    for layer in self.layers:
                        layer.backend = None
                    mode, reason, name = Mode.OFF, f"cannot mine {mode.value}: {exc}", ""
            changed = (mode, reason) != (self.control.mode, self.control.mode_reason)
            self.control.mode, self.control.mode_reason, self.control.backend = mode, reason, name
        if changed:
            self.events.publish("mode", f"{mode.value}: {reason}")

    # -- control (gRPC) -----------------------------------------------------------------------
    def pause(self, reason: str) -> None:
        self.control.paused = reason or "paused"
        self.events.publish("paused", self.control.paused)

    def resume(self) -> None:
        self.control.paused = ""
        self.control.cooldown_until = 0.0
        self.events.publish("resumed", "mining resumed")

    def set_max_slowdown(self, max_slowdown: float | None) -> None:
        """A new slowdown cap (None: none); a bad one raises ValueError (GovernorError)."""
        self.governor.set_cap(max_slowdown)
        self.events.publish("slowdown", slowdown_cap_text(max_slowdown))

    def set_mode(self, mode: str) -> None:
        if mode not in CHOICES:
            raise ValueError(f"mode {mode!r} is not one of {CHOICES}")
        self.control.preference = mode
        self.events.publish("mode_preference", f"mode preference set to {mode}")
        self._apply_mode(self.poller.current)

    def status(self) -> dict[str, Any]:
        job = self.poller.current
        s = self.generator.stats
        mining = self.stats.snapshot()
        mining["pending_winners"] = self.completion.pending
        mining.update(self.governor.snapshot())
        return {
            "state": self.state(), "mode": self.control.mode.value,
            "mode_preference": self.control.preference, "mode_reason": self.control.mode_reason,
            "network": self.config.network, "job_id": job.job_id if job else "",
            "cert_version": job.cert_version if job else 0,
            "height": job.height if job is not None and job.height is not None else -1,
            "source_connected": self.poller.failures == 0, "source_error": self.poller.last_error,
            "model": self.config.model.style, "backend": self.control.backend,
            "uptime_s": time.monotonic() - self.control.started,
            "serving": {"requests": s.requests, "prefill_tokens": s.prefill_tokens,
                        "decode_tokens": s.decode_tokens, "prefill_tokens_per_s": s.prefill_tokens_per_s,
                        "decode_tokens_per_s": s.decode_tokens_per_s, "tokens_per_s": s.tokens_per_s},
            "mining": mining,
        }

    def check_blocks(self) -> None:
        """Account the blocks of submitted jobs the chain has moved past (accepted or not)."""
        self.completion.account_blocks(self.poller.current)

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        pending = self.store.load_pending()
        if pending:
            self.events.publish("pending", f"{len(pending)} persisted proof(s) to retry when their job is current")
            self.completion.retry_later(pending)
        self.completion.start()
        self.poller.start()

    def finished(self) -> bool:
        c = self.config
        if self.stop_requested.is_set():
            return True
        if c.duration_s is not None and time.monotonic() - self.control.started >= c.duration_s:
            return True
        return c.max_blocks is not None and self.stats.accepted >= c.max_blocks

    def serve(self, on_batch: Callable[[], None] = lambda: None) -> None:
        """Serve the request stream until ``finished()``; accounts blocks between batches."""
        cfg = self.config
        stream = file_prompts(cfg.prompts, cfg.model.vocab_size) if cfg.prompts else \
            generated_prompts(cfg.prompt_len, cfg.model.vocab_size, cfg.seed)
        for _ in self.generator.serve(stream):
            self.check_blocks()
            on_batch()
            if self.finished():
                break

    def _settle_submitted(self, wait_s: float = 5.0) -> None:
        """Read the chain again (a few seconds at most) for jobs submitted just before the stop.

        A proof sent in the last moments is otherwise never counted: the poller has stopped, so
        its job still looks current and the final status line would say accepted=N-1.
        """
        deadline = time.monotonic() + wait_s
        while self.completion.awaiting:
            try:
                current = self.poller.source.fetch_job()
            except POLL_ERRORS as exc:
                log.warning("cannot read the chain at shutdown: %s", exc)
                return
            self.completion.account_blocks(current)
            if not self.completion.awaiting or time.monotonic() >= deadline:
                return
            time.sleep(0.2)

    def shutdown(self) -> None:
        """Stop polling, drain the completion thread and persist unsent proofs."""
        self.poller.stop()
        kept = self.completion.stop()
        self._settle_submitted()
        self.events.publish("stopped", f"worker stopped; {len(kept)} proof(s) persisted")
