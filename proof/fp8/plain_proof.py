"""PlainProofV4: the miner's witness for a certificate-V4 block, bincode and base64 (§12).

Layout (bincode 1.x, fixint, little-endian, trailing bytes rejected), from
pearl-research-labs/pearl `zk-pow/src/v4/api/plain_proof.rs` @ 08ec7513f20cbab1dabbe8be98a6dd807fbab702:

    job            Vec<u8>   σ_d(108) ‖ pB ‖ pA
    ancestor_chain Vec<u8>   σ_1..σ_{d−1}, 108 bytes each, parent first (at most 3)
    values         Sides{a, b} of {proof: MerkleProof (variable-chunk), row_indices: Vec<u64>}
    scales         the same
    moe_witness    Option<{w u16, offsets Vec<u32>, offsets_root [32], routing: MerkleProof}>
"""
from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from proof.fp8.merkle_serde import BincodeError, BincodeReader, BincodeWriter, MerkleProof
from proof.fp8.params import HEADER_SIZE, STATE_WINDOW_DEPTH, JobParams, ParamsError

MAX_ANCESTOR_CHAIN = STATE_WINDOW_DEPTH - 1


@dataclass
class MatrixOpening:
    """Openings of some rows of one committed plane."""

    proof: MerkleProof
    row_indices: list[int]

    def encode(self, writer: BincodeWriter) -> None:
        self.proof.encode(writer)
        writer.uint_vec("Q", list(self.row_indices))

    @classmethod
    def decode(cls, reader: BincodeReader) -> "MatrixOpening":
        return cls(MerkleProof.decode(reader), reader.uint_vec("Q"))


@dataclass
class MoeWitness:
    """The winning expert w, the full offsets list O, its claimed root HO and an opening of R[w]."""

    w: int
    offsets: list[int]
    offsets_root: bytes
    routing: MerkleProof

    def encode(self, writer: BincodeWriter) -> None:
        writer.uint("H", self.w)
        writer.uint_vec("I", list(self.offsets))
        writer.raw(self.offsets_root)
        self.routing.encode(writer)

    @classmethod
    def decode(cls, reader: BincodeReader) -> "MoeWitness":
        return cls(reader.uint("H"), reader.uint_vec("I"), reader.raw(32), MerkleProof.decode(reader))


@dataclass
class PlainProofV4:
    """The V4 plain proof. Decoding checks the encoding only; verify.py checks the statement."""

    job: JobParams
    ancestor_chain: list[bytes]
    values_a: MatrixOpening
    values_b: MatrixOpening
    scales_a: MatrixOpening
    scales_b: MatrixOpening
    moe_witness: MoeWitness | None = None

    def to_bytes(self) -> bytes:
        if len(self.ancestor_chain) > MAX_ANCESTOR_CHAIN:
            raise ParamsError(f"the ancestor chain holds at most {MAX_ANCESTOR_CHAIN} headers")
        if any(len(header) != HEADER_SIZE for header in self.ancestor_chain):
            raise ParamsError(f"ancestor chain headers must be {HEADER_SIZE} bytes")
        writer = BincodeWriter()
        writer.byte_vec(self.job.to_wire_bytes())
        writer.byte_vec(b"".join(self.ancestor_chain))
        for opening in (self.values_a, self.values_b, self.scales_a, self.scales_b):
            opening.encode(writer)
        writer.uint("B", self.moe_witness is not None)
        if self.moe_witness is not None:
            self.moe_witness.encode(writer)
        return writer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> "PlainProofV4":
        """Decode; raises BincodeError or ParamsError naming the malformed part."""
        reader = BincodeReader(data, "PlainProofV4")
        job = JobParams.from_wire_bytes(reader.byte_vec())
        chain_bytes = reader.byte_vec()
        if len(chain_bytes) > MAX_ANCESTOR_CHAIN * HEADER_SIZE or len(chain_bytes) % HEADER_SIZE:
            raise BincodeError(f"ancestor chain of {len(chain_bytes)} bytes is not 0..3 headers")
        chain = [chain_bytes[i:i + HEADER_SIZE] for i in range(0, len(chain_bytes), HEADER_SIZE)]
        openings = [MatrixOpening.decode(reader) for _ in range(4)]
        witness = MoeWitness.decode(reader) if reader.option_tag() else None
        reader.finish()
        return cls(job, chain, *openings, moe_witness=witness)

    def to_base64(self) -> str:
        """Standard base64 with padding: the gateway's `plain_proof` field."""
        return base64.b64encode(self.to_bytes()).decode("ascii")

    @classmethod
    def from_base64(cls, text: str) -> "PlainProofV4":
        try:
            raw = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise BincodeError(f"plain proof is not valid base64: {exc}") from None
        return cls.from_bytes(raw)
