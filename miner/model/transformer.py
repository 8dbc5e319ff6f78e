"""The decoder-only MoE transformer (every layer's MLP is a MoE block)."""
from __future__ import annotations

import torch
from torch import nn

from miner.model.config import ModelConfig
from miner.model.layers import Attention, KVCache, RMSNorm
from miner.model.moe import MoEBlock


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int) -> None:
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.attn = Attention(cfg)
        self.post_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.moe = MoEBlock(cfg, layer_id)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, key_mask: torch.Tensor,
                cache: KVCache, layer: int) -> torch.Tensor:
        x = x + self.attn(self.input_norm(x), positions, key_mask, cache, layer)
        return x + self.moe(self.post_norm(x))


class MoETransformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        nn.init.normal_(self.embed.weight, std=1.0)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    @property
    def moe_blocks(self) -> list[MoEBlock]:
        return [layer.moe for layer in self.layers]  # type: ignore[union-attr]

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, key_mask: torch.Tensor,
                cache: KVCache) -> torch.Tensor:
        """Logits of the last position of each row: (batch, vocab)."""
        x = self.embed(tokens)
        for i, layer in enumerate(self.layers):
            x = layer(x, positions, key_mask, cache, i)
        return self.lm_head(self.norm(x[:, -1]))
