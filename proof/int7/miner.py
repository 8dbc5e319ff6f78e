"""The CPU reference miner (dense and MoE, legacy and salted seeds), int-protocol.md §10.

Slow but exact: it draws random operands, commits them, noises them and scans every lottery tile
until a ticket meets the bound. `commit_instance` and `instance_tickets` are the same steps for
given operands, for comparing GPU kernels against.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ..blake3tree import MerkleTree
from .config import VALUE_LIMIT, MiningConfig
from .errors import Int7Error
from .noise import LABEL_A, LABEL_B, apply_sparse, noised, sparse_factor, uniform_factor
from .openings import open_rows
from .plain_proof import LEAF_SIZE, MoEOpening, PlainProof
from .routing import Routing, check_routing, end_offsets, expert_start, flatten, open_entries, random_routing
from .seeds import commitment, job_key, noise_seeds, offsets_hash, salted_for
from .target import meets_bound, penalized_bound, unpenalized_bound
from .transcript import ticket, tile_index_sets, tile_transcripts

DEFAULT_MAX_ATTEMPTS = 64


@dataclass(frozen=True)
class Instance:
    """A committed, noised mining instance. a/bt are m × k and n_total × k (Bᵀ) int8."""

    config: MiningConfig
    job_key: bytes
    a: np.ndarray
    bt: np.ndarray
    hash_a: bytes
    hash_b: bytes
    s_b: bytes
    s_a: bytes
    a_noised: np.ndarray
    bt_noised: np.ndarray
    routing: tuple[tuple[int, ...], ...] | None = None


@dataclass(frozen=True)
class TileWin:
    """A tile (expert-local offsets for MoE) and its ticket."""

    expert: int
    t_rows: int
    t_cols: int
    ticket: bytes


def mining_bound(bits: int, config: MiningConfig, cert_version: int) -> int:
    """The bound a miner must meet: rank-penalised for V2/V3 at rank >= 128, else T0·h·w·D."""
    if cert_version >= 2 and config.rank >= 128:
        return penalized_bound(bits, config)
    return unpenalized_bound(bits, config)


def commit_instance(header76: bytes, config: MiningConfig, a: np.ndarray, bt: np.ndarray, *,
                    cert_version: int, routing: Routing | None = None) -> Instance:
    """Commit A and Bᵀ under the job key, derive the seeds and noise both operands.

    For MoE, bt holds e·n_e rows (expert e owns rows [e·n_e, (e+1)·n_e)) and `routing` is required.
    """
    m, k = a.shape
    if bt.ndim != 2 or bt.shape[1] != k or k != config.common_dim:
        raise Int7Error(f"instance: A {a.shape} and Bt {bt.shape} do not match k = {config.common_dim}")
    if max(int(np.abs(a.astype(np.int16)).max()), int(np.abs(bt.astype(np.int16)).max())) > VALUE_LIMIT:
        raise Int7Error("instance: operand values must lie in [-64, 64]")
    key = job_key(header76, config)
    hash_a = commitment(key, a.astype(np.int8).tobytes())
    hash_b = commitment(key, bt.astype(np.int8).tobytes())
    fold = {}
    n = bt.shape[0]
    if config.is_moe:
        if routing is None:
            raise Int7Error("instance: an MoE configuration needs a routing")
        if bt.shape[0] % config.experts:
            raise Int7Error(f"instance: {bt.shape[0]} Bt rows do not split into {config.experts} experts")
        n = bt.shape[0] // config.experts
        check_routing(routing, m, config.experts, config.top_k)
        fold = dict(routing_hash=commitment(key, flatten(routing)),
                    offsets_hash=offsets_hash(key, end_offsets(routing)))
    elif routing is not None:
        raise Int7Error("instance: a dense configuration takes no routing")
    s_b, s_a = noise_seeds(key, hash_a, hash_b, salted=salted_for(cert_version), m=m, n=n, **fold)
    e_a = apply_sparse(uniform_factor(s_a, LABEL_A, range(m), config.rank),
                       *sparse_factor(s_a, LABEL_A, k, config.rank))
    e_bt = apply_sparse(uniform_factor(s_b, LABEL_B, range(bt.shape[0]), config.rank),
                        *sparse_factor(s_b, LABEL_B, k, config.rank))
    frozen_routing = None if routing is None else tuple(tuple(int(t) for t in r) for r in routing)
    return Instance(config, key, a, bt, hash_a, hash_b, s_b, s_a, noised(a, e_a), noised(bt, e_bt),
                    frozen_routing)


def instance_transcripts(instance: Instance) -> Iterator[tuple[int, list[int], list[int], np.ndarray]]:
    """Yield (expert, row offsets, column offsets, words (T_r, T_c, 16) uint32) per expert group.

    Dense instances are one group (expert 0); MoE row offsets are positions in the expert's token list.
    """
    config = instance.config
    groups = [(0, np.arange(instance.a.shape[0]), instance.bt_noised)]
    if config.is_moe:
        n = instance.bt.shape[0] // config.experts
        groups = [(e, np.array(tokens, dtype=np.int64), instance.bt_noised[e * n:(e + 1) * n])
                  for e, tokens in enumerate(instance.routing)]
    for expert, rows, bt_group in groups:
        row_offsets, row_tiles = tile_index_sets(config.rows_pattern, len(rows))
        col_offsets, col_tiles = tile_index_sets(config.cols_pattern, bt_group.shape[0])
        if row_offsets and col_offsets:
            yield expert, row_offsets, col_offsets, tile_transcripts(
                instance.a_noised[rows], bt_group, config.rank, row_tiles, col_tiles)


def instance_tickets(instance: Instance) -> Iterator[TileWin]:
    """Yield TileWin for every lottery tile, experts in order, row tiles then column tiles."""
    for expert, row_offsets, col_offsets, words in instance_transcripts(instance):
        for i, t_rows in enumerate(row_offsets):
            for j, t_cols in enumerate(col_offsets):
                yield TileWin(expert, t_rows, t_cols, ticket(instance.s_a, words[i, j]))


def build_proof(instance: Instance, win: TileWin) -> PlainProof:
    """The plain proof opening a tile: full A rows, full Bᵀ rows and, for MoE, the routing."""
    config = instance.config
    m, k = instance.a.shape
    inner_rows = [win.t_rows + p for p in config.rows_pattern.to_list()]
    local_cols = [win.t_cols + q for q in config.cols_pattern.to_list()]
    n = instance.bt.shape[0] // max(config.experts, 1)
    cols = [win.expert * n + c for c in local_cols]
    rows = inner_rows
    moe = None
    if config.is_moe:
        rows = [instance.routing[win.expert][i] for i in inner_rows]
        offsets = end_offsets(instance.routing)
        routing_tree = MerkleTree(instance.job_key, flatten(instance.routing), LEAF_SIZE)
        moe = MoEOpening(config.experts, config.top_k, win.expert, tuple(offsets), tuple(inner_rows),
                         open_entries(routing_tree, expert_start(offsets, win.expert), inner_rows))
    a_tree = MerkleTree(instance.job_key, instance.a.astype(np.int8).tobytes(), LEAF_SIZE)
    b_tree = MerkleTree(instance.job_key, instance.bt.astype(np.int8).tobytes(), LEAF_SIZE)
    return PlainProof(m, n, k, config.rank, open_rows(a_tree, rows, k), open_rows(b_tree, cols, k), moe)


def mine_cpu(header76: bytes, config: MiningConfig, *, m: int, n: int, bits: int, cert_version: int,
             seed: int = 0, routing: Routing | None = None,
             max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> PlainProof:
    """Mine until a tile's ticket meets the bound; returns the plain proof.

    Operands are uniform in [−64, 64] from `seed`; n is per expert for MoE (B has e·n columns).
    MoE without `routing` draws one per attempt (each token picks top_k distinct experts).
    The bound is the rank-penalised one for V2/V3 at rank >= 128 (what the node requires).
    """
    config.check_limits()
    salted_for(cert_version)
    if config.is_moe and cert_version < 2:
        raise Int7Error(f"an MoE configuration needs certificate version >= 2, got {cert_version}")
    if config.cols_pattern.max >= n or (config.is_moe and config.w >= n):
        raise Int7Error(f"n = {n} holds no column tile of the pattern {config.cols}"
                        + (" with fewer than n opened columns" if config.is_moe else ""))
    if config.rows_pattern.max >= m:
        raise Int7Error(f"m = {m} holds no row tile of the pattern {config.rows}")
    bound = mining_bound(bits, config, cert_version)
    rng = np.random.default_rng(seed)
    total_cols = n * max(config.experts, 1)
    for _ in range(max_attempts):
        a = rng.integers(-VALUE_LIMIT, VALUE_LIMIT + 1, size=(m, config.common_dim), dtype=np.int8)
        bt = rng.integers(-VALUE_LIMIT, VALUE_LIMIT + 1, size=(total_cols, config.common_dim), dtype=np.int8)
        attempt_routing = routing
        if config.is_moe and routing is None:
            attempt_routing = random_routing(rng, m, config.experts, config.top_k)
        instance = commit_instance(header76, config, a, bt, cert_version=cert_version,
                                   routing=attempt_routing)
        for win in instance_tickets(instance):
            if meets_bound(win.ticket, bound):
                return build_proof(instance, win)
    raise Int7Error(f"no winning tile in {max_attempts} attempts")
