"""The devnet's stand-in for ZK: certificates whose proof bytes are a placeholder naming a plain proof.

No Plonky2 prover runs here, so the certificate's proof bytes are an explicit placeholder:

- ``b"pearl-moe/devnet" ‖ 0x01 ‖ plain proof (bincode)`` when that fits the 60,000-byte proof cap
  (INT proofs at the default configuration, ~26 KB), so the block is self-contained;
- ``b"pearl-moe/devnet" ‖ 0x02 ‖ SHA-256(plain proof)`` otherwise (FP8 V4 proofs, ~90 KB); the plain
  proof itself is kept in the devnet's PlainProofStore (``plainproofs.dat`` in the data directory).

The devnet "verifies the certificate" by checking the binding exactly as pearld's
zkpow.VerifyCertificate does (block hash, proof commitment, non-empty blobs) and then, in place of
the ZK verifier, verifying the named plain proof with ``proof/`` and requiring that it yields the
certificate's public data (and, for V4, that the certificate's ancestor headers are the proof's
ancestor chain). A real node rejects these certificates.
"""
from __future__ import annotations

import hashlib
import threading
from pathlib import Path

from node_client.devnet.records import RecordFile
from proof import int7
from proof.certificate import MAX_ZK_PROOF_SIZE, Certificate, CertificateV1, CertificateV2, CertificateV3, CertificateV4
from proof.chain import BlockHeader, display_hex
from proof.fp8.merkle_serde import BincodeError
from proof.fp8.params import ParamsError
from proof.fp8.plain_proof import PlainProofV4
from proof.fp8.verify import Rejected, evaluate_plain_proof
from proof.fp8.verify import verify_plain_proof as verify_fp8_plain_proof

PLACEHOLDER_MAGIC = b"pearl-moe/devnet"
INLINE = 0x01
BY_DIGEST = 0x02
SUPPORTED_VERSIONS = (1, 2, 3, 4)
PlainProof = int7.PlainProof | PlainProofV4


class ProofRejected(ValueError):
    """A plain proof (or a certificate's placeholder) that does not verify; the message says why."""


class PlainProofStore:
    """Plain proofs by SHA-256, for placeholders too large to carry them; appended to ``path``."""

    def __init__(self, path: Path | None) -> None:
        self._proofs: dict[bytes, bytes] = {}
        self._lock = threading.Lock()
        self._file = None
        if path is not None:
            self._file = RecordFile(path)
            self._proofs = {hashlib.sha256(proof).digest(): proof for proof in self._file.records}
            self._file.records.clear()

    def add(self, plain_proof: bytes) -> bytes:
        digest = hashlib.sha256(plain_proof).digest()
        with self._lock:
            if digest not in self._proofs:
                self._proofs[digest] = bytes(plain_proof)
                if self._file is not None:
                    self._file.append(self._proofs[digest])
        return digest

    def get(self, digest: bytes) -> bytes | None:
        with self._lock:
            return self._proofs.get(digest)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def placeholder_proof(plain_proof: bytes, store: PlainProofStore) -> bytes:
    """The certificate proof bytes for a plain proof: inline when it fits, else by digest."""
    inline = PLACEHOLDER_MAGIC + bytes([INLINE]) + bytes(plain_proof)
    if len(inline) <= MAX_ZK_PROOF_SIZE:
        return inline
    return PLACEHOLDER_MAGIC + bytes([BY_DIGEST]) + store.add(plain_proof)


def named_plain_proof(proof_bytes: bytes, store: PlainProofStore) -> bytes:
    """The plain proof a placeholder names; ProofRejected when it is no devnet placeholder."""
    if not proof_bytes.startswith(PLACEHOLDER_MAGIC) or len(proof_bytes) <= len(PLACEHOLDER_MAGIC):
        raise ProofRejected("proof data is not a devnet placeholder (a ZK proof cannot be verified here)")
    kind, payload = proof_bytes[len(PLACEHOLDER_MAGIC)], proof_bytes[len(PLACEHOLDER_MAGIC) + 1:]
    if kind == INLINE:
        return payload
    if kind == BY_DIGEST and len(payload) == 32:
        plain = store.get(payload)
        if plain is None:
            raise ProofRejected(f"the devnet holds no plain proof with SHA-256 {payload.hex()}")
        return plain
    raise ProofRejected(f"unknown devnet placeholder kind {kind}")


