"""proof.fp8 wire formats: the variable-chunk MerkleProof, PlainProofV4 and the V4 public data."""
import random
import struct

import pytest

from proof.blake3tree import MerkleTree, leaves_for_rows
from proof.fp8.merkle_serde import BincodeError, MerkleProof
from proof.fp8.params import ParamsError, make_job
from proof.fp8.plain_proof import MatrixOpening, MoeWitness, PlainProofV4
from proof.fp8.public_data import DENSE_SIZE, MoeStatement, PublicData

KEY = bytes(range(32))


def _opening(data: bytes, leaf_size: int, leaves: list[int]) -> MerkleProof:
    tree = MerkleTree(KEY, data, leaf_size)
    return MerkleProof([tree.leaf(i) for i in leaves], leaves, tree.num_leaves, tree.root,
                       tree.siblings(leaves))


def test_merkle_proof_layout_is_bincode_fixint():
    proof = _opening(bytes(range(256)) * 2, 128, [1, 3])
    raw = proof.to_bytes()
    expected = (struct.pack("<Q", 2) + struct.pack("<Q", 128) + proof.leaf_data[0]
                + struct.pack("<Q", 128) + proof.leaf_data[1] + struct.pack("<QQQ", 2, 1, 3)
                + struct.pack("<Q", 4) + proof.root + struct.pack("<Q", len(proof.siblings))
                + b"".join(proof.siblings))
    assert raw == expected
    assert MerkleProof.from_bytes(raw) == proof
    assert proof.verify(KEY)


@pytest.mark.parametrize("leaf_size", [128, 256, 512, 1024])
def test_merkle_proof_random_roundtrip_and_verify(leaf_size):
    rng = random.Random(leaf_size)
    for _ in range(5):
        data = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 9 * leaf_size)))
        tree = MerkleTree(KEY, data, leaf_size)
        leaves = sorted(rng.sample(range(tree.num_leaves), rng.randrange(1, tree.num_leaves + 1)))
        proof = _opening(data, leaf_size, leaves)
        again = MerkleProof.from_bytes(proof.to_bytes())
        assert again == proof and again.verify(KEY)
        tampered = MerkleProof([bytes([proof.leaf_data[0][0] ^ 1]) + proof.leaf_data[0][1:]]
                               + proof.leaf_data[1:], leaves, proof.total_leaves, proof.root,
                               proof.siblings)
        assert not tampered.verify(KEY)


def test_merkle_proof_decode_rejects_malformed():
    proof = _opening(bytes(4096), 1024, [0, 2])
    raw = proof.to_bytes()
    for cut in range(0, len(raw), 97):
        with pytest.raises(BincodeError):
            MerkleProof.from_bytes(raw[:cut])
    with pytest.raises(BincodeError, match="trailing"):
        MerkleProof.from_bytes(raw + b"\0")
    bad = [
        MerkleProof(proof.leaf_data, [2, 0], 4, proof.root, proof.siblings),  # unsorted
        MerkleProof(proof.leaf_data, [0, 4], 4, proof.root, proof.siblings),  # out of range
        MerkleProof([], [], 4, proof.root, []),  # empty
        MerkleProof([proof.leaf_data[0][:100]], [0], 4, proof.root, []),  # bad leaf length
    ]
    for item in bad:
        writer_bytes = _force_encode(item)
        with pytest.raises(BincodeError):
            MerkleProof.from_bytes(writer_bytes)
        assert not item.verify(KEY)


def _force_encode(proof: MerkleProof) -> bytes:
    out = struct.pack("<Q", len(proof.leaf_data))
    for leaf in proof.leaf_data:
        out += struct.pack("<Q", len(leaf)) + leaf
    out += struct.pack("<Q", len(proof.leaf_indices)) + b"".join(struct.pack("<Q", i) for i in proof.leaf_indices)
    out += struct.pack("<Q", proof.total_leaves) + proof.root
    return out + struct.pack("<Q", len(proof.siblings)) + b"".join(proof.siblings)


def test_extract_bytes_spans_leaves():
    data = bytes(range(256)) * 8
    proof = _opening(data, 128, [3, 4, 9])
    assert proof.extract_bytes(3 * 128 + 5, 200) == data[3 * 128 + 5:3 * 128 + 205]
    with pytest.raises(BincodeError, match="not covered"):
        proof.extract_bytes(5 * 128, 4)


def _plain_proof(moe: bool) -> PlainProofV4:
    rng = random.Random(moe)
    k, m = 1024, 8
    experts = 2 if moe else 0
    n = 128 if moe else 64
    job = make_job(bytes(rng.getrandbits(8) for _ in range(108)), m=m, n=n, k=k, experts=experts)

    def plane(rows, row_bytes, opened):
        data = bytes(rng.getrandbits(8) for _ in range(rows * row_bytes))
        return MatrixOpening(_opening(data, 1024, leaves_for_rows(opened, row_bytes, 1024)), opened)

    a_rows, b_rows = [0, 1, 2, 3], list(range(64, 128) if moe else range(64))
    witness = None
    if moe:
        routing = struct.pack("<12I", *range(12))
        witness = MoeWitness(1, [5, 12], bytes(32), _opening(routing, 1024, [0]))
    return PlainProofV4(job, [bytes(108)] if moe else [],
                        plane(m, k, a_rows), plane(n, k, b_rows),
                        plane(m, 256, a_rows), plane(n, 256, b_rows), witness)


