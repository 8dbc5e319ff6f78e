"""Plain-proof verification for certificate V4 (fp8-and-integration.md §11–13).

`verify_plain_proof(header76, proof, *, bits=None)` follows Pearl's verification flow
(`zk-pow/src/v4/api/verify.rs`, `plain_proof.rs::parse_proof`, `openings.rs::verify_openings`):

1. parse and authenticate: the ancestry of σ_d, the witness shape, the MoE projection, the tile
   bases, the statement rules, the Merkle openings (and HO for MoE);
2. derive the noise for the opened rows only;
3. open both planes → BF16 values and the exact row norms;
4. noisy-quantize;
5. replay the tile on the committed device and run the jackpot policy;
6. fold → ticket;
7. the difficulty check.

Every failure returns a specific reason; a tile that fails the policy returns a reason starting
with "The jackpot is not admissible" (the miner filters those silently).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from proof.blake3tree import keyed_tree_root, leaves_for_rows, leaves_for_span
from proof.chain import sha256d, target_from_bits
from proof.fp8 import lottery, transcript
from proof.fp8.merkle_serde import BincodeError, MerkleProof
from proof.fp8.mma import fp8_matmul_with_stats
from proof.fp8.noise import noise_lines
from proof.fp8.params import (HEADER_SIZE, INCOMPLETE_HEADER_SIZE, PREQUANT_BLOCK, STATE_WINDOW_DEPTH,
                              HashId, JobParams, ParamsError)
from proof.fp8.plain_proof import PlainProofV4
from proof.fp8.policy import check_policy
from proof.fp8.prequant import open_values, row_norms
from proof.fp8.public_data import MAX_ROUTING_ENTRIES, MoeStatement, PublicData
from proof.fp8.quantization import NoisyRows, noisy_quantize

NOT_ADMISSIBLE = "The jackpot is not admissible"
OK = "ok"


class Rejected(Exception):
    """A proof failed one verification step; the message is the reason."""


@dataclass(frozen=True)
class Seeds:
    seed_a: bytes
    seed_b: bytes


@dataclass(frozen=True)
class NoisedOperand:
    """One side's rows as the verifier rebuilds them: clean BF16 values and the noisy e4m3 strip."""

    clean: np.ndarray
    noisy: NoisyRows


@dataclass(frozen=True)
class ParsedProof:
    """An authenticated witness: the statement (J still zero), the opened planes and the seeds."""

    statement: PublicData
    a_codes: np.ndarray
    a_scales: np.ndarray
    b_codes: np.ndarray
    b_scales: np.ndarray
    seeds: Seeds


def verify_plain_proof(header76: bytes, proof: PlainProofV4 | bytes | str, *, bits: int | None = None,
                       target: int | None = None,
                       public_data: bytes | None = None) -> tuple[bool, str]:
    """Verify a V4 plain proof against the proposed 76-byte header.

    `proof` may be a PlainProofV4, its bincode bytes or its base64 text. The difficulty comes from
    the header's nbits unless `bits` (a pool-share override) or an explicit `target` is given.
    With `public_data`, the statement rebuilt from the proof must equal it byte for byte.
    Returns (True, "ok") or (False, reason).
    """
    try:
        statement = evaluate_plain_proof(header76, proof)
        if target is None:
            target = target_from_bits(_header_bits(header76) if bits is None else bits)
        job = statement.job
        bound = lottery.threshold(target, job.a.pattern.tile_size, job.b.pattern.tile_size, job.common.k)
        if not lottery.is_winner(statement.jackpot, bound):
            raise Rejected("the jackpot ticket does not meet the difficulty target")
        if public_data is not None:
            _compare_public_data(statement, bytes(public_data))
    except Rejected as rejection:
        return False, str(rejection)
    return True, OK


