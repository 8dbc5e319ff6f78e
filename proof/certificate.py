"""Block certificates V1–V4 (encode and decode) and V5 (decode only), node-consensus.md §2.1–2.4.

Wire: ``version:u32 LE ‖ body``; version 0 means "no certificate" (decodes to None).  V4 follows
the newest layout seen (pearl `2ad4bc25`, node/wire/certificate_v4.go): each blob ≤ 60000 bytes,
the whole certificate ≤ 65000 bytes, then a mandatory canonical-varint ancestor count ≤ 3 and that
many 108-byte headers, parent first, outside the proof commitment (docs/protocol-chain.md).
"""
from __future__ import annotations

import struct
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Union

from proof.chain import HASH_LEN, HEADER_SIZE, BlockHeader, ByteReader, DecodeError, sha256d, write_varint

MAX_ZK_PROOF_SIZE = 60000
MAX_CERTIFICATE_SIZE = 65000
PUBLIC_DATA_SIZE_V1 = 164
PUBLIC_DATA_MAX_SIZE_V2 = 4807
MAX_V4_ANCESTOR_HEADERS = 3
MAX_FP16_PROOF_SIZE = 79000
MAX_V5_ANCESTOR_HEADERS = 2
MAX_CERTIFICATE_SIZE_V5 = MAX_FP16_PROOF_SIZE + HASH_LEN + 4 + 1 + MAX_V5_ANCESTOR_HEADERS * HEADER_SIZE


class CertificateError(DecodeError):
    """A certificate that cannot be encoded or decoded; the message says what is wrong."""


def proof_commitment(version: int, public_data: bytes) -> bytes:
    """SHA256d(u32le(version) ‖ public_data), internal order: the header's proof commitment."""
    if not 0 <= version <= 0xFFFFFFFF:
        raise ValueError(f"certificate version must be a u32, got {version}")
    return sha256d(struct.pack("<I", version) + bytes(public_data))


def _check_hash(block_hash: bytes) -> None:
    if len(block_hash) != HASH_LEN:
        raise CertificateError(f"certificate block hash must be {HASH_LEN} bytes, got {len(block_hash)}")


def _check_blob(name: str, blob: bytes, cap: int) -> None:
    if len(blob) > cap:
        raise CertificateError(f"{name} too large: {len(blob)} bytes (max {cap})")


def _blob(data: bytes) -> bytes:
    return struct.pack("<I", len(data)) + bytes(data)


def _read_blob(reader: ByteReader, name: str, cap: int) -> bytes:
    size = reader.u32(f"{name} length")
    if size > cap:
        raise CertificateError(f"{name} too large: {size} bytes (max {cap})")
    return reader.read(size, name)


def _ancestors_bytes(headers: tuple[BlockHeader, ...]) -> bytes:
    return write_varint(len(headers)) + b"".join(h.to_bytes() for h in headers)


def _read_ancestors(reader: ByteReader, version: int, cap: int) -> tuple[BlockHeader, ...]:
    count = reader.varint(f"v{version} ancestor count")
    if count > cap:
        raise CertificateError(f"too many v{version} ancestor headers: {count} (max {cap})")
    return tuple(BlockHeader.decode(reader) for _ in range(count))


class _Certificate(ABC):
    """Shared framing: version prefix, size cap, commitment over the public data."""

    version: ClassVar[int]
    max_size: ClassVar[int] = MAX_CERTIFICATE_SIZE
    block_hash: bytes
    public_data: bytes

    @abstractmethod
    def _body(self) -> bytes:
        """The version-specific fields after the version prefix."""

    def commitment(self) -> bytes:
        """The proof commitment the header must carry."""
        return proof_commitment(self.version, self.public_data)

    def to_bytes(self) -> bytes:
        encoded = struct.pack("<I", self.version) + self._body()
        if len(encoded) > self.max_size:
            raise CertificateError(f"certificate too large: {len(encoded)} bytes (max {self.max_size})")
        return encoded


@dataclass(frozen=True)
class CertificateV1(_Certificate):
    """INT7 dense: hash ‖ public data (exactly 164) ‖ u32 proof length ‖ proof."""

    block_hash: bytes
    public_data: bytes
    proof: bytes
    version: ClassVar[int] = 1

    def __post_init__(self) -> None:
        _check_hash(self.block_hash)
        if len(self.public_data) != PUBLIC_DATA_SIZE_V1:
            raise CertificateError(f"V1 public data must be {PUBLIC_DATA_SIZE_V1} bytes, "
                                   f"got {len(self.public_data)}")
        _check_blob("proof data", self.proof, MAX_ZK_PROOF_SIZE)

    def _body(self) -> bytes:
        return bytes(self.block_hash) + bytes(self.public_data) + _blob(self.proof)

    @classmethod
    def decode_body(cls, reader: ByteReader) -> CertificateV1:
        block_hash = reader.read(HASH_LEN, "certificate block hash")
        public_data = reader.read(PUBLIC_DATA_SIZE_V1, "V1 public data")
        return cls(block_hash, public_data, _read_blob(reader, "proof data", MAX_ZK_PROOF_SIZE))