@pytest.mark.parametrize("moe", [False, True])
def test_plain_proof_roundtrip(moe):
    proof = _plain_proof(moe)
    raw = proof.to_bytes()
    job_blob = proof.job.to_wire_bytes()
    assert raw[:8] == struct.pack("<Q", len(job_blob)) and raw[8:8 + len(job_blob)] == job_blob
    if not moe:
        assert raw[-1] == 0  # the None tag of moe_witness
    again = PlainProofV4.from_bytes(raw)
    assert again == proof
    assert PlainProofV4.from_base64(proof.to_base64()) == proof


def test_plain_proof_rejects_malformed():
    raw = _plain_proof(True).to_bytes()
    for cut in (0, 7, 200, len(raw) // 2, len(raw) - 1):
        with pytest.raises((BincodeError, ParamsError)):
            PlainProofV4.from_bytes(raw[:cut])
    with pytest.raises(BincodeError, match="trailing"):
        PlainProofV4.from_bytes(raw + b"\0")
    dense = _plain_proof(False).to_bytes()
    with pytest.raises(BincodeError, match="Option"):
        PlainProofV4.from_bytes(dense[:-1] + b"\x02")
    with pytest.raises(BincodeError, match="base64"):
        PlainProofV4.from_base64("not base64!")
    chain_at = 8 + struct.unpack("<Q", raw[:8])[0]
    bad_chain = raw[:chain_at] + struct.pack("<Q", 107) + raw[chain_at + 8:]
    with pytest.raises(BincodeError):
        PlainProofV4.from_bytes(bad_chain)


def _public_data(moe: bool) -> PublicData:
    job = make_job(bytes(range(108)), m=16, n=256 if moe else 128, k=1024, experts=2 if moe else 0)
    statement = None
    if moe:
        statement = MoeStatement(1, 6, 14, 14, b"\x01" * 32, b"\x02" * 32, (3, 5, 9, 11))
    return PublicData(job, b"\xbb" * 32, b"\xaa" * 32, 4, 64, b"\x07" * 32, statement)


@pytest.mark.parametrize("moe", [False, True])
def test_public_data_layout(moe):
    pd = _public_data(moe)
    pd.check()
    raw = pd.to_bytes()
    assert len(raw) == (DENSE_SIZE + 2 + 2 + 12 + 64 + 16 if moe else DENSE_SIZE)
    p_b, p_a = pd.job.p_b(), pd.job.p_a()
    assert raw[:108] == bytes(range(108)) and raw[108:129] == p_b and raw[129:161] == b"\xbb" * 32
    assert raw[161:161 + len(p_a)] == p_a
    tail = raw[161 + len(p_a):]
    assert tail[:32] == b"\xaa" * 32 and struct.unpack("<II", tail[32:40]) == (4, 64)
    assert tail[40:72] == b"\x07" * 32
    assert PublicData.from_bytes(raw) == pd
    if moe:
        assert pd.a_rows() == [3, 5, 9, 11] and pd.b_rows() == list(range(128 + 64, 128 + 128))


def test_public_data_rejects_bad_statements():
    raw = _public_data(True).to_bytes()
    with pytest.raises(ParamsError, match="trailing"):
        PublicData.from_bytes(raw + b"\0")
    with pytest.raises(ParamsError, match="truncated"):
        PublicData.from_bytes(raw[:-1])
    dense = _public_data(False)
    cases = {
        "tA=1 is not a valid": PublicData(dense.job, dense.hash_b, dense.hash_a, 1, 0, dense.jackpot),
        "tA=16": PublicData(dense.job, dense.hash_b, dense.hash_a, 16, 0, dense.jackpot),
        "tB=128": PublicData(dense.job, dense.hash_b, dense.hash_a, 0, 128, dense.jackpot),
    }
    for message, statement in cases.items():
        with pytest.raises(ParamsError, match=message):
            statement.check()
    moe = _public_data(True)
    for bad, message in (((2, 6, 14, 14), "w=2"), ((0, 6, 14, 14), "must be 0"),
                         ((1, 6, 9, 14), "must equal"), ((1, 12, 14, 14), "tile max")):
        statement = MoeStatement(*bad, moe.moe.hash_routing, moe.moe.hash_offsets, moe.moe.i_a)
        with pytest.raises(ParamsError, match=message):
            PublicData(moe.job, moe.hash_b, moe.hash_a, 0 if bad[1] == 12 else moe.t_a, moe.t_b,
                       moe.jackpot, statement).check()
    device_byte = 108 + 11
    with pytest.raises(ParamsError, match="Device"):
        PublicData.from_bytes(raw[:device_byte] + b"\x05" + raw[device_byte + 1:])
