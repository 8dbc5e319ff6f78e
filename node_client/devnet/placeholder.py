"""The devnet's stand-in for ZK: certificates whose proof bytes carry the plain proof itself.

No Plonky2 prover runs here, so the certificate's proof bytes are an explicit placeholder:
``b"pearl-moe/devnet" ‖ plain proof (bincode)``. The devnet "verifies the certificate" by checking the
binding exactly as pearld's zkpow.VerifyCertificate does (block hash, proof commitment, non-empty
blobs) and then, in place of the ZK verifier, verifying the embedded plain proof with ``proof/`` and
requiring that it yields the certificate's public data. A real node rejects these certificates.
"""
from __future__ import annotations

from proof import int7
from proof.chain import BlockHeader, display_hex
from proof.certificate import CertificateV1, CertificateV2, CertificateV3, Certificate

PLACEHOLDER_MAGIC = b"pearl-moe/devnet"
INT_VERSIONS = (1, 2, 3)


class ProofRejected(ValueError):
    """A plain proof (or a certificate's placeholder) that does not verify; the message says why."""


def placeholder_proof(plain_proof: bytes) -> bytes:
    return PLACEHOLDER_MAGIC + bytes(plain_proof)


def embedded_plain_proof(proof_bytes: bytes) -> bytes:
    if not proof_bytes.startswith(PLACEHOLDER_MAGIC):
        raise ProofRejected("proof data is not a devnet placeholder (a ZK proof cannot be verified here)")
    return proof_bytes[len(PLACEHOLDER_MAGIC):]


def decode_plain_proof(cert_version: int, plain_proof: bytes) -> int7.PlainProof:
    """Parse a plain proof of the kind ``cert_version`` takes; ProofRejected when it does not parse."""
    if cert_version not in INT_VERSIONS:
        raise ProofRejected(f"the devnet verifies certificate versions {INT_VERSIONS}, not {cert_version}")
    try:
        return int7.PlainProof.from_bytes(plain_proof)
    except int7.Int7Error as exc:
        raise ProofRejected(f"plain proof does not decode: {exc}") from exc


def verified_public_data(cert_version: int, header76: bytes, plain_proof: bytes, bits: int) -> bytes:
    """Verify a plain proof against the header and target; return the public data it proves."""
    proof = decode_plain_proof(cert_version, plain_proof)
    if int7.min_cert_version(proof) > cert_version:
        raise ProofRejected(f"an MoE proof cannot go into a version {cert_version} certificate")
    ok, reason = int7.verify_plain_proof(header76, proof, bits=bits, cert_version=cert_version)
    if not ok:
        raise ProofRejected(reason)
    try:
        return int7.public_data(header76, proof, cert_version=cert_version)
    except int7.Int7Error as exc:
        raise ProofRejected(str(exc)) from exc


_CERT_CLASSES = {1: CertificateV1, 2: CertificateV2, 3: CertificateV3}


def build_certificate(cert_version: int, block_hash: bytes, public_data: bytes, plain_proof: bytes) -> Certificate:
    return _CERT_CLASSES[cert_version](block_hash, public_data, placeholder_proof(plain_proof))


def verify_certificate(header: BlockHeader, certificate: Certificate) -> None:
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
    if not public_data:
        raise ProofRejected("empty public data")
    if not certificate.proof:
        raise ProofRejected("empty proof data")
    try:
        plain = embedded_plain_proof(certificate.proof)
        expected = verified_public_data(version, header.incomplete_bytes(), plain, header.bits)
    except ProofRejected as exc:
        raise ProofRejected(f"proof rejected: {exc}") from exc
    if expected != public_data:
        raise ProofRejected("proof rejected: public data does not match the embedded plain proof")
