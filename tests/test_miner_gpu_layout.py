"""miner.gpu.layout: routed rows laid out into E × M instances (dense: zero rows; MoE: phantom
tokens), checked against a literal per-row reading of the routing on random routings."""
import numpy as np
import pytest
import torch

from miner.gpu.layout import LayoutError, layout, moe_rows, phantom_routes, routing_counts


def _routing(tokens: int, experts: int, top_k: int, seed: int, skew: bool = False) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if skew:  # most tokens pick the first experts: deficits far from even
        scores = torch.rand(tokens, experts, generator=gen) + torch.linspace(2, 0, experts)
    else:
        scores = torch.rand(tokens, experts, generator=gen)
    return scores.topk(top_k, dim=1).indices


def _literal_lists(ids: torch.Tensor, experts: int) -> list[list[int]]:
    return [[t for t in range(ids.shape[0]) if e in ids[t].tolist()] for e in range(experts)]


@pytest.mark.parametrize("moe", [False, True])
@pytest.mark.parametrize("tokens,experts,top_k,skew", [(8, 32, 8, False), (64, 8, 2, True), (5, 4, 3, False),
                                                        (200, 16, 4, True), (1, 4, 1, False)])
def test_layout_matches_literal_routing(moe, tokens, experts, top_k, skew):
    ids = _routing(tokens, experts, top_k, seed=tokens * experts + top_k, skew=skew)
    plan = layout(ids, experts, 16, moe=moe)
    lists = _literal_lists(ids, experts)
    assert plan.counts == tuple(len(rows) for rows in lists)
    assert plan.rows % 16 == 0 and plan.rows >= max(plan.counts)
    table = plan.row_token.view(experts, plan.rows).tolist()
    for e, rows in enumerate(lists):
        assert table[e][:len(rows)] == rows  # real tokens first, ascending
        tail = table[e][len(rows):]
        if moe:
            assert tail == sorted(tail) and all(t >= tokens for t in tail)
        else:
            assert all(t == tokens for t in tail)  # the zero row
    for t in range(tokens):
        for s in range(top_k):
            row = int(plan.slot_of[t * top_k + s])
            assert row // plan.rows == int(ids[t, s]) and table[row // plan.rows][row % plan.rows] == t
    if moe:
        assert experts * plan.rows == (tokens + plan.phantoms) * top_k
        assert (tokens + plan.phantoms) % 16 == 0
        for p in range(tokens, tokens + plan.phantoms):  # each phantom: top_k distinct experts
            assert sum(p in table[e] for e in range(experts)) == top_k
    else:
        assert plan.phantoms == 0
    assert plan.credited_rows(2) == sum(c - c % 2 for c in plan.counts)


def test_output_gather_equals_per_row_reading():
    tokens, experts, top_k, n = 12, 6, 2, 5
    ids = _routing(tokens, experts, top_k, seed=3)
    plan = layout(ids, experts, 16, moe=False)
    out = torch.randn(experts * plan.rows, n)
    gathered = out.index_select(0, plan.slot_of).view(tokens, top_k, n)
    lists = _literal_lists(ids, experts)
    for t in range(tokens):
        for s in range(top_k):
            e = int(ids[t, s])
            assert torch.equal(gathered[t, s], out[e * plan.rows + lists[e].index(t)])


def test_moe_rows_smallest_fit_and_phantom_routes():
    rows, phantoms = moe_rows([3, 0, 1, 4], top_k=2, multiple=4)
    assert (rows, phantoms) == (4, 4)  # 4·4 = (4 + 4)·2 and no deficit exceeds 4
    assert moe_rows([3, 0, 2, 4], top_k=3, multiple=4) == (12, 13)  # M=4, 8: 7, 23 not 3k; 39 = 13·3
    routes = phantom_routes([3, 0, 1, 4], rows, phantoms, 2)
    assert [len(r) for r in routes] == [1, 4, 3, 0]
    assert all(r == sorted(r) for r in routes)


def test_bad_routing_is_named():
    with pytest.raises(LayoutError, match="outside"):
        routing_counts(torch.tensor([[0, 5]]), 4)
    with pytest.raises(LayoutError, match="outside"):
        routing_counts(torch.tensor([[0, -1]]), 4)
    with pytest.raises(LayoutError, match="integer"):
        routing_counts(torch.zeros(2, 2), 4)
    with pytest.raises(LayoutError, match="top_k"):
        moe_rows([2, 2], top_k=2, multiple=16)
    with pytest.raises(LayoutError, match="phantom"):
        phantom_routes([0, 4], 4, 1, 1)
    assert np.array_equal(routing_counts(torch.tensor([[1, 0], [1, 2]]), 4), [1, 2, 1, 0])
