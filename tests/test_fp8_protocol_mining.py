"""CPU-mined V4 proofs verify (dense, MoE, both devices, every tile); corruptions are rejected with reasons."""
import dataclasses
import random

import numpy as np
import pytest

from proof.blake3tree import keyed_tree_root
from proof.chain import BlockHeader, sha256d
from proof.fp8 import transcript
from proof.fp8.miner import build_plain_proof, commit_operand, commit_routing, mine_cpu, routing_from_topk
from proof.fp8.params import Device, HashId, ParamsError, TileShape, make_job
from proof.fp8.plain_proof import MatrixOpening
from proof.fp8.prequant import prequantize
from proof.fp8.public_data import PublicData
from proof.fp8.verify import NOT_ADMISSIBLE, verify_plain_proof

EASY_BITS = 0x1E040000  # target 2^234: a 4×64 tile at k = 1024 wins with probability 1/16
K = 1024
TILE_WORK = 4 * 64 * K


def _headers(bits: int, timestamp: int = 1_700_000_000):
    """σ_2 (the committed ancestor), σ_1 (the parent, carried in the chain) and the proposed σ̂."""
    grandparent = BlockHeader(1, bytes(32), bytes(range(32)), timestamp, bits, b"\x11" * 32).to_bytes()
    parent = BlockHeader(1, sha256d(grandparent), bytes(range(1, 33)), timestamp + 1, bits,
                         b"\x22" * 32).to_bytes()
    proposed = BlockHeader(1, sha256d(parent), bytes(range(2, 34)), timestamp + 2, bits).incomplete_bytes()
    return grandparent, parent, proposed


def _mine_low_ticket_dense():
    """Mine until a tile wins against target 2^232 (threshold 2^250): the ticket J is then small,
    so a corruption that only changes the ticket passes a target of ceil(J / tile work) with
    probability at most 2^-6 (deterministic inputs make the outcome fixed)."""
    rng = np.random.default_rng(11)
    a = rng.standard_normal((32, K)).astype(np.float32)
    b = rng.standard_normal((128, K)).astype(np.float32)
    for attempt in range(40):
        grandparent, parent, header = _headers(EASY_BITS, 1_700_000_000 + 10 * attempt)
        result = mine_cpu(header, a, b, ancestor_header=grandparent, ancestor_chain=[parent],
                          target=1 << 232)
        if result.proof is not None:
            return header, result
    raise AssertionError("no winner in 40 launches")


@pytest.fixture(scope="module")
def dense():
    return _mine_low_ticket_dense()


@pytest.fixture(scope="module")
def moe():
    rng = np.random.default_rng(5)
    grandparent, parent, header = _headers(0x207FFFFF)
    experts, tokens = 4, 16
    a = rng.standard_normal((tokens, K)).astype(np.float32)
    b = rng.standard_normal((experts * 64, K)).astype(np.float32)
    topk = np.stack([rng.choice(experts, 2, replace=False) for _ in range(tokens)])
    result = mine_cpu(header, a, b, ancestor_header=parent, topk_ids=topk, experts=experts)
    assert result.proof is not None
    return header, result


