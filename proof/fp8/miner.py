"""The CPU reference miner for certificate V4, dense and MoE, and the proof builder (§1, §9, §12–13).

mine_cpu runs the whole pipeline the GPU miner runs, slowly and literally: pre-quantize both operands,
commit their planes under keyA / keyB (and the MoE routing under keyA), derive the seeds, noise and
noisy-quantize, multiply on the committed device's FP8 model, fold every lottery tile, hash the
tickets, and turn the first winner that passes the jackpot policy into a PlainProofV4.

build_plain_proof is what the miner runtime calls for a GPU winner: it needs only the retained
planes (committed with commit_operand), the tile bases, and for MoE the routing and the expert.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from proof.blake3tree import MerkleTree, keyed_tree_root, leaves_for_rows, leaves_for_span
from proof.chain import target_from_bits
from proof.fp8 import lottery, transcript
from proof.fp8.merkle_serde import MerkleProof
from proof.fp8.mma import fp8_matmul
from proof.fp8.params import (INCOMPLETE_HEADER_SIZE, PREQUANT_BLOCK, Device, HashId, JobParams, MoeParams,
                              TileShape, make_job)
from proof.fp8.plain_proof import MatrixOpening, MoeWitness, PlainProofV4
from proof.fp8.prequant import prequantize
from proof.fp8.public_data import PublicData
from proof.fp8.verify import (NOT_ADMISSIBLE, NoisedOperand, Rejected, derive_seeds, evaluate_plain_proof,
                              noised_operand)


@dataclass(frozen=True)
class CommittedOperand:
    """One operand's two planes and their keyed chunk trees; `digest` is HX."""

    codes: np.ndarray  # rows × k int8
    scales: np.ndarray  # rows × k/8 BF16 bits (uint16)
    values_tree: MerkleTree
    scales_tree: MerkleTree
    digest: bytes


