"""From a plain proof to its checked statement and ticket: every check of int-protocol.md §7–8.2.

`derive_statement` performs the structural, Merkle and range checks (raising Int7Error with a
specific reason); `statement_ticket` recomputes seeds, noise, transcript and ticket. The verifier
and the public-data builder both go through here, so they can never disagree.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import VALUE_LIMIT, MiningConfig
from .errors import Int7Error
from .noise import noise_a_rows, noise_b_cols, noised
from .openings import check_opening, leaf_count
from .pattern import list_to_pattern
from .plain_proof import MoEOpening, PlainProof
from .public_data import MAX_OUTER_INDICES, PublicData
from .routing import ENTRY_SIZE, expert_start, read_entry
from .seeds import HEADER_SIZE, job_key, noise_seeds, offsets_hash, salted_for
from .transcript import ticket, transcript_words

MAX_DIM = 1 << 24


@dataclass(frozen=True)
class Statement:
    """What a valid plain proof states; a_rows/b_cols are global, t_rows/t_cols tile-local."""

    config: MiningConfig
    job_key: bytes
    m: int
    n: int
    t_rows: int
    t_cols: int
    a_rows: tuple[int, ...]
    b_cols: tuple[int, ...]
    a_strips: np.ndarray  # h × D int8
    b_strips: np.ndarray  # w × D int8
    hash_a: bytes
    hash_b: bytes
    moe: MoEOpening | None


def _fits(name: str, value: int, bits: int) -> None:
    if not 0 <= value < 1 << bits:
        raise Int7Error(f"{name} {value} does not fit in u{bits}")


def _check_dimensions(proof: PlainProof) -> None:
    for name, value in (("m", proof.m), ("n", proof.n), ("k", proof.k)):
        _fits(name, value, 32)
    _fits("noise_rank", proof.rank, 16)
    if proof.moe is not None:
        _fits("e", proof.moe.experts, 16)
        _fits("top_k", proof.moe.top_k, 16)


def _total_cols(proof: PlainProof) -> int:
    return proof.n * (proof.moe.experts if proof.moe else 1)


def _tile_indices(proof: PlainProof) -> tuple[list[int], list[int]]:
    """(inner A rows, inner B columns) from which the patterns are re-derived."""
    for row in proof.a.row_indices:
        if row >= proof.m:
            raise Int7Error(f"A row index {row} out of range for m = {proof.m}")
    if proof.moe is None:
        return list(proof.a.row_indices), list(proof.bt.row_indices)
    moe = proof.moe
    if moe.expert_idx >= moe.experts:
        raise Int7Error(f"MoE: expert_idx {moe.expert_idx} >= e = {moe.experts}")
    if len(moe.routing_end_offsets) != moe.experts:
        raise Int7Error(f"MoE: {len(moe.routing_end_offsets)} routing offsets for e = {moe.experts}")
    first_col = moe.expert_idx * proof.n
    for col in proof.bt.row_indices:
        if not first_col <= col < first_col + proof.n:
            raise Int7Error(f"MoE: B column {col} outside expert {moe.expert_idx}'s columns "
                            f"[{first_col}, {first_col + proof.n})")
    if len(proof.bt.row_indices) >= proof.n:
        raise Int7Error(f"MoE: {len(proof.bt.row_indices)} opened B columns, must be < n = {proof.n}")
    return list(moe.inner_a_rows), [c - first_col for c in proof.bt.row_indices]


def _check_tile_bounds(config: MiningConfig, m: int, n: int, t_rows: int, t_cols: int) -> None:
    if m > MAX_DIM or n > MAX_DIM:
        raise Int7Error(f"m and n must be <= 2^24, got m = {m}, n = {n}")
    if t_rows + config.rows_pattern.max >= m:
        raise Int7Error(f"row tile at {t_rows} (pattern max {config.rows_pattern.max}) exceeds m = {m}")
    if t_cols + config.cols_pattern.max >= n:
        raise Int7Error(f"column tile at {t_cols} (pattern max {config.cols_pattern.max}) exceeds n = {n}")


def _check_moe(proof: PlainProof, inner_rows: list[int]) -> None:
    moe = proof.moe
    m = proof.m
    entries = m * moe.top_k
    if entries >= 1 << 32:
        raise Int7Error("MoE: m·top_k overflows u32")
    offsets = moe.routing_end_offsets
    if offsets[-1] != entries:
        raise Int7Error(f"MoE: last routing offset {offsets[-1]} != m·top_k = {entries}")
    if any(b < a for a, b in zip(offsets, offsets[1:])):
        raise Int7Error("MoE: routing offsets are not non-decreasing")
    if offsets[0] > m or any(b - a > m for a, b in zip(offsets, offsets[1:])):
        raise Int7Error("MoE: an expert holds more than m tokens")
    if proof.n * moe.experts > MAX_DIM:
        raise Int7Error("MoE: n·e exceeds 2^24")
    start = expert_start(offsets, moe.expert_idx)
    end = offsets[moe.expert_idx]
    for inner in inner_rows:
        if start + inner >= entries or start + inner >= end:
            raise Int7Error(f"MoE: routing position {start + inner} is outside expert "
                            f"{moe.expert_idx}'s entries [{start}, {end})")
    outer = proof.a.row_indices
    if len(outer) != len(inner_rows):
        raise Int7Error(f"MoE: {len(outer)} outer indices for {len(inner_rows)} inner rows")
    if len(outer) > MAX_OUTER_INDICES:
        raise Int7Error(f"MoE: more than {MAX_OUTER_INDICES} outer indices")
    if any(b <= a for a, b in zip(outer, outer[1:])):
        raise Int7Error("MoE: outer (token) indices are not strictly increasing")


def _check_routing_opening(proof: PlainProof, key: bytes) -> None:
    moe = proof.moe
    check_opening("routing", key, moe.routing_proof, leaf_count(proof.m * moe.top_k * ENTRY_SIZE))
    start = expert_start(moe.routing_end_offsets, moe.expert_idx)
    for inner, outer in zip(moe.inner_a_rows, proof.a.row_indices):
        value = read_entry(moe.routing_proof, start + inner)
        if value != outer:
            raise Int7Error(f"MoE: routing[{moe.expert_idx}][{inner}] = {value} but the opened "
                            f"A row is {outer}")


def _strips(name: str, opening, rows, k: int, depth: int) -> np.ndarray:
    try:
        raw = b"".join(opening.proof.leaf_bytes(row * k, depth) for row in rows)
    except Int7Error as error:
        raise Int7Error(f"{name} opening: {error}") from None
    strips = np.frombuffer(raw, dtype=np.int8).reshape(len(rows), depth)
    if strips.size and int(np.abs(strips.astype(np.int16)).max()) > VALUE_LIMIT:
        raise Int7Error(f"{name} values must lie in [-64, 64]")
    return strips


def derive_statement(header76: bytes, proof: PlainProof, cert_version: int) -> Statement:
    """Check everything but the target and return the proof's statement; raises Int7Error."""
    if len(header76) != HEADER_SIZE:
        raise Int7Error(f"header must be {HEADER_SIZE} bytes, got {len(header76)}")
    salted_for(cert_version)
    if proof.moe is not None and cert_version < 2:
        raise Int7Error(f"an MoE proof needs certificate version >= 2, got {cert_version}")
    _check_dimensions(proof)
    k = proof.k
    expected = {"A": leaf_count(proof.m * k), "Bt": leaf_count(_total_cols(proof) * k)}
    for name, opening in (("A", proof.a), ("Bt", proof.bt)):
        if opening.proof.total_leaves != expected[name]:
            raise Int7Error(f"{name} opening: total_leaves {opening.proof.total_leaves} but the "
                            f"declared dimensions imply {expected[name]}")
    inner_rows, inner_cols = _tile_indices(proof)
    try:
        rows_pattern, t_rows = list_to_pattern(inner_rows)
    except Int7Error as error:
        raise Int7Error(f"A rows: {error}") from None
    try:
        cols_pattern, t_cols = list_to_pattern(inner_cols)
    except Int7Error as error:
        raise Int7Error(f"B columns: {error}") from None
    moe = proof.moe
    config = MiningConfig.from_patterns(k, proof.rank, rows_pattern, cols_pattern,
                                        moe.experts if moe else 0, moe.top_k if moe else 0)
    config.check_limits()
    _check_tile_bounds(config, proof.m, proof.n, t_rows, t_cols)
    if moe is not None:
        _check_moe(proof, inner_rows)
    key = job_key(header76, config)
    check_opening("A", key, proof.a.proof, expected["A"])
    check_opening("Bt", key, proof.bt.proof, expected["Bt"])
    if moe is not None:
        _check_routing_opening(proof, key)
    depth = config.dot_product_length
    return Statement(config, key, proof.m, proof.n, t_rows, t_cols, tuple(proof.a.row_indices),
                     tuple(proof.bt.row_indices), _strips("A", proof.a, proof.a.row_indices, k, depth),
                     _strips("Bt", proof.bt, proof.bt.row_indices, k, depth), proof.a.proof.root,
                     proof.bt.proof.root, moe)


