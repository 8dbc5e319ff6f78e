"""proof.certificate: commitments, V1–V4 round trips, V5 decoding, caps and framing (§2.3, §6.4–6.5)."""
from __future__ import annotations

import random
import struct

import pytest

from proof import certificate as cert
from proof.chain import BlockHeader, sha256d
from proof.certificate import CertificateError

RNG = random.Random(9)
ANCESTORS = tuple(BlockHeader(1, RNG.randbytes(32), RNG.randbytes(32), 1700000000 + i, 0x1D00FFFF,
                              RNG.randbytes(32)) for i in range(3))


def _samples() -> list:
    rng = random.Random(10)
    return [
        cert.CertificateV1(rng.randbytes(32), rng.randbytes(164), rng.randbytes(70)),
        cert.CertificateV1(rng.randbytes(32), bytes(164), b""),
        cert.CertificateV2(rng.randbytes(32), rng.randbytes(164), rng.randbytes(90)),
        cert.CertificateV2(rng.randbytes(32), rng.randbytes(4807), rng.randbytes(10)),
        cert.CertificateV3(rng.randbytes(32), rng.randbytes(400), rng.randbytes(33)),
        cert.CertificateV3(rng.randbytes(32), b"", b""),
        cert.CertificateV4(rng.randbytes(32), rng.randbytes(308), rng.randbytes(60)),
        cert.CertificateV4(rng.randbytes(32), rng.randbytes(244), rng.randbytes(5), ANCESTORS[:1]),
        cert.CertificateV4(rng.randbytes(32), b"\x01", b"\x00", ANCESTORS),
    ]


def test_v4_commitment_vector_and_ancestors_excluded():
    expected = "568f157f74edfe2d3e0b0973e4c7eda30d5a35e27dd2359cdd509d33d87aa392"
    assert cert.proof_commitment(4, b"\x01").hex() == expected
    assert cert.CertificateV4(bytes(32), b"\x01", b"\x00").commitment().hex() == expected
    assert cert.CertificateV4(bytes(32), b"\x01", b"\x00", ANCESTORS).commitment().hex() == expected


def test_commitment_is_sha256d_of_version_and_public_data():
    data = bytes(164)
    for version in (1, 2, 3):
        assert cert.proof_commitment(version, data) == sha256d(struct.pack("<I", version) + data)
    assert cert.proof_commitment(2, data) != cert.proof_commitment(3, data)
    assert cert.CertificateV3(bytes(32), data, b"").commitment() == cert.proof_commitment(3, data)
    with pytest.raises(ValueError, match="u32"):
        cert.proof_commitment(-1, b"")


def test_round_trip_identical_v1_to_v4():
    for certificate in _samples():
        data = certificate.to_bytes()
        assert data[:4] == struct.pack("<I", certificate.version)
        decoded = cert.decode(data)
        assert decoded == certificate and type(decoded) is type(certificate)
        assert decoded.to_bytes() == data
        assert cert.encode(certificate) == data


def test_layout_sizes():
    v1, _, v2 = _samples()[:3]
    assert len(v1.to_bytes()) == 4 + 200 + 70
    assert len(v2.to_bytes()) == 4 + 40 + 164 + 90
    v4 = _samples()[7]
    assert len(v4.to_bytes()) == 4 + 32 + 4 + 244 + 4 + 5 + 1 + 108
    assert v4.to_bytes()[-109:] == b"\x01" + ANCESTORS[0].to_bytes()


def test_every_truncation_fails():
    for certificate in _samples():
        if len(certificate.public_data) > 1000:
            continue
        data = certificate.to_bytes()
        for cut in range(len(data)):
            with pytest.raises(CertificateError, match="truncated"):
                cert.decode(data[:cut])
    with pytest.raises(CertificateError, match="trailing"):
        cert.decode(_samples()[0].to_bytes() + b"\x00")


def _v4_prefix() -> bytes:
    return struct.pack("<I", 4) + bytes(32) + struct.pack("<I", 1) + b"\x01" + struct.pack("<I", 1) + b"\x00"


def test_v4_framing_cases():
    prefix = _v4_prefix()
    assert cert.decode(prefix + b"\x00") == cert.CertificateV4(bytes(32), b"\x01", b"\x00")
    three = prefix + b"\x03" + b"".join(h.to_bytes() for h in ANCESTORS)
    assert cert.decode(three).ancestor_headers == ANCESTORS
    with pytest.raises(CertificateError, match=r"too many v4 ancestor headers: 4 \(max 3\)"):
        cert.decode(prefix + b"\x04" + b"".join(h.to_bytes() for h in ANCESTORS * 2))
    with pytest.raises(CertificateError, match="non-canonical"):
        cert.decode(prefix + bytes.fromhex("fd0200"))
    with pytest.raises(CertificateError, match="truncated"):
        cert.decode(prefix + bytes.fromhex("fd02"))
    with pytest.raises(CertificateError, match="truncated"):
        cert.decode(prefix)  # the ancestor count is mandatory
    with pytest.raises(CertificateError, match="too many v4 ancestor headers"):
        cert.CertificateV4(bytes(32), b"", b"", ANCESTORS + ANCESTORS[:1])