def _tight_target(result) -> int:
    return -(-int.from_bytes(result.public_data.jackpot, "little") // TILE_WORK)


def test_dense_proof_verifies_at_the_header_target(dense):
    header, result = dense
    assert verify_plain_proof(header, result.proof) == (True, "ok")
    assert verify_plain_proof(header, result.proof.to_bytes()) == (True, "ok")
    public_data = result.public_data.to_bytes()
    assert verify_plain_proof(header, result.proof.to_base64(), public_data=public_data) == (True, "ok")
    assert verify_plain_proof(header, result.proof, target=_tight_target(result)) == (True, "ok")
    assert result.work == 32 * 128 * K and result.winners >= 1


def test_public_data_is_244_bytes_and_canonical(dense):
    _, result = dense
    raw = result.public_data.to_bytes()
    assert len(raw) == 244
    assert PublicData.from_bytes(raw) == result.public_data


def test_moe_proof_verifies(moe):
    header, result = moe
    public_data = result.public_data.to_bytes()
    assert verify_plain_proof(header, result.proof.to_bytes(), public_data=public_data) == (True, "ok")
    witness = result.proof.moe_witness
    assert witness is not None and len(witness.offsets) == 4
    assert len(result.public_data.to_bytes()) == 244 + 2 + 2 + 12 + 64 + 4 * 4


@pytest.mark.parametrize("device,tile,m,n", [(Device.HOPPER, TileShape(4, 64), 8, 64),
                                             (Device.HOPPER, TileShape(4, 128), 4, 128),
                                             (Device.BLACKWELL, TileShape(4, 64), 8, 64),
                                             (Device.BLACKWELL, TileShape(16, 32), 16, 32)])
def test_devices_and_tiles_mine_and_verify(device, tile, m, n):
    rng = np.random.default_rng(int(device) + tile.cols)
    grandparent, parent, header = _headers(0x207FFFFF)
    result = mine_cpu(header, rng.standard_normal((m, K)).astype(np.float32),
                      rng.standard_normal((n, K)).astype(np.float32), ancestor_header=parent, device=device,
                      tile=tile)
    assert result.proof is not None and result.proof.job.common.device is device
    assert result.proof.job.b.pattern == tile.col_pattern
    assert verify_plain_proof(header, result.proof) == (True, "ok")


def test_hopper_has_no_tall_tile():
    rng = np.random.default_rng(0)
    _, parent, header = _headers(0x207FFFFF)
    with pytest.raises(ParamsError, match="not one of the hopper tiles"):
        mine_cpu(header, rng.standard_normal((16, K)), rng.standard_normal((32, K)), ancestor_header=parent,
                 device=Device.HOPPER, tile=TileShape(16, 32))


def test_difficulty_is_enforced(dense):
    header, result = dense
    ok, reason = verify_plain_proof(header, result.proof, target=_tight_target(result) - 1)
    assert not ok and reason == "the jackpot ticket does not meet the difficulty target"
    ok, reason = verify_plain_proof(header, result.proof, bits=0x1D00FFFF)
    assert not ok and "difficulty" in reason


def _flip_leaf(opening: MatrixOpening, leaf: int, byte: int) -> MatrixOpening:
    data = list(opening.proof.leaf_data)
    data[leaf] = data[leaf][:byte] + bytes([data[leaf][byte] ^ 0x01]) + data[leaf][byte + 1:]
    return dataclasses.replace(opening, proof=dataclasses.replace(opening.proof, leaf_data=data))


def _reject(header, proof, match, **kwargs):
    ok, reason = verify_plain_proof(header, proof, **kwargs)
    assert not ok
    assert match in reason, reason
    return reason


def test_corrupt_plane_byte(dense):
    header, result = dense
    proof = dataclasses.replace(result.proof, values_a=_flip_leaf(result.proof.values_a, 0, 17))
    _reject(header, proof, "A values: the Merkle opening does not reproduce its claimed root")


def test_corrupt_scale(dense):
    header, result = dense
    proof = dataclasses.replace(result.proof, scales_b=_flip_leaf(result.proof.scales_b, 3, 200))
    _reject(header, proof, "B scales: the Merkle opening does not reproduce its claimed root")


def test_corrupt_row_index(dense):
    header, result = dense
    rows = list(result.proof.values_a.row_indices)
    rows[1] += 1
    proof = dataclasses.replace(result.proof, values_a=dataclasses.replace(result.proof.values_a, row_indices=rows))
    _reject(header, proof, "A values and scales must open the same rows")
    proof = dataclasses.replace(proof, scales_a=dataclasses.replace(result.proof.scales_a, row_indices=rows))
    _reject(header, proof, "A rows do not form the committed tile")


def test_corrupt_tile_base(dense):
    header, result = dense
    shifted = [r + 4 if r + 4 < 32 else r - 4 for r in result.proof.values_a.row_indices]
    shifted.sort()
    proof = dataclasses.replace(
        result.proof, values_a=dataclasses.replace(result.proof.values_a, row_indices=shifted),
        scales_a=dataclasses.replace(result.proof.scales_a, row_indices=shifted))
    _reject(header, proof, "A values: the opened leaves are not exactly those covering the opened rows")
    statement = result.public_data
    moved = dataclasses.replace(statement, t_b=(statement.t_b + 64) % 128)
    _reject(header, result.proof, "public data: t_b does not match the proof", public_data=moved.to_bytes())


def test_tile_base_reopened_elsewhere_fails_the_ticket(dense):
    """A correctly opened neighbouring tile is a different, losing lottery ticket."""
    header, result = dense
    job = result.proof.job
    rng = np.random.default_rng(11)
    a_values = rng.standard_normal((32, K)).astype(np.float32)
    b_values = rng.standard_normal((128, K)).astype(np.float32)
    a = commit_operand(transcript.key_a(header), *prequantize(a_values), job.a.hash_id)
    b = commit_operand(transcript.key_b(job.ancestor_header), *prequantize(b_values), job.b.hash_id)
    t_a, t_b = result.public_data.t_a, result.public_data.t_b
    again = build_plain_proof(job, a, b, t_a, t_b, ancestor_chain=result.proof.ancestor_chain)
    assert again.to_bytes() == result.proof.to_bytes()  # what the runtime rebuilds from retained planes
    other = build_plain_proof(job, a, b, t_a, (t_b + 64) % 128, ancestor_chain=result.proof.ancestor_chain)
    ok, reason = verify_plain_proof(header, other, target=_tight_target(result))
    assert not ok and ("difficulty" in reason or reason.startswith(NOT_ADMISSIBLE))


def test_corrupt_ancestor_header(dense):
    header, result = dense
    job = result.proof.job
    bad = job.ancestor_header[:40] + bytes([job.ancestor_header[40] ^ 1]) + job.ancestor_header[41:]
    proof = dataclasses.replace(result.proof, job=dataclasses.replace(job, ancestor_header=bad))
    _reject(header, proof, "the ancestor header at depth 2 does not connect")
    chain = [result.proof.ancestor_chain[0][:-1] + b"\x00"]
    _reject(header, dataclasses.replace(result.proof, ancestor_chain=chain), "depth 1 does not connect")
    _reject(header, dataclasses.replace(result.proof, ancestor_chain=[]), "depth 1 does not connect")
    other_header = header[:4] + bytes(32) + header[36:]
    _reject(other_header, result.proof, "depth 1 does not connect")


def test_corrupt_device_byte(dense):
    header, result = dense
    job = result.proof.job
    common = dataclasses.replace(job.common, device=Device.BLACKWELL)
    proof = dataclasses.replace(result.proof, job=dataclasses.replace(job, common=common))
    raw = result.proof.to_bytes()
    device_at = 8 + 108 + 11
    assert raw[device_at] == 0 and proof.to_bytes()[device_at] == 1
    ok, reason = verify_plain_proof(header, proof.to_bytes(), target=_tight_target(result))
    assert not ok and ("difficulty" in reason or reason.startswith(NOT_ADMISSIBLE)), reason
    _reject(header, raw[:device_at] + b"\x02" + raw[device_at + 1:], "malformed plain proof: unsupported Device")


def test_corrupt_routing(moe):
    header, result = moe
    witness = result.proof.moe_witness
    routing = witness.routing
    leaf = routing.leaf_data[0]
    bad_leaf = leaf[:4] + bytes([leaf[4] ^ 1]) + leaf[5:]
    bad = dataclasses.replace(witness, routing=dataclasses.replace(routing, leaf_data=[bad_leaf]))
    reason = _reject(header, dataclasses.replace(result.proof, moe_witness=bad), "")
    assert "routing" in reason or "R[w]" in reason or "not routed" in reason
    offsets = list(witness.offsets)
    offsets[-1] += 1
    bad = dataclasses.replace(witness, offsets=offsets)
    _reject(header, dataclasses.replace(result.proof, moe_witness=bad), "offsets: the disclosed O does not hash")
    other = (witness.w + 1) % 4
    _reject(header, dataclasses.replace(result.proof, moe_witness=dataclasses.replace(witness, w=other)), "")
    bad = dataclasses.replace(witness, offsets_root=bytes(32))
    _reject(header, dataclasses.replace(result.proof, moe_witness=bad),
            "offsets: the disclosed O does not hash to the claimed HO")
    _reject(header, dataclasses.replace(result.proof, moe_witness=None), "MoE witness must be present")


def test_random_byte_flips_are_rejected_with_reasons(dense):
    header, result = dense
    raw = result.proof.to_bytes()
    rng = random.Random(3)
    for position in rng.sample(range(len(raw)), 24):
        corrupted = raw[:position] + bytes([raw[position] ^ (1 << rng.randrange(8))]) + raw[position + 1:]
        ok, reason = verify_plain_proof(header, corrupted, target=_tight_target(result))
        assert not ok and reason, position


def test_inadmissible_tiles_are_reported():
    """Both operands are aligned spikes over a faint floor, so almost every summand is predictable
    (the census counts ~98% skippable): every tile wins the easy target but fails the policy."""
    rng = np.random.default_rng(9)
    grandparent, parent, header = _headers(0x207FFFFF)
    a = rng.standard_normal((8, K)).astype(np.float32) * 1e-3
    b = rng.standard_normal((64, K)).astype(np.float32) * 1e-3
    a[:, ::64] = b[:, ::64] = 100.0
    result = mine_cpu(header, a, b, ancestor_header=parent)
    assert result.proof is None and result.winners == result.not_admissible == 2
    job = make_job(parent, m=8, n=64, k=K)
    ca = commit_operand(transcript.key_a(header), *prequantize(a), job.a.hash_id)
    cb = commit_operand(transcript.key_b(parent), *prequantize(b), job.b.hash_id)
    for t_a in (0, 4):
        ok, reason = verify_plain_proof(header, build_plain_proof(job, ca, cb, t_a, 0))
        assert not ok and reason.startswith(NOT_ADMISSIBLE + ": unpredictable summands"), reason


def test_decode_failures_are_reasons(dense):
    header, result = dense
    _reject(header, b"\x00" * 5, "malformed plain proof")
    _reject(header, "%%%", "malformed plain proof")
    _reject(header[:75], result.proof, "76 bytes")


def test_routing_table_and_commitment():
    topk = np.array([[2, 0], [1, 2], [0, 1], [2, 3]])
    tokens, offsets = routing_from_topk(topk, 4)
    assert tokens == [0, 2, 1, 2, 0, 1, 3, 3] and offsets == [2, 4, 7, 8]
    key = bytes(range(32))
    moe = make_job(bytes(108), m=8, n=4 * 64, k=K, experts=4).moe
    routing = commit_routing(key, tokens, offsets, moe)
    assert routing.roots == (keyed_tree_root(key, np.asarray(tokens, "<u4").tobytes(), 1024),
                             keyed_tree_root(key, np.asarray(offsets, "<u4").tobytes(), 1024))
    assert routing.expert_tokens(2) == [0, 1, 3]
    with pytest.raises(ValueError, match="more than once"):
        routing_from_topk(np.array([[1, 1]]), 4)
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        routing_from_topk(np.array([[0, 4]]), 4)


def test_build_plain_proof_rejects_bad_moe_requests(moe):
    header, result = moe
    job = result.proof.job
    rng = np.random.default_rng(1)
    a = commit_operand(transcript.key_a(header), *prequantize(rng.standard_normal((16, K))), job.a.hash_id)
    b = commit_operand(transcript.key_b(job.ancestor_header), *prequantize(rng.standard_normal((256, K))),
                       job.b.hash_id)
    with pytest.raises(ValueError, match="routing commitment"):
        build_plain_proof(job, a, b, 0, 0)
    routing = commit_routing(transcript.key_a(header), [0, 1, 2, 3, 4], [5, 5, 5, 5], job.moe)
    with pytest.raises(ValueError, match="runs past expert"):
        build_plain_proof(job, a, b, 4, 0, routing=routing, expert=0)


@pytest.mark.parametrize("hash_id", [HashId.CHUNK_128, HashId.CHUNK_512])
def test_small_leaves_mine_and_verify(hash_id):
    rng = np.random.default_rng(int(hash_id))
    _, parent, header = _headers(0x207FFFFF)
    result = mine_cpu(header, rng.standard_normal((8, K)), rng.standard_normal((64, K)), ancestor_header=parent,
                      hash_id=hash_id)
    assert result.proof.values_b.proof.leaf_size == hash_id.leaf_size
    assert verify_plain_proof(header, result.proof.to_bytes()) == (True, "ok")


def test_state_window_depth():
    """σ_d may be the 4th ancestor (three carried headers) but not the 5th."""
    chain = [BlockHeader(1, bytes(32), bytes(32), 1, 0x207FFFFF, b"\x01" * 32).to_bytes()]
    for depth in range(4):
        chain.append(BlockHeader(1, sha256d(chain[-1]), bytes(32), depth + 2, 0x207FFFFF, b"\x02" * 32).to_bytes())
    header = BlockHeader(1, sha256d(chain[-1]), bytes(32), 9, 0x207FFFFF).incomplete_bytes()
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((8, K)), rng.standard_normal((64, K))
    result = mine_cpu(header, a, b, ancestor_header=chain[1], ancestor_chain=chain[:1:-1])
    assert len(result.proof.ancestor_chain) == 3
    assert verify_plain_proof(header, result.proof) == (True, "ok")
    too_deep = dataclasses.replace(result.proof, ancestor_chain=chain[:0:-1],
                                   job=dataclasses.replace(result.proof.job, ancestor_header=chain[0]))
    _reject(header, too_deep, "the ancestor chain holds 4 headers; at most 3 fit")
