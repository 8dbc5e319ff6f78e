"""The MoE block of each style and its expert GEMMs, the first of which (FC1) is the mined one."""
from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from miner.model.config import ModelConfig


class Fc1Launcher(Protocol):
    """What a mined layer offers the model: run FC1 for routed tokens (and mine inside it)."""

    def launch(self, x: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor) -> torch.Tensor:
        """x: (tokens, k); topk_ids: (tokens, top_k); w13: (experts, 2 n_e, k).

        Returns (tokens, top_k, 2 n_e): each token's FC1 output for each expert it is routed to.
        """
        ...


def grouped_fc1(x: torch.Tensor, topk_ids: torch.Tensor, weight: torch.Tensor,
                per_slot: bool = False) -> torch.Tensor:
    """Reference grouped GEMM: every (token, slot) times its expert's weight (experts, out, in).

    ``x`` is (tokens, in) shared by all slots, or (tokens, top_k, in) when ``per_slot``.
    """
    tokens, top_k = topk_ids.shape
    out = x.new_zeros(tokens, top_k, weight.shape[1])
    for expert in torch.unique(topk_ids).tolist():
        tok, slot = torch.nonzero(topk_ids == expert, as_tuple=True)
        rows = x[tok, slot] if per_slot else x[tok]
        out[tok, slot] = rows @ weight[expert].T
    return out


class Router(nn.Module):
    """Top-k expert choice in the style's way.

    qwen3_moe / mixtral: softmax over experts, top-k, optional renormalisation.
    deepseek_v3: sigmoid scores plus a selection bias, group-limited top-k, weights renormalised
    and scaled by ``routed_scaling_factor``.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        if cfg.style == "deepseek_v3":
            self.register_buffer("e_score_correction_bias", torch.zeros(cfg.num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        logits = self.gate(x).float()
        if cfg.style != "deepseek_v3":
            probs = logits.softmax(-1)
            weights, ids = probs.topk(cfg.top_k, dim=-1)
            if cfg.norm_topk_prob:
                weights = weights / weights.sum(-1, keepdim=True)
            return ids, weights
        scores = logits.sigmoid()
        biased = scores + self.e_score_correction_bias
        groups = biased.view(x.shape[0], cfg.n_group, -1)
        group_score = groups.topk(min(2, groups.shape[-1]), dim=-1).values.sum(-1)
        keep = torch.zeros_like(group_score).scatter_(1, group_score.topk(cfg.topk_group, -1).indices, 1)
        biased = biased.masked_fill(~keep.bool().repeat_interleave(groups.shape[-1], dim=1), float("-inf"))
        ids = biased.topk(cfg.top_k, dim=-1).indices
        weights = scores.gather(1, ids)
        if cfg.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return ids, weights * cfg.routed_scaling_factor


class MoEBlock(nn.Module):
    """Routed SwiGLU experts (FC1 mined through ``launcher``) plus optional shared experts."""

    def __init__(self, cfg: ModelConfig, layer_id: int) -> None:
        super().__init__()
        self.cfg, self.layer_id = cfg, layer_id
        n_e, k = cfg.expert_intermediate, cfg.hidden_size
        self.router = Router(cfg)
        self.w13 = nn.Parameter(torch.empty(cfg.num_experts, 2 * n_e, k))
        self.w2 = nn.Parameter(torch.empty(cfg.num_experts, k, n_e))
        nn.init.normal_(self.w13, std=k ** -0.5)
        nn.init.normal_(self.w2, std=n_e ** -0.5)
        self.shared_up: nn.Linear | None = None
        self.shared_down: nn.Linear | None = None
        if cfg.shared_experts:
            width = n_e * cfg.shared_experts
            self.shared_up = nn.Linear(k, 2 * width, bias=False)
            self.shared_down = nn.Linear(width, k, bias=False)
        self.launcher: Fc1Launcher | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        ids, weights = self.router(flat)
        if self.launcher is not None:
            h = self.launcher.launch(flat, ids, self.w13)
        else:
            h = grouped_fc1(flat, ids, self.w13)
        gate, up = h.chunk(2, dim=-1)
        act = F.silu(gate) * up  # (tokens, top_k, n_e)
        out = grouped_fc1(act * weights[..., None].to(act.dtype), ids, self.w2, per_slot=True).sum(1)
        if self.shared_up is not None and self.shared_down is not None:
            g, u = self.shared_up(flat).chunk(2, dim=-1)
            out = out + self.shared_down(F.silu(g) * u)
        return out.view(shape)
