"""PlainProof bincode (int-protocol.md §8.1), base64, the legacy V1 form, and public data (§8.5)."""
import base64
import struct

import pytest

from proof.int7 import (Int7Error, MatrixOpening, MerkleOpening, MiningConfig, MoEOpening, PlainProof,
                        PublicData, config_and_jackpot, min_cert_version)

LEAF = bytes(range(256)) * 4
ROOT = bytes([0xAB]) * 32
SIB = bytes([0xCD]) * 32


def merkle(indices=(0,), total=1, siblings=()):
    return MerkleOpening(tuple(LEAF for _ in indices), tuple(indices), total, ROOT, tuple(siblings))


def dense_proof():
    return PlainProof(8, 4, 16, 2, MatrixOpening(merkle(), (1, 2, 3)),
                      MatrixOpening(merkle((0, 2), 4, (SIB,)), (0, 1)))


def moe_proof():
    routing = MoEOpening(4, 2, 1, (2, 4, 6, 8), (0, 1), merkle())
    return PlainProof(8, 4, 16, 2, dense_proof().a, dense_proof().bt, routing)


def q(*values):
    return struct.pack(f"<{len(values)}Q", *values)


def merkle_bytes(indices, total, siblings):
    return (q(len(indices)) + b"".join(q(1024) + LEAF for _ in indices) + q(len(indices), *indices)
            + q(total) + ROOT + q(len(siblings)) + b"".join(siblings))


DENSE_BYTES = (q(8, 4, 16, 2) + merkle_bytes((0,), 1, ()) + q(3, 1, 2, 3)
               + merkle_bytes((0, 2), 4, (SIB,)) + q(2, 0, 1))


def test_dense_layout_is_bincode_fixint():
    assert dense_proof().to_bytes() == DENSE_BYTES + b"\x00"
    assert dense_proof().to_bytes(legacy=True) == DENSE_BYTES
    assert PlainProof.from_bytes(DENSE_BYTES + b"\x00") == dense_proof()


def test_moe_layout():
    expected = (DENSE_BYTES + b"\x01" + q(4, 2) + struct.pack("<H", 1) + q(4) + struct.pack("<4I", 2, 4, 6, 8)
                + q(2, 0, 1) + merkle_bytes((0,), 1, ()))
    assert moe_proof().to_bytes() == expected
    assert PlainProof.from_bytes(expected) == moe_proof()
    assert min_cert_version(moe_proof()) == 2 and min_cert_version(dense_proof()) == 1


def test_legacy_v1_form_parses_and_moe_has_none():
    assert PlainProof.from_bytes(DENSE_BYTES) == dense_proof()
    with pytest.raises(Int7Error, match="legacy V1 form cannot carry an MoE"):
        moe_proof().to_bytes(legacy=True)


def test_base64_round_trip():
    text = moe_proof().to_base64()
    assert base64.b64decode(text) == moe_proof().to_bytes()
    assert PlainProof.from_base64(text) == moe_proof()
    with pytest.raises(Int7Error, match="invalid base64"):
        PlainProof.from_base64("not base64!")


def test_every_truncation_and_trailing_bytes_are_rejected():
    data = moe_proof().to_bytes()
    for size in range(len(data)):
        if size == len(DENSE_BYTES):
            assert PlainProof.from_bytes(data[:size]) == dense_proof()  # the legacy V1 form
            continue
        if size == len(data) - 1:  # the compat fallback appends 0x00, which restores the last byte
            assert data[-1] == 0 and PlainProof.from_bytes(data[:size]) == moe_proof()
            continue
        with pytest.raises(Int7Error):
            PlainProof.from_bytes(data[:size])
    with pytest.raises(Int7Error, match="trailing"):
        PlainProof.from_bytes(data + b"\x00")
    dense = dense_proof().to_bytes()
    with pytest.raises(Int7Error, match="trailing"):
        PlainProof.from_bytes(dense + b"\x01\x02")


