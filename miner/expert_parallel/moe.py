"""The expert-parallel MoE block: routing and shared experts replicated, routed experts sharded.

Each rank serves its own tokens (data-parallel attention) and routes them with the replicated
router. Every (token, slot) pair travels to the rank owning its expert as one row with its local
expert id and routing weight; the owner runs FC1 (mined through its launcher, one instance per
launch over its local experts), SwiGLU and FC2 with the weight applied before FC2, exactly as the
single-process block does; the results travel back and are summed over slots in slot order.
Because rows keep global token order per expert (see ``exchange``), the output is bit-identical
to ``MoEBlock`` on the concatenated tokens for the reference ops.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from miner.expert_parallel.exchange import combine, dispatch, exchange_counts
from miner.expert_parallel.plan import ExpertPlan, owners
from miner.model.moe import Fc1Launcher, MoEBlock, grouped_fc1
from miner.model.transformer import MoETransformer


def pack_meta(local_experts: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """One int64 (rows, 2) tensor per exchange: the local expert id and the float32 weight's bits."""
    bits = weights.to(torch.float32).contiguous().view(torch.int32).to(torch.int64)
    return torch.stack([local_experts.to(torch.int64), bits], dim=1)


def unpack_meta(meta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return meta[:, 0], meta[:, 1].to(torch.int32).view(torch.float32)


class ExpertParallelMoE(nn.Module):
    """One MoE block's share on ``rank``: the router, the shared experts, and the local experts."""

    def __init__(self, block: MoEBlock, plan: ExpertPlan, rank: int,
                 group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        if plan.num_experts != block.cfg.num_experts:
            raise ValueError(f"plan covers {plan.num_experts} experts, the block has {block.cfg.num_experts}")
        self.cfg, self.layer_id = block.cfg, block.layer_id
        self.plan, self.rank, self.group = plan, rank, group
        self.register_buffer("bounds", plan.boundaries(), persistent=False)  # moves with the model
        local = plan.local_slice(rank)
        self.router = block.router
        self.w13 = nn.Parameter(block.w13.detach()[local].clone())
        self.w2 = nn.Parameter(block.w2.detach()[local].clone())
        self.shared_up, self.shared_down = block.shared_up, block.shared_down
        self.launcher: Fc1Launcher | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        ids, weights = self._route(flat)
        out = self._routed(flat, ids, weights)
        if self.shared_up is not None and self.shared_down is not None:
            g, u = self.shared_up(flat).chunk(2, dim=-1)
            out = out + self.shared_down(F.silu(g) * u)
        return out.view(shape)

    def _route(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The replicated router; a rank without tokens still joins the exchanges, with no rows
        (the group-limited router cannot reshape an empty batch)."""
        if flat.shape[0] == 0:
            top_k = self.cfg.top_k
            return (torch.empty(0, top_k, dtype=torch.int64, device=flat.device),
                    torch.empty(0, top_k, dtype=torch.float32, device=flat.device))
        return self.router(flat)

    def _routed(self, flat: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        tokens, top_k = ids.shape
        experts = ids.reshape(-1).to(torch.int64)  # (token, slot) order
        dest = owners(experts, self.bounds)
        order = torch.sort(dest, stable=True).indices
        send_counts = torch.bincount(dest, minlength=self.plan.world_size)
        route = exchange_counts(send_counts, self.group)
        local_ids = experts[order] - self.bounds[dest[order]]
        rows = dispatch(flat[order // top_k], route, self.group)
        recv_ids, recv_weights = unpack_meta(dispatch(pack_meta(local_ids, weights.reshape(-1)[order]),
                                                      route, self.group))
        results = combine(self._local_experts(rows, recv_ids, recv_weights), route, self.group)
        pairs = torch.empty_like(results)
        pairs[order] = results
        return pairs.view(tokens, top_k, flat.shape[1]).sum(1)

    def _local_experts(self, rows: torch.Tensor, local_ids: torch.Tensor,
                       weights: torch.Tensor) -> torch.Tensor:
        """FC1 (the mined launch), SwiGLU, routing weight, FC2 for rows of this rank's experts."""
        routing = local_ids[:, None]
        if self.launcher is not None:
            h = self.launcher.launch(rows, routing, self.w13)
        else:
            h = grouped_fc1(rows, routing, self.w13)
        gate, up = h.chunk(2, dim=-1)
        act = F.silu(gate) * up  # (rows, 1, n_e)
        return grouped_fc1(act * weights[:, None, None].to(act.dtype), routing, self.w2, per_slot=True)[:, 0]


def shard_model(model: MoETransformer, plan: ExpertPlan, rank: int,
                group: dist.ProcessGroup | None = None) -> list[ExpertParallelMoE]:
    """Replace every MoE block of ``model`` by its expert-parallel share (in place)."""
    shards = []
    for layer in model.layers:
        shard = ExpertParallelMoE(layer.moe, plan, rank, group)  # type: ignore[arg-type]
        layer.moe = shard
        shards.append(shard)
    return shards