@dataclass(frozen=True)
class CertificateV2(_Certificate):
    """INT7 dense or MoE: hash ‖ u32 len ‖ public data (≤ 4807) ‖ u32 len ‖ proof (≤ 60000)."""

    block_hash: bytes
    public_data: bytes
    proof: bytes
    version: ClassVar[int] = 2

    def __post_init__(self) -> None:
        _check_hash(self.block_hash)
        _check_blob("public data", self.public_data, PUBLIC_DATA_MAX_SIZE_V2)
        _check_blob("proof data", self.proof, MAX_ZK_PROOF_SIZE)

    @property
    def is_moe(self) -> bool:
        """MoE public data is longer than the 164-byte dense prefix (the empty placeholder is dense)."""
        return len(self.public_data) > PUBLIC_DATA_SIZE_V1

    def _body(self) -> bytes:
        return bytes(self.block_hash) + _blob(self.public_data) + _blob(self.proof)

    @classmethod
    def decode_body(cls, reader: ByteReader) -> CertificateV2:
        block_hash = reader.read(HASH_LEN, "certificate block hash")
        public_data = _read_blob(reader, "public data", PUBLIC_DATA_MAX_SIZE_V2)
        return cls(block_hash, public_data, _read_blob(reader, "proof data", MAX_ZK_PROOF_SIZE))


@dataclass(frozen=True)
class CertificateV3(CertificateV2):
    """V2's layout under version 3 (salted noise seeds; the commitment hashes version 3)."""

    version: ClassVar[int] = 3


@dataclass(frozen=True)
class CertificateV4(_Certificate):
    """FP8: hash ‖ public data ‖ proof (each ≤ 60000) ‖ varint count ≤ 3 ‖ ancestor headers."""

    block_hash: bytes
    public_data: bytes
    proof: bytes
    ancestor_headers: tuple[BlockHeader, ...] = ()
    version: ClassVar[int] = 4

    def __post_init__(self) -> None:
        _check_hash(self.block_hash)
        _check_blob("public data", self.public_data, MAX_ZK_PROOF_SIZE)
        _check_blob("proof data", self.proof, MAX_ZK_PROOF_SIZE)
        object.__setattr__(self, "ancestor_headers", tuple(self.ancestor_headers))
        if len(self.ancestor_headers) > MAX_V4_ANCESTOR_HEADERS:
            raise CertificateError(f"too many v4 ancestor headers: {len(self.ancestor_headers)} "
                                   f"(max {MAX_V4_ANCESTOR_HEADERS})")

    def _body(self) -> bytes:
        return (bytes(self.block_hash) + _blob(self.public_data) + _blob(self.proof)
                + _ancestors_bytes(self.ancestor_headers))

    @classmethod
    def decode_body(cls, reader: ByteReader) -> CertificateV4:
        block_hash = reader.read(HASH_LEN, "certificate block hash")
        public_data = _read_blob(reader, "public data", MAX_ZK_PROOF_SIZE)
        proof = _read_blob(reader, "proof data", MAX_ZK_PROOF_SIZE)
        return cls(block_hash, public_data, proof, _read_ancestors(reader, 4, MAX_V4_ANCESTOR_HEADERS))


@dataclass(frozen=True)
class CertificateV5:
    """FP16 header-bound ZK certificate (staged, not allowed on any network): decode only.

    hash ‖ u32 len ‖ proof (≤ 79000) ‖ varint count ≤ 2 ‖ ancestor headers; no public data, so the
    commitment hashes the proof.
    """

    block_hash: bytes
    proof: bytes
    ancestor_headers: tuple[BlockHeader, ...]
    version: ClassVar[int] = 5
    max_size: ClassVar[int] = MAX_CERTIFICATE_SIZE_V5

    def commitment(self) -> bytes:
        return proof_commitment(self.version, self.proof)

    @classmethod
    def decode_body(cls, reader: ByteReader) -> CertificateV5:
        block_hash = reader.read(HASH_LEN, "certificate block hash")
        proof = _read_blob(reader, "proof data", MAX_FP16_PROOF_SIZE)
        return cls(block_hash, proof, _read_ancestors(reader, 5, MAX_V5_ANCESTOR_HEADERS))


Certificate = Union[CertificateV1, CertificateV2, CertificateV3, CertificateV4, CertificateV5]
_DECODERS = {cls.version: cls
             for cls in (CertificateV1, CertificateV2, CertificateV3, CertificateV4, CertificateV5)}


def encode(certificate: Certificate | None) -> bytes:
    """Wire bytes of a certificate; None encodes as version 0 (no certificate)."""
    if certificate is None:
        return struct.pack("<I", 0)
    if isinstance(certificate, CertificateV5):
        raise CertificateError("certificate version 5 is decode-only")
    return certificate.to_bytes()


def decode_from(reader: ByteReader) -> Certificate | None:
    """Read one certificate (as inside a block); CertificateError says what is wrong."""
    start = reader.offset
    try:
        version = reader.u32("certificate version")
        if version == 0:
            return None
        if version not in _DECODERS:
            raise CertificateError(f"unsupported certificate version: {version}")
        cls = _DECODERS[version]
        certificate = cls.decode_body(reader)
    except CertificateError:
        raise
    except DecodeError as error:
        raise CertificateError(f"certificate: {error}") from None
    size = reader.offset - start
    if size > cls.max_size:
        raise CertificateError(f"certificate too large: {size} bytes (max {cls.max_size})")
    return certificate


def decode(data: bytes) -> Certificate | None:
    """Parse exactly one encoded certificate (trailing bytes are an error)."""
    reader = ByteReader(data)
    certificate = decode_from(reader)
    if reader.remaining:
        raise CertificateError(f"{reader.remaining} trailing bytes after the certificate")
    return certificate


def placeholder(version: int, block_hash: bytes = bytes(32)) -> Certificate:
    """The empty certificate a block template carries before a proof exists.

    V1 keeps its fixed 164 zero bytes of public data; V2–V4 have empty blobs (and no ancestors).
    """
    if version == 1:
        return CertificateV1(block_hash, bytes(PUBLIC_DATA_SIZE_V1), b"")
    if version in (2, 3):
        return _DECODERS[version](block_hash, b"", b"")
    if version == 4:
        return CertificateV4(block_hash, b"", b"")
    raise CertificateError(f"no placeholder for certificate version {version}")