def statement_seeds(statement: Statement, cert_version: int) -> tuple[bytes, bytes]:
    """(s_B, s_A) of a statement under the certificate version's seed derivation."""
    moe = statement.moe
    routing = {}
    if moe is not None:
        routing = dict(routing_hash=moe.routing_proof.root,
                       offsets_hash=offsets_hash(statement.job_key, list(moe.routing_end_offsets)))
    return noise_seeds(statement.job_key, statement.hash_a, statement.hash_b,
                       salted=salted_for(cert_version), m=statement.m, n=statement.n, **routing)


def statement_ticket(statement: Statement, cert_version: int) -> bytes:
    """Recompute the noise of the opened rows and columns, the transcript and the ticket."""
    s_b, s_a = statement_seeds(statement, cert_version)
    config = statement.config
    depth = config.dot_product_length
    e_a = noise_a_rows(s_a, config.common_dim, config.rank, statement.a_rows)[:, :depth]
    e_b = noise_b_cols(s_b, config.common_dim, config.rank, statement.b_cols)[:, :depth]
    words = transcript_words(noised(statement.a_strips, e_a), noised(statement.b_strips, e_b),
                             config.rank)
    return ticket(s_a, words)


def statement_public_data(statement: Statement, jackpot: bytes) -> PublicData:
    """The public data of a checked statement with its recomputed jackpot hash."""
    moe = statement.moe
    extra = {}
    if moe is not None:
        extra = dict(expert_idx=moe.expert_idx, routing_offsets=tuple(moe.routing_end_offsets),
                     hash_routing=moe.routing_proof.root, outer_indices=statement.a_rows)
    return PublicData(statement.config, statement.hash_a, statement.hash_b, jackpot, statement.m,
                      statement.n, statement.t_rows, statement.t_cols, **extra)