def test_bad_fields_are_rejected():
    bad_leaf = q(8, 4, 16, 2) + q(1, 1000) + LEAF[:1000] + DENSE_BYTES[32 + 16 + 1024:] + b"\x00"
    with pytest.raises(Int7Error, match="leaf data must be 1024"):
        PlainProof.from_bytes(bad_leaf)
    with pytest.raises(Int7Error, match="Option tag 2"):
        PlainProof.from_bytes(DENSE_BYTES + b"\x02")
    huge = q(8, 4, 16, 2) + q(1 << 60)
    with pytest.raises(Int7Error, match="exceeds the remaining bytes"):
        PlainProof.from_bytes(huge)
    short_leaf = MerkleOpening((LEAF[:10],), (0,), 1, ROOT, ())
    with pytest.raises(Int7Error, match="1024 bytes"):
        PlainProof(1, 1, 1, 1, MatrixOpening(short_leaf, (0,)), dense_proof().bt).to_bytes()


def config(moe=False):
    rows, cols = [0, 8, 64, 72], [0, 1, 8, 9, 32, 33, 40, 41, 64, 65, 72, 73, 96, 97, 104, 105]
    return MiningConfig(256, 128, rows, cols, *((4, 4) if moe else (0, 0)))


def test_dense_public_data_layout():
    data = PublicData(config(), bytes([0xAB]) * 32, bytes([0xBC]) * 32, bytes([0xCD]) * 32, 64, 64, 0, 0)
    raw = data.to_bytes()
    assert len(raw) == 164
    assert raw[:52] == config().to_bytes() and raw[116:148] == bytes([0xCD]) * 32
    assert raw[148:] == struct.pack("<4I", 64, 64, 0, 0)
    assert PublicData.from_bytes(raw) == data
    assert config_and_jackpot(raw) == (config(), bytes([0xCD]) * 32)


def moe_public_data():  # Pearl's test_zk_proof_public_data_moe_roundtrip values
    return PublicData(config(moe=True), bytes([0xAB]) * 32, bytes([0xBC]) * 32, bytes([0xCD]) * 32, 64, 64,
                      0, 0, 1, (64, 128, 192, 256), bytes([0x11]) * 32, (3, 7, 42))


def test_moe_public_data_layout():
    raw = moe_public_data().to_bytes()
    assert len(raw) == 199 + 4 * 4 + 3 * 4
    assert raw[164:166] == b"\x01\x00" and raw[166:182] == struct.pack("<4I", 64, 128, 192, 256)
    assert raw[182:214] == bytes([0x11]) * 32 and raw[214] == 3 and raw[215:] == struct.pack("<3I", 3, 7, 42)
    assert PublicData.from_bytes(raw) == moe_public_data()


@pytest.mark.parametrize("mutate, message", [
    (lambda raw: raw[:163], "need at least 164"),
    (lambda raw: raw[:164], "no MoE tail"),
    (lambda raw: raw[:200], "truncated"),
    (lambda raw: raw + b"\x00", "does not match 3 outer"),
    (lambda raw: raw[:214] + bytes([129]) + raw[215:], "exceed the maximum 128"),
    (lambda raw: raw[:156] + struct.pack("<I", 8) + raw[160:], "t_rows 8"),
    (lambda raw: raw[:160] + struct.pack("<I", 1) + raw[164:], "t_cols 1"),
    (lambda raw: raw[:148] + struct.pack("<I", 0) + raw[152:], "t_rows 0"),
])
def test_public_data_rejects(mutate, message):
    with pytest.raises(Int7Error, match=message):
        PublicData.from_bytes(mutate(moe_public_data().to_bytes()))


def test_dense_config_with_tail_is_rejected():
    dense = PublicData(config(), bytes(32), bytes(32), bytes(32), 64, 64, 0, 0).to_bytes()
    with pytest.raises(Int7Error, match="MoE tail but the configuration is dense"):
        PublicData.from_bytes(dense + bytes(40))