def commit_operand(key: bytes, codes: np.ndarray, scales: np.ndarray, hash_id: HashId) -> CommittedOperand:
    """Commit both planes (row-major, little-endian) under `key` and fold the roots into HX."""
    codes = np.ascontiguousarray(codes, dtype=np.int8)
    scales = np.ascontiguousarray(scales, dtype=np.uint16)
    if codes.ndim != 2 or scales.shape != (codes.shape[0], codes.shape[1] // PREQUANT_BLOCK):
        raise ValueError(f"planes of shapes {codes.shape} and {scales.shape} do not match (rows × k, rows × k/8)")
    values_tree = MerkleTree(key, codes.tobytes(), hash_id.leaf_size)
    scales_tree = MerkleTree(key, scales.astype("<u2").tobytes(), hash_id.leaf_size)
    return CommittedOperand(codes, scales, values_tree, scales_tree,
                            transcript.operand_digest(values_tree.root, scales_tree.root, key))


@dataclass(frozen=True)
class RoutingCommitment:
    """The routing table R (tokens per expert, expert-major) and end offsets O, committed under keyA."""

    tokens: tuple[int, ...]
    offsets: tuple[int, ...]
    tree: MerkleTree
    offsets_root: bytes

    def expert_tokens(self, w: int) -> list[int]:
        start = self.offsets[w - 1] if w else 0
        return list(self.tokens[start:self.offsets[w]])

    @property
    def roots(self) -> tuple[bytes, bytes]:
        """(HR, HO), as they enter seedA."""
        return self.tree.root, self.offsets_root


def routing_from_topk(topk_ids: np.ndarray, experts: int) -> tuple[list[int], list[int]]:
    """The router's (tokens × top_k) expert ids → (R flattened expert-major, O cumulative ends)."""
    ids = np.asarray(topk_ids)
    if ids.ndim != 2 or ids.size == 0:
        raise ValueError("topk_ids must be a non-empty (tokens × top_k) array")
    if ids.min() < 0 or ids.max() >= experts:
        raise ValueError(f"expert ids must lie in [0, {experts})")
    tokens: list[int] = []
    offsets: list[int] = []
    for w in range(experts):
        routed = np.nonzero((ids == w).any(axis=1))[0]
        if (ids == w).sum() != routed.size:
            raise ValueError(f"a token selects expert {w} more than once")
        tokens += routed.tolist()
        offsets.append(len(tokens))
    return tokens, offsets


def commit_routing(key_a: bytes, tokens: list[int], offsets: list[int], moe: MoeParams) -> RoutingCommitment:
    """HR over R as u32 LE (leaf hash_idR) and HO over O as u32 LE (leaf hash_idO), both under keyA."""
    tree = MerkleTree(key_a, np.asarray(tokens, dtype="<u4").tobytes(), moe.hash_id_r.leaf_size)
    offsets_root = keyed_tree_root(key_a, np.asarray(offsets, dtype="<u4").tobytes(), moe.hash_id_o.leaf_size)
    return RoutingCommitment(tuple(tokens), tuple(offsets), tree, offsets_root)


def _opening(tree: MerkleTree, leaves: list[int]) -> MerkleProof:
    return MerkleProof([tree.leaf(i) for i in leaves], leaves, tree.num_leaves, tree.root, tree.siblings(leaves))


def _plane_opening(tree: MerkleTree, rows: list[int], row_bytes: int) -> MatrixOpening:
    return MatrixOpening(_opening(tree, leaves_for_rows(rows, row_bytes, tree.leaf_size)), rows)


def build_plain_proof(job: JobParams, a: CommittedOperand, b: CommittedOperand, t_a: int, t_b: int, *,
                      ancestor_chain: list[bytes] | tuple[bytes, ...] = (),
                      routing: RoutingCommitment | None = None, expert: int | None = None) -> PlainProofV4:
    """The PlainProofV4 of the tile at bases (t_a, t_b); MoE bases are expert-local.

    For a GPU winner record, commit the retained A planes with commit_operand (B's are committed
    once per job), take the bases from the record's tile indices with lottery.tile_base, and pass
    the launch's routing commitment and the record's GROUP_ID as `expert`.

    Dense: A rows t_a + row offsets, B rows t_b + column offsets. MoE: A rows are the tokens at
    positions t_a + offsets of R[expert], B rows expert·η + t_b + offsets.
    """
    rows_a = lottery.tile_indices(job.a.pattern, t_a)
    rows_b = lottery.tile_indices(job.b.pattern, t_b)
    witness = None
    if job.moe is not None:
        if routing is None or expert is None:
            raise ValueError("an MoE proof needs the routing commitment and the winning expert")
        routed = routing.expert_tokens(expert)
        if rows_a[-1] >= len(routed):
            raise ValueError(f"tile base {t_a} runs past expert {expert}'s {len(routed)} tokens")
        rows_a = [routed[i] for i in rows_a]
        rows_b = [expert * job.expert_rows + r for r in rows_b]
        start = 4 * (routing.offsets[expert - 1] if expert else 0)
        leaves = leaves_for_span(start, 4 * routing.offsets[expert], routing.tree.leaf_size)
        witness = MoeWitness(expert, list(routing.offsets), routing.offsets_root, _opening(routing.tree, leaves))
    k = job.common.k
    scale_row = 2 * (k // PREQUANT_BLOCK)
    return PlainProofV4(job, list(ancestor_chain),
                        _plane_opening(a.values_tree, rows_a, k), _plane_opening(b.values_tree, rows_b, k),
                        _plane_opening(a.scales_tree, rows_a, scale_row),
                        _plane_opening(b.scales_tree, rows_b, scale_row), witness)


@dataclass
class MiningResult:
    """What one CPU mining pass found. `proof` is None when no admissible tile won."""

    proof: PlainProofV4 | None
    public_data: PublicData | None
    tiles: int
    winners: int
    not_admissible: int
    work: int


def mine_cpu(header76: bytes, a_values: np.ndarray, b_values: np.ndarray, *, ancestor_header: bytes,
             ancestor_chain: list[bytes] | tuple[bytes, ...] = (), device: Device | str = Device.HOPPER,
             target: int | None = None, tile: TileShape | None = None,
             topk_ids: np.ndarray | None = None, experts: int = 0,
             hash_id: HashId = HashId.CHUNK_1024) -> MiningResult:
    """Mine one launch on the CPU: A (m × k) against B (n × k, MoE: e·n_e stacked), values as floats.

    `ancestor_header` is σ_d (108 bytes) and `ancestor_chain` the headers between σ̂ and σ_d,
    parent first. MoE needs `topk_ids` (m × top_k) and `experts`. The target defaults to the
    header's nbits. Returns the first admissible winner's proof in tile order.
    """
    header76 = bytes(header76)
    if len(header76) != INCOMPLETE_HEADER_SIZE:
        raise ValueError(f"the proposed header must be {INCOMPLETE_HEADER_SIZE} bytes")
    a_codes, a_scales = prequantize(a_values)
    b_codes, b_scales = prequantize(b_values)
    (m, k), n = a_codes.shape, b_codes.shape[0]
    if b_codes.shape[1] != k:
        raise ValueError(f"A and B must share k: {a_codes.shape} vs {b_codes.shape}")
    job = make_job(ancestor_header, m=m, n=n, k=k, device=device, tile=tile, experts=experts, hash_id=hash_id)
    key_a, key_b = transcript.key_a(header76), transcript.key_b(job.ancestor_header)
    a = commit_operand(key_a, a_codes, a_scales, job.a.hash_id)
    b = commit_operand(key_b, b_codes, b_scales, job.b.hash_id)
    routing = None
    if job.moe is not None:
        if topk_ids is None or len(topk_ids) != m:
            raise ValueError("MoE mining needs topk_ids with one row per A row")
        routing = commit_routing(key_a, *routing_from_topk(topk_ids, experts), job.moe)
    seeds = derive_seeds(job, header76, a.digest, b.digest, routing.roots if routing else None)
    noised_a = noised_operand(job, "A", a_codes, a_scales, list(range(m)), seeds)
    noised_b = noised_operand(job, "B", b_codes, b_scales, list(range(n)), seeds)

    if target is None:
        target = target_from_bits(int.from_bytes(header76[72:76], "little"))
    rows_p, cols_p = job.a.pattern, job.b.pattern
    bound = lottery.threshold(target, rows_p.tile_size, cols_p.tile_size, k)
    pow_key = transcript.jackpot_key(seeds.seed_a)
    tiles = winners = not_admissible = 0
    for expert, t_a, t_b, cell in _tiles(job, noised_a, noised_b, routing):
        tiles += 1
        if not np.isfinite(cell).all():
            continue
        ticket = lottery.ticket_with_key(pow_key, lottery.fold_message(cell, rows_p, cols_p))
        if not lottery.is_winner(ticket, bound):
            continue
        winners += 1
        proof = build_plain_proof(job, a, b, t_a, t_b, ancestor_chain=ancestor_chain, routing=routing,
                                  expert=expert)
        try:
            statement = evaluate_plain_proof(header76, proof)
        except Rejected as rejection:
            if not str(rejection).startswith(NOT_ADMISSIBLE):
                raise RuntimeError(f"the CPU miner built a proof its verifier rejects: {rejection}") from None
            not_admissible += 1
            continue
        if statement.jackpot != ticket:
            raise RuntimeError("the verifier's replay of the winning tile disagrees with the miner's")
        return MiningResult(proof, statement, tiles, winners, not_admissible, _work(job, routing))
    return MiningResult(None, None, tiles, winners, not_admissible, _work(job, routing))


def _tiles(job: JobParams, a: NoisedOperand, b: NoisedOperand, routing: RoutingCommitment | None
           ) -> Iterator[tuple[int | None, int, int, np.ndarray]]:
    """Every lottery tile of the launch in order: (expert, tA, tB, the h×w pre-peel accumulator).

    Dense: one lattice over A × B. MoE: per expert w, the routed tokens R[w] against B's rows
    [w·η, (w+1)·η), with an expert-local lattice (a trailing partial tile is never mined).
    """
    eta = job.expert_rows
    if routing is None:
        groups = [(None, list(range(job.a.num_rows)), 0)]
    else:
        groups = [(w, routing.expert_tokens(w), w * eta) for w in range(job.experts)]
    rows_p, cols_p = job.a.pattern, job.b.pattern
    for expert, a_rows, b_start in groups:
        if not a_rows:
            continue
        acc = fp8_matmul(job.common.device.model, a.noisy.codes[a_rows], b.noisy.codes[b_start:b_start + eta])
        for t_a in lottery.tile_bases(rows_p, len(a_rows)):
            for t_b in lottery.tile_bases(cols_p, eta):
                ia, ib = lottery.tile_indices(rows_p, t_a), lottery.tile_indices(cols_p, t_b)
                yield expert, t_a, t_b, acc[np.ix_(ia, ib)]


def _work(job: JobParams, routing: RoutingCommitment | None) -> int:
    if routing is None:
        return lottery.credited_work(job.a.num_rows, job.b.num_rows, job.common.k)
    sizes = [len(routing.expert_tokens(w)) for w in range(job.experts)]
    return lottery.credited_work_moe(sizes, job.expert_rows, job.common.k, job.a.pattern.tile_size)