def decode_plain_proof(cert_version: int, plain_proof: bytes) -> PlainProof:
    """Parse a plain proof of the kind ``cert_version`` takes; ProofRejected when it does not parse."""
    if cert_version not in SUPPORTED_VERSIONS:
        raise ProofRejected(f"the devnet verifies certificate versions {SUPPORTED_VERSIONS}, not {cert_version}")
    try:
        if cert_version == 4:
            return PlainProofV4.from_bytes(plain_proof)
        return int7.PlainProof.from_bytes(plain_proof)
    except (int7.Int7Error, BincodeError, ParamsError) as exc:
        raise ProofRejected(f"plain proof does not decode: {exc}") from exc


def public_data_for(cert_version: int, header76: bytes, plain_proof: bytes) -> bytes:
    """The public data a prover would commit to for this plain proof (the gateway's side).

    Structural, Merkle and (V4) replay checks run here; the target is checked by the node.
    """
    proof = decode_plain_proof(cert_version, plain_proof)
    try:
        if isinstance(proof, PlainProofV4):
            return evaluate_plain_proof(header76, proof).to_bytes()
        if int7.min_cert_version(proof) > cert_version:
            raise ProofRejected(f"an MoE proof cannot go into a version {cert_version} certificate")
        return int7.public_data(header76, proof, cert_version=cert_version)
    except (Rejected, int7.Int7Error) as exc:
        raise ProofRejected(str(exc)) from exc


def check_plain_proof(cert_version: int, header76: bytes, plain_proof: bytes, bits: int, public_data: bytes) -> None:
    """The node's stand-in for ZK verification: the plain proof verifies against the header and
    target and proves exactly ``public_data``; ProofRejected says why not."""
    proof = decode_plain_proof(cert_version, plain_proof)
    if isinstance(proof, PlainProofV4):
        ok, reason = verify_fp8_plain_proof(header76, proof, bits=bits, public_data=public_data)
        if not ok:
            raise ProofRejected(reason)
        return
    ok, reason = int7.verify_plain_proof(header76, proof, bits=bits, cert_version=cert_version)
    if not ok:
        raise ProofRejected(reason)
    if public_data_for(cert_version, header76, plain_proof) != public_data:
        raise ProofRejected("public data does not match the plain proof")


def ancestor_chain(cert_version: int, plain_proof: bytes) -> tuple[BlockHeader, ...]:
    """The V4 certificate's ancestor headers: the proof's ancestor chain (none for INT versions)."""
    if cert_version != 4:
        return ()
    proof = decode_plain_proof(4, plain_proof)
    return tuple(BlockHeader.from_bytes(h) for h in proof.ancestor_chain)


_INT_CERTIFICATES = {1: CertificateV1, 2: CertificateV2, 3: CertificateV3}


def build_certificate(cert_version: int, block_hash: bytes, public_data: bytes, plain_proof: bytes,
                      store: PlainProofStore) -> Certificate:
    """The certificate a gateway would build, with the placeholder in place of the ZK proof."""
    proof_bytes = placeholder_proof(plain_proof, store)
    if cert_version == 4:
        return CertificateV4(block_hash, public_data, proof_bytes, ancestor_chain(4, plain_proof))
    return _INT_CERTIFICATES[cert_version](block_hash, public_data, proof_bytes)


def verify_certificate(header: BlockHeader, certificate: Certificate, store: PlainProofStore) -> None:
    """pearld's zkpow.VerifyCertificate with the plain proof in place of ZK; raises ProofRejected."""
    block_hash = header.block_hash()
    if certificate.block_hash != block_hash:
        raise ProofRejected(
            f"block hash mismatch: certificate has {display_hex(certificate.block_hash)}, "
            f"header has {display_hex(block_hash)}"
        )
    commitment = certificate.commitment()
    if header.proof_commitment != commitment:
        raise ProofRejected(
            f"proof commitment mismatch: header has {display_hex(header.proof_commitment)}, "
            f"certificate has {display_hex(commitment)}"
        )
    version = certificate.version
    public_data = getattr(certificate, "public_data", b"")
    if version == 4 and (not public_data or not certificate.proof):
        raise ProofRejected("empty fp8 proof")
    if not public_data:
        raise ProofRejected("empty public data")
    if not certificate.proof:
        raise ProofRejected("empty proof data")
    prefix = "v4 proof rejected" if version == 4 else "proof rejected"
    try:
        plain = named_plain_proof(certificate.proof, store)
        check_plain_proof(version, header.incomplete_bytes(), plain, header.bits, public_data)
        if version == 4 and tuple(certificate.ancestor_headers) != ancestor_chain(4, plain):
            raise ProofRejected("the certificate's ancestor headers are not the proof's ancestor chain")
    except ProofRejected as exc:
        raise ProofRejected(f"{prefix}: {exc}") from exc
