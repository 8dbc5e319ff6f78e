"""The all-to-all legs of expert parallelism: dispatch (token, slot) rows to the ranks that own
their experts, and combine the results back in the order they were sent.

Rows travel grouped by destination rank; within a group they keep their (token, slot) order, so
on the owner the rows of one expert arrive in global token order (rank 0's tokens, then rank 1's,
...). That is the order the single-process layer uses, which keeps the EP outputs bit-identical.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Route:
    """The split sizes of one exchange: rows sent to and received from each rank."""

    send: list[int]
    recv: list[int]

    @property
    def received(self) -> int:
        return sum(self.recv)


def exchange_counts(send_counts: torch.Tensor, group: dist.ProcessGroup | None = None) -> Route:
    """Tell every rank how many rows it will receive from each other rank."""
    world = dist.get_world_size(group)
    if send_counts.shape != (world,):
        raise ValueError(f"send_counts must hold one count per rank ({world}), got shape "
                         f"{tuple(send_counts.shape)}")
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts.contiguous(), group=group)
    return Route(send_counts.tolist(), recv_counts.tolist())


def dispatch(rows: torch.Tensor, route: Route, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Send ``rows`` (grouped by destination, ``route.send`` sizes) and return the received rows."""
    if rows.shape[0] != sum(route.send):
        raise ValueError(f"{rows.shape[0]} rows to send, the route sends {sum(route.send)}")
    out = rows.new_empty((route.received, *rows.shape[1:]))
    dist.all_to_all_single(out, rows.contiguous(), output_split_sizes=route.recv,
                           input_split_sizes=route.send, group=group)
    return out


def combine(rows: torch.Tensor, route: Route, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """The reverse of :func:`dispatch`: results go back to the ranks their inputs came from."""
    return dispatch(rows, Route(route.recv, route.send), group)
