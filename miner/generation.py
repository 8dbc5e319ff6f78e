"""Serving: a request stream through prefill and greedy decode with a KV cache, and tokens/s."""
from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from miner.model.layers import KVCache
from miner.model.transformer import MoETransformer


def byte_tokens(text: str, vocab_size: int) -> list[int]:
    """A tokenizer-free encoding: UTF-8 bytes shifted past the pad id 0, folded into the vocab."""
    return [1 + b % (vocab_size - 1) for b in text.encode()] or [1]


def prompt_lines(path: Path) -> list[str]:
    """The non-empty lines of a prompt file; a missing, unreadable or empty file is a ValueError
    that names it (checked before the worker starts, not at its first batch)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the prompt file {path}: {exc}") from None
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise ValueError(f"prompt file {path} holds no prompts")
    return lines


def file_prompts(path: Path, vocab_size: int) -> Iterator[list[int]]:
    """Every non-empty line of ``path``, cycled for as long as the server runs."""
    for line in itertools.cycle(prompt_lines(path)):
        yield byte_tokens(line, vocab_size)


def generated_prompts(length: int, vocab_size: int, seed: int = 0) -> Iterator[list[int]]:
    """Endless random prompts of ``length`` tokens (the default request stream)."""
    gen = torch.Generator().manual_seed(seed)
    while True:
        yield torch.randint(1, vocab_size, (length,), generator=gen).tolist()


@dataclass
class ServeStats:
    """Tokens served and the wall time spent in each phase."""

    requests: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds else 0.0

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prefill_tokens / self.prefill_seconds if self.prefill_seconds else 0.0

    @property
    def tokens_per_s(self) -> float:
        busy = self.prefill_seconds + self.decode_seconds
        return (self.prefill_tokens + self.decode_tokens) / busy if busy else 0.0


class Generator:
    """Serves prompts in batches: one prefill launch, then ``max_new_tokens`` decode launches."""

    def __init__(self, model: MoETransformer, batch_size: int, max_new_tokens: int) -> None:
        if batch_size <= 0 or max_new_tokens <= 0:
            raise ValueError("batch_size and max_new_tokens must be positive")
        self.model, self.batch_size, self.max_new_tokens = model, batch_size, max_new_tokens
        self.stats = ServeStats()

    def serve_batch(self, prompts: list[list[int]]) -> list[list[int]]:
        """Greedy completions of ``prompts`` (left-padded to one length)."""
        cfg = self.model.cfg
        limit = cfg.max_seq_len - self.max_new_tokens
        prompts = [p[-limit:] for p in prompts]
        width = max(len(p) for p in prompts)
        tokens = torch.zeros(len(prompts), width, dtype=torch.long)
        key_mask = torch.zeros(len(prompts), width, dtype=torch.bool)
        for row, prompt in enumerate(prompts):
            tokens[row, width - len(prompt):] = torch.tensor(prompt)
            key_mask[row, width - len(prompt):] = True
        device = self.model.embed.weight.device
        tokens, key_mask = tokens.to(device), key_mask.to(device)
        positions = (key_mask.cumsum(1) - 1).clamp(min=0)
        cache = KVCache(cfg.num_layers)
        start = time.monotonic()
        logits = self.model(tokens, positions, key_mask, cache)
        self.stats.prefill_seconds += time.monotonic() - start
        self.stats.prefill_tokens += int(key_mask.sum())
        out: list[list[int]] = [[] for _ in prompts]
        start = time.monotonic()
        for _ in range(self.max_new_tokens):
            nxt = logits.argmax(-1)
            for row, tok in enumerate(nxt.tolist()):
                out[row].append(tok)
            positions = positions[:, -1:] + 1
            key_mask = torch.cat([key_mask, torch.ones(len(prompts), 1, dtype=torch.bool, device=device)], dim=1)
            logits = self.model(nxt[:, None], positions, key_mask, cache)
        self.stats.decode_seconds += time.monotonic() - start
        self.stats.decode_tokens += len(prompts) * self.max_new_tokens
        self.stats.requests += len(prompts)
        return out

    def serve(self, stream: Iterator[list[int]]) -> Iterator[list[list[int]]]:
        """Serve the stream batch by batch, forever (the caller decides when to stop)."""
        while True:
            yield self.serve_batch([next(stream) for _ in range(self.batch_size)])
