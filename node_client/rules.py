"""The certificate rules pearld applies, so the worker never submits what the chain refuses.

Order and texts follow pearld @ 2ad4bc25 (node-consensus.md §3.1, §3.4; docs/node-client.md):
public-data size (decode), the version allow-list and empty public data (CheckBlockHeaderSanity and
certificate verification), then CheckCertificateRules:
the version required at the height, dense-only, and the rank penalty. A violation raises
``RuleViolation``; ``str(exc)`` starts with the rule's name and ``exc.text`` is pearld's own text
(the devnet returns it as ``"rejected: <text>"``).
"""
from __future__ import annotations

from node_client import forks
from proof.certificate import MAX_ZK_PROOF_SIZE
from proof.int7 import (
    MAX_PUBLIC_DATA_SIZE as PUBLIC_DATA_MAX_V2,
    PENALTY_BASE_RANK,
    PUBLIC_DATA_SIZE as PUBLIC_DATA_SIZE_DENSE,
    Int7Error,
    PlainProof,
    config_and_jackpot,
    penalized_bound,
)
from proof.int7 import public_data as int7_public_data
from proof.fp8.plain_proof import PlainProofV4
from proof.fp8.verify import Rejected as Fp8Rejected
from proof.fp8.verify import evaluate_plain_proof as evaluate_fp8_plain_proof


class RuleViolation(Exception):
    """A certificate the node would reject; ``rule`` names the rule, ``text`` is pearld's message."""

    def __init__(self, rule: str, text: str) -> None:
        super().__init__(f"{rule}: {text}")
        self.rule = rule
        self.text = text


def rank_penalty_error(bits: int, public_data: bytes) -> str | None:
    """None when INT public data meets the rank-penalty rule, else pearld's CheckRankPenalty error text."""
    if not public_data:
        return "empty public data"
    size = len(public_data)
    if not PUBLIC_DATA_SIZE_DENSE <= size <= PUBLIC_DATA_MAX_V2:
        return f"rank penalty rule violated: invalid public_data_len {size}"
    try:
        config, jackpot = config_and_jackpot(public_data)
        if config.rank < PENALTY_BASE_RANK:
            return f"rank penalty rule violated: Rank must be >= {PENALTY_BASE_RANK} || r={config.rank}"
        bound = penalized_bound(bits, config)
    except Int7Error as exc:
        return f"rank penalty rule violated: {exc}"
    if int.from_bytes(jackpot, "little") > bound:
        return (
            "rank penalty rule violated: Jackpot condition not satisfied: "
            "hash does not meet the rank-penalized difficulty target"
        )
    return None


def is_moe_certificate(cert_version: int, public_data: bytes) -> bool:
    """pearld's Certificate.IsMoE: V2/V3 with public data longer than the 164-byte dense form."""
    return cert_version in (2, 3) and len(public_data) > PUBLIC_DATA_SIZE_DENSE


def _check_types(cert_version: int, public_data: bytes, bits: int, height: int) -> None:
    if not isinstance(public_data, (bytes, bytearray, memoryview)):
        raise TypeError(f"public_data must be bytes, got {type(public_data).__name__}")
    for name, value in (("cert_version", cert_version), ("bits", bits), ("height", height)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    if bits >= 2**32:
        raise ValueError(f"bits must fit in 32 bits, got {bits:#x}")


def check_public_data_size(cert_version: int, public_data: bytes) -> None:
    """The wire-format limits a certificate's public data must meet to decode at all (§2.3)."""
    size = len(public_data)
    if cert_version == 1 and size != PUBLIC_DATA_SIZE_DENSE:
        raise RuleViolation(
            "public-data-size", f"v1 public data must be {PUBLIC_DATA_SIZE_DENSE} bytes, got {size}"
        )
    if cert_version in (2, 3) and size > PUBLIC_DATA_MAX_V2:
        raise RuleViolation(
            "public-data-size",
            f"public data length {size} exceeds max {PUBLIC_DATA_MAX_V2} for certificate version {cert_version}",
        )
    if cert_version == 4 and size > MAX_ZK_PROOF_SIZE:
        raise RuleViolation(
            "public-data-size", f"public data length {size} exceeds max {MAX_ZK_PROOF_SIZE} for certificate version 4"
        )


def check_certificate(network: str | forks.NetworkParams, height: int, cert_version: int, public_data: bytes, bits: int) -> None:
    """Raise RuleViolation if pearld would refuse this certificate at ``height`` on ``network``.

    ``bits`` is the block header's compact target (the rank-penalty bound is measured against it).
    The rank penalty is skipped for V4/V5 and on networks without proof checks (simnet), as pearld does.
    """
    _check_types(cert_version, public_data, bits, height)
    params = forks.get_params(network)
    public_data = bytes(public_data)
    check_public_data_size(cert_version, public_data)
    if not params.is_cert_version_allowed(cert_version):
        raise RuleViolation("version-allowed", f"certificate version {cert_version} is not allowed")
    if not public_data and not params.no_pow_check:  # certificate verification (sanity) refuses it
        text = "empty fp8 proof" if cert_version == 4 else "empty public data"
        raise RuleViolation("empty-public-data", f"certificate verification failed: {text}")
    required = params.required_cert_version(height)
    if cert_version != required:
        raise RuleViolation(
            "version-for-height",
            f"certificate version {cert_version} is not allowed at height {height} (require version {required})",
        )
    if is_moe_certificate(cert_version, public_data) and params.dense_only_active(height):
        raise RuleViolation(
            "dense-only",
            f"MoE certificate is not allowed at height {height} "
            f"(dense-only fork active from height {params.dense_only_fork_height})",
        )
    rank_penalty_applies = (
        cert_version not in (4, 5) and params.rank_penalty_active(height) and not params.no_pow_check
    )
    if rank_penalty_applies:
        problem = rank_penalty_error(bits, public_data)
        if problem is not None:
            raise RuleViolation(
                "rank-penalty",
                f"certificate fails the rank penalty rule at height {height} "
                f"(fork active from height {params.rank_penalty_fork_height}): {problem}",
            )


def would_accept(
    network: str | forks.NetworkParams, height: int, cert_version: int, public_data: bytes, bits: int
) -> tuple[bool, str]:
    """Ask before submitting: ``(True, "")`` or ``(False, reason naming the rule)``."""
    try:
        check_certificate(network, height, cert_version, public_data, bits)
    except RuleViolation as exc:
        return False, str(exc)
    return True, ""


def would_accept_plain_proof(
    network: str | forks.NetworkParams, height: int, cert_version: int, header76: bytes,
    proof: PlainProof | PlainProofV4,
) -> tuple[bool, str]:
    """``would_accept`` for a plain proof about to go to the gateway: its public data is built with
    proof/ (the bytes the prover will commit to: proof.int7 for V1–V3, proof.fp8 for V4) and the
    header's bits are used."""
    if len(header76) != 76:
        raise ValueError(f"header76 must be 76 bytes, got {len(header76)}")
    try:
        if isinstance(proof, PlainProofV4):
            public_data = evaluate_fp8_plain_proof(header76, proof).to_bytes()
        else:
            public_data = int7_public_data(header76, proof, cert_version=cert_version)
    except (Int7Error, Fp8Rejected) as exc:
        return False, f"invalid-proof: {exc}"
    bits = int.from_bytes(header76[72:76], "little")
    return would_accept(network, height, cert_version, public_data, bits)