def evaluate_plain_proof(header76: bytes, proof: PlainProofV4 | bytes | str) -> PublicData:
    """Steps 1–6: the full statement with its recomputed ticket J, or Rejected (no difficulty check)."""
    parsed = parse_plain_proof(header76, proof)
    statement = parsed.statement
    job = statement.job
    a = noised_operand(job, "A", parsed.a_codes, parsed.a_scales, statement.a_rows(), parsed.seeds)
    b = noised_operand(job, "B", parsed.b_codes, parsed.b_scales, statement.b_rows(), parsed.seeds)
    device = job.common.device.model
    tile, stats = fp8_matmul_with_stats(device, a.noisy.codes, b.noisy.codes)
    if not np.isfinite(tile).all():
        raise Rejected("the replayed tile is not finite")
    admissible, detail = check_policy(device, a.clean, a.noisy, b.clean, b.noisy, stats)
    if not admissible:
        raise Rejected(f"{NOT_ADMISSIBLE}: {detail}")
    message = lottery.fold_message(tile, job.a.pattern, job.b.pattern)
    return PublicData(job, statement.hash_b, statement.hash_a, statement.t_a, statement.t_b,
                      lottery.ticket(parsed.seeds.seed_a, message), statement.moe)


def noised_operand(job: JobParams, side: str, codes: np.ndarray, scales: np.ndarray, line_ids: list[int],
                   seeds: Seeds) -> NoisedOperand:
    """Open rows of one side and noisy-quantize them (E lines at the rows' global indices).

    E_A is drawn from seedA; E_B, F_A and F_B from seedB. Shared by the verifier and the CPU miner.
    """
    device = job.common.device.model
    try:
        clean = open_values(codes, scales)
        l2, linf = row_norms(codes, scales)
    except ValueError as exc:
        raise Rejected(f"{side} planes: {exc}") from None
    e_seed = seeds.seed_a if side == "A" else seeds.seed_b
    e_lines = noise_lines(e_seed, side, "E", np.asarray(line_ids, dtype=np.int64))
    f_lines = noise_lines(seeds.seed_b, side, "F", np.arange(job.common.k, dtype=np.int64))
    try:
        noisy = noisy_quantize(device, clean, l2, linf, e_lines, f_lines)
    except ValueError as exc:
        raise Rejected(f"{side} noisy quantization: {exc}") from None
    return NoisedOperand(clean, noisy)


def derive_seeds(job: JobParams, header76: bytes, hash_a: bytes, hash_b: bytes,
                 routing_roots: tuple[bytes, bytes] | None) -> Seeds:
    """seedB from (HB, keyB, pB), then seedA from (HA [, HR, HO], seedB, keyA, pA)."""
    seed_b = transcript.seed_b(hash_b, transcript.key_b(job.ancestor_header), job.p_b())
    seed_a = transcript.seed_a(hash_a, seed_b, transcript.key_a(header76), job.p_a(), routing_roots)
    return Seeds(seed_a, seed_b)


