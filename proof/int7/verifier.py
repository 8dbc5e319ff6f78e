"""The INT plain-proof verifier (certificates V1–V3), and public data built from a plain proof."""
from __future__ import annotations

from .errors import Int7Error
from .plain_proof import PlainProof
from .statement import derive_statement, statement_public_data, statement_ticket
from .target import meets_bound, unpenalized_bound


def verify_plain_proof(header76: bytes, proof: PlainProof, *, bits: int,
                       cert_version: int) -> tuple[bool, str]:
    """(True, "ok") when the proof is valid for the header and meets the target of `bits`.

    `bits` is the compact target to meet (the header's nbits, or a pool's share target). Like
    Pearl's plain verifier it applies the unpenalised bound T0·h·w·D; the node's rank penalty is
    a separate rule (penalized_bound). On failure the reason names the first check that failed.
    """
    try:
        statement = derive_statement(bytes(header76), proof, cert_version)
        jackpot = statement_ticket(statement, cert_version)
        bound = unpenalized_bound(bits, statement.config)
    except Int7Error as error:
        return False, str(error)
    if not meets_bound(jackpot, bound):
        return False, f"ticket {jackpot[::-1].hex()} (LE value) exceeds the target bound {bound:#x}"
    return True, "ok"


def public_data(header76: bytes, proof: PlainProof, *, cert_version: int) -> bytes:
    """The certificate's public data for a plain proof (164 bytes dense, longer for MoE).

    Runs every structural and Merkle check of the verifier (not the target); raises Int7Error.
    """
    statement = derive_statement(bytes(header76), proof, cert_version)
    return statement_public_data(statement, statement_ticket(statement, cert_version)).to_bytes()
