"""Transformer pieces shared by the three styles: RMSNorm, rotary embedding, GQA attention."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from miner.model.config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


def rotary(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Apply rotary position embedding to x (batch, heads, seq, head_dim) at ``positions``."""
    half = x.shape[-1] // 2
    freqs = theta ** (-torch.arange(half, dtype=torch.float32, device=x.device) / half)
    angles = positions.to(torch.float32)[..., None] * freqs  # (batch, seq, half)
    cos, sin = angles.cos()[:, None], angles.sin()[:, None]
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class KVCache:
    """Per-layer keys and values of a batch, grown by one step at a time."""

    def __init__(self, num_layers: int) -> None:
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        old_k, old_v = self.keys[layer], self.values[layer]
        if old_k is not None and old_v is not None:
            k, v = torch.cat([old_k, k], dim=2), torch.cat([old_v, v], dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v


class Attention(nn.Module):
    """Grouped-query attention with rotary embedding and a key padding mask."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        q_dim, kv_dim = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, q_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, kv_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, kv_dim, bias=False)
        self.o_proj = nn.Linear(q_dim, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, key_mask: torch.Tensor,
                cache: KVCache, layer: int) -> torch.Tensor:
        """x: (batch, seq, hidden); key_mask: (batch, total_len) True where a key is real."""
        b, s, _ = x.shape
        cfg = self.cfg
        q = self.q_proj(x).view(b, s, cfg.num_heads, cfg.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
        q, k = rotary(q, positions, cfg.rope_theta), rotary(k, positions, cfg.rope_theta)
        k, v = cache.append(layer, k, v)
        total = k.shape[2]
        causal = torch.ones(s, total, dtype=torch.bool, device=x.device).tril(total - s)
        own = torch.ones(s, total, dtype=torch.bool, device=x.device).tril(total - s)
        own &= ~own.tril(total - s - 1)  # each query may always see itself: no all-masked rows
        mask = (causal[None, None] & key_mask[:, None, None, :]) | own[None, None]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                             enable_gqa=cfg.num_heads != cfg.num_kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))