def parse_plain_proof(header76: bytes, proof: PlainProofV4 | bytes | str) -> ParsedProof:
    """Step 1: decode, authenticate the ancestry, the witness shape and every opening."""
    header76 = bytes(header76)
    if len(header76) != INCOMPLETE_HEADER_SIZE:
        raise Rejected(f"the proposed header must be {INCOMPLETE_HEADER_SIZE} bytes, got {len(header76)}")
    proof = _decode(proof)
    job = proof.job
    _check_ancestry(header76, job.ancestor_header, proof.ancestor_chain)
    try:
        job.check()
    except ParamsError as exc:
        raise Rejected(f"invalid job parameters: {exc}") from None
    _check_shape(proof)
    moe, a_inner, b_inner = _moe_projection(proof)
    t_a = _tile_base(a_inner, job, "A")
    t_b = _tile_base(b_inner, job, "B")
    key_a = transcript.key_a(header76)
    key_b = transcript.key_b(job.ancestor_header)
    hash_a = transcript.operand_digest(proof.values_a.proof.root, proof.scales_a.proof.root, key_a)
    hash_b = transcript.operand_digest(proof.values_b.proof.root, proof.scales_b.proof.root, key_b)
    statement = PublicData(job, hash_b, hash_a, t_a, t_b, bytes(32), moe)
    try:
        statement.check()
    except ParamsError as exc:
        raise Rejected(f"invalid statement: {exc}") from None

    k = job.common.k
    scale_row = 2 * (k // PREQUANT_BLOCK)
    rows = {"A": statement.a_rows(), "B": statement.b_rows()}
    openings = (("A values", proof.values_a, key_a, k, job.a.hash_id),
                ("A scales", proof.scales_a, key_a, scale_row, job.a.hash_id),
                ("B values", proof.values_b, key_b, k, job.b.hash_id),
                ("B scales", proof.scales_b, key_b, scale_row, job.b.hash_id))
    planes = []
    for label, opening, key, row_bytes, hash_id in openings:
        row_ids = rows[label[0]]
        if list(opening.row_indices) != row_ids:
            raise Rejected(f"{label}: row indices do not match the statement's tile")
        expected = leaves_for_rows(row_ids, row_bytes, hash_id.leaf_size)
        _check_opening(label, opening.proof, expected, key)
        planes.append(_extract_rows(label, opening.proof, row_ids, row_bytes))

    if moe is not None:
        witness = proof.moe_witness
        assert witness is not None and job.moe is not None
        routing_leaves = leaves_for_span(4 * moe.o_w_prev, 4 * moe.o_w, job.moe.hash_id_r.leaf_size)
        _check_opening("routing", witness.routing, routing_leaves, key_a)
        offsets_bytes = np.asarray(witness.offsets, dtype="<u4").tobytes()
        if keyed_tree_root(key_a, offsets_bytes, job.moe.hash_id_o.leaf_size) != witness.offsets_root:
            raise Rejected("offsets: the disclosed O does not hash to the claimed HO")

    codes_a, scales_a, codes_b, scales_b = planes
    seeds = derive_seeds(job, header76, hash_a, hash_b, (moe.hash_routing, moe.hash_offsets) if moe else None)
    return ParsedProof(statement, codes_a.view(np.int8), scales_a.view("<u2").astype(np.uint16),
                       codes_b.view(np.int8), scales_b.view("<u2").astype(np.uint16), seeds)


def _decode(proof: PlainProofV4 | bytes | str) -> PlainProofV4:
    if isinstance(proof, PlainProofV4):
        return proof
    try:
        if isinstance(proof, str):
            return PlainProofV4.from_base64(proof)
        return PlainProofV4.from_bytes(bytes(proof))
    except (BincodeError, ParamsError) as exc:
        raise Rejected(f"malformed plain proof: {exc}") from None


def _header_bits(header76: bytes) -> int:
    return int.from_bytes(header76[72:76], "little")


def _check_ancestry(header76: bytes, ancestor: bytes, chain: list[bytes]) -> None:
    """σ_d must be the depth-d ancestor of σ̂ (d <= 4) through the carried chain, parent first."""
    if len(chain) >= STATE_WINDOW_DEPTH:
        raise Rejected(f"the ancestor chain holds {len(chain)} headers; at most {STATE_WINDOW_DEPTH - 1} fit")
    child = header76
    for depth, parent in enumerate([*chain, ancestor], start=1):
        if len(parent) != HEADER_SIZE:
            raise Rejected(f"the ancestor header at depth {depth} is not {HEADER_SIZE} bytes")
        if child[4:36] != sha256d(parent):
            raise Rejected(f"the ancestor header at depth {depth} does not connect")
        child = parent


def _check_shape(proof: PlainProofV4) -> None:
    """Witness-only shape: MoE presence, same rows in both planes, tree sizes, the full O."""
    job = proof.job
    if (proof.moe_witness is None) != (job.moe is None):
        raise Rejected("the MoE witness must be present iff the job is MoE")
    for side, values, scales in (("A", proof.values_a, proof.scales_a), ("B", proof.values_b, proof.scales_b)):
        if list(values.row_indices) != list(scales.row_indices):
            raise Rejected(f"{side} values and scales must open the same rows")
    k = job.common.k
    scale_row = 2 * (k // PREQUANT_BLOCK)
    for label, opening, rows, row_bytes, hash_id in (
            ("A values", proof.values_a, job.a.num_rows, k, job.a.hash_id),
            ("A scales", proof.scales_a, job.a.num_rows, scale_row, job.a.hash_id),
            ("B values", proof.values_b, job.b.num_rows, k, job.b.hash_id),
            ("B scales", proof.scales_b, job.b.num_rows, scale_row, job.b.hash_id)):
        _check_tree_size(label, opening.proof, rows * row_bytes, hash_id)
    witness = proof.moe_witness
    if witness is not None and job.moe is not None:
        offsets = list(witness.offsets)
        if len(offsets) != job.moe.experts:
            raise Rejected(f"the offsets list O holds {len(offsets)} entries for e={job.moe.experts} experts")
        if any(x > y for x, y in zip(offsets, offsets[1:])):
            raise Rejected("the routing offsets O must be non-decreasing")
        _check_tree_size("routing", witness.routing, offsets[-1] * 4, job.moe.hash_id_r)


def _check_tree_size(label: str, proof: MerkleProof, raw_bytes: int, hash_id: HashId) -> None:
    if proof.leaf_size != hash_id.leaf_size:
        raise Rejected(f"{label}: leaf length {proof.leaf_size} does not match hash_id ({hash_id.leaf_size})")
    expected = hash_id.num_leaves(raw_bytes)
    if proof.total_leaves != expected:
        raise Rejected(f"{label}: the tree declares {proof.total_leaves} leaves, the shape implies {expected}")


def _moe_projection(proof: PlainProofV4) -> tuple[MoeStatement | None, list[int], list[int]]:
    """Map the opened rows to the expert-local lattice; build the MoE statement (dense: identity)."""
    job = proof.job
    a_rows = list(proof.values_a.row_indices)
    b_rows = list(proof.values_b.row_indices)
    witness = proof.moe_witness
    if witness is None or job.moe is None:
        return None, a_rows, b_rows
    w, offsets, m = witness.w, list(witness.offsets), job.a.num_rows
    if not w < job.moe.experts:
        raise Rejected(f"the winner expert w={w} is out of range for e={job.moe.experts}")
    o_w_prev = offsets[w - 1] if w else 0
    o_w, o_last = offsets[w], offsets[-1]
    if o_w - o_w_prev > m:
        raise Rejected(f"the winner's routing slice ({o_w - o_w_prev} entries) is longer than m={m}")
    if o_last > MAX_ROUTING_ENTRIES:
        raise Rejected("O_{e-1} must be <= 2^29")
    try:
        raw = witness.routing.extract_bytes(4 * o_w_prev, 4 * (o_w - o_w_prev))
    except BincodeError as exc:
        raise Rejected(f"routing: the opening does not cover R[w]: {exc}") from None
    routed = np.frombuffer(raw, dtype="<u4").tolist()
    if any(x >= y for x, y in zip(routed, routed[1:])):
        raise Rejected("the winner's routing slice R[w] must be strictly increasing")
    if any(t >= m for t in routed):
        raise Rejected(f"the winner's routing slice R[w] must lie in [0, m={m})")
    position = {token: i for i, token in enumerate(routed)}
    missing = [row for row in a_rows if row not in position]
    if missing:
        raise Rejected(f"opened A row {missing[0]} is not routed to expert {w}")
    eta = job.expert_rows
    outside = [row for row in b_rows if not w * eta <= row < (w + 1) * eta]
    if outside:
        raise Rejected(f"opened B row {outside[0]} is outside expert {w}'s rows [{w * eta}, {(w + 1) * eta})")
    statement = MoeStatement(w, o_w_prev, o_w, o_last, witness.routing.root, witness.offsets_root, tuple(a_rows))
    return statement, [position[row] for row in a_rows], [row - w * eta for row in b_rows]


def _tile_base(indices: list[int], job: JobParams, side: str) -> int:
    pattern = job.a.pattern if side == "A" else job.b.pattern
    try:
        return lottery.parse_tile_base(indices, pattern)
    except ParamsError as exc:
        raise Rejected(f"{side} rows do not form the committed tile: {exc}") from None


def _check_opening(label: str, proof: MerkleProof, expected_leaves: list[int], key: bytes) -> None:
    if list(proof.leaf_indices) != expected_leaves:
        raise Rejected(f"{label}: the opened leaves are not exactly those covering the opened rows")
    if not proof.verify(key):
        raise Rejected(f"{label}: the Merkle opening does not reproduce its claimed root")


def _extract_rows(label: str, proof: MerkleProof, rows: list[int], row_bytes: int) -> np.ndarray:
    try:
        data = b"".join(proof.extract_bytes(r * row_bytes, row_bytes) for r in rows)
    except BincodeError as exc:
        raise Rejected(f"{label}: {exc}") from None
    return np.frombuffer(data, dtype=np.uint8).reshape(len(rows), row_bytes)


def _compare_public_data(statement: PublicData, public_data: bytes) -> None:
    expected = statement.to_bytes()
    if public_data == expected:
        return
    try:
        claimed = PublicData.from_bytes(public_data)
    except ParamsError as exc:
        raise Rejected(f"public data: {exc}") from None
    for name in ("job", "hash_b", "hash_a", "t_a", "t_b", "jackpot", "moe"):
        if getattr(claimed, name) != getattr(statement, name):
            raise Rejected(f"public data: {name} does not match the proof")
    raise Rejected("public data does not match the proof")