def test_size_caps():
    exact = cert.CertificateV4(bytes(32), bytes(60000), bytes(4955))
    assert len(exact.to_bytes()) == cert.MAX_CERTIFICATE_SIZE == 65000
    assert cert.decode(exact.to_bytes()) == exact
    over = cert.CertificateV4(bytes(32), bytes(60000), bytes(4956))
    with pytest.raises(CertificateError, match=r"certificate too large: 65001 bytes \(max 65000\)"):
        over.to_bytes()
    crafted = exact.to_bytes()[:-4955 - 5] + struct.pack("<I", 4956) + bytes(4956) + b"\x00"
    with pytest.raises(CertificateError, match="certificate too large: 65001"):
        cert.decode(crafted)
    with pytest.raises(CertificateError, match="proof data too large: 60001"):
        cert.CertificateV4(bytes(32), b"", bytes(60001))
    with pytest.raises(CertificateError, match="public data too large: 4808"):
        cert.CertificateV2(bytes(32), bytes(4808), b"")
    with pytest.raises(CertificateError, match="V1 public data must be 164"):
        cert.CertificateV1(bytes(32), bytes(163), b"")
    oversized_len = struct.pack("<I", 2) + bytes(32) + struct.pack("<I", 4808)
    with pytest.raises(CertificateError, match="public data too large: 4808 bytes"):
        cert.decode(oversized_len + bytes(4808) + bytes(4))
    oversized_proof = struct.pack("<I", 1) + bytes(196) + struct.pack("<I", 60001)
    with pytest.raises(CertificateError, match="proof data too large: 60001 bytes"):
        cert.decode(oversized_proof)


def test_versions_zero_unsupported_and_hash_length():
    assert cert.decode(bytes(4)) is None
    assert cert.encode(None) == bytes(4)
    for version in (6, 0xFFFFFFFF):
        with pytest.raises(CertificateError, match=f"unsupported certificate version: {version}"):
            cert.decode(struct.pack("<I", version) + bytes(40))
    with pytest.raises(CertificateError, match="block hash must be 32"):
        cert.CertificateV2(bytes(31), b"", b"")


def test_v5_decode_only():
    proof = bytes(range(256)) * 4
    body = (bytes(32) + struct.pack("<I", len(proof)) + proof + b"\x02"
            + ANCESTORS[0].to_bytes() + ANCESTORS[1].to_bytes())
    data = struct.pack("<I", 5) + body
    decoded = cert.decode(data)
    assert isinstance(decoded, cert.CertificateV5)
    assert decoded.proof == proof and decoded.ancestor_headers == ANCESTORS[:2]
    assert decoded.commitment() == cert.proof_commitment(5, proof)
    with pytest.raises(CertificateError, match="decode-only"):
        cert.encode(decoded)
    too_many = struct.pack("<I", 5) + bytes(32) + struct.pack("<I", 0) + b"\x03"
    with pytest.raises(CertificateError, match=r"too many v5 ancestor headers: 3 \(max 2\)"):
        cert.decode(too_many)
    big = struct.pack("<I", 5) + bytes(32) + struct.pack("<I", 79001)
    with pytest.raises(CertificateError, match="proof data too large: 79001"):
        cert.decode(big)
    max_v5 = struct.pack("<I", 5) + bytes(32) + struct.pack("<I", 79000) + bytes(79000) + b"\x00"
    assert len(cert.decode(max_v5).proof) == 79000
    assert cert.MAX_CERTIFICATE_SIZE_V5 == 79253
    for cut in range(len(data)):
        with pytest.raises(CertificateError, match="truncated"):
            cert.decode(data[:cut])


def test_placeholders():
    block_hash = bytes(range(32))
    v1 = cert.placeholder(1, block_hash)
    assert v1.public_data == bytes(164) and v1.proof == b""
    for version in (2, 3):
        ph = cert.placeholder(version, block_hash)
        assert ph.version == version and ph.public_data == b"" and not ph.is_moe
        assert len(ph.to_bytes()) == 4 + 40
    v4 = cert.placeholder(4, block_hash)
    assert v4.to_bytes() == struct.pack("<I", 4) + block_hash + bytes(8) + b"\x00"
    with pytest.raises(CertificateError, match="no placeholder for certificate version 5"):
        cert.placeholder(5)


def test_is_moe():
    assert not cert.CertificateV2(bytes(32), bytes(164), b"").is_moe
    assert cert.CertificateV3(bytes(32), bytes(165), b"").is_moe
