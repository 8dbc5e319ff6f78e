"""Job key, V3 salting, the MoE routing fold and the noise-seed chain (int-protocol.md §2–3).

Plain BLAKE3 where the spec says unkeyed; keyed BLAKE3 (the standard keyed-hash mode) otherwise.
"""
from __future__ import annotations

import struct

import blake3

from ..blake3tree import keyed_tree_root
from .config import MiningConfig
from .errors import Int7Error
from .plain_proof import LEAF_SIZE

HEADER_SIZE = 76
SEED_SALT_A = blake3.blake3(b"pearl/cert-v3/noise-seed/A").digest()
SEED_SALT_B = blake3.blake3(b"pearl/cert-v3/noise-seed/B").digest()


def _hash(data: bytes, key: bytes | None = None) -> bytes:
    if key is None:
        return blake3.blake3(data).digest()
    return blake3.blake3(data, key=key).digest()


def _check_hash(name: str, value: bytes) -> None:
    if len(value) != 32:
        raise Int7Error(f"{name} must be 32 bytes, got {len(value)}")


def job_key(header76: bytes, config: MiningConfig) -> bytes:
    """BLAKE3(header76 ‖ config52): binds the block header and the configuration (two blocks)."""
    if len(header76) != HEADER_SIZE:
        raise Int7Error(f"header must be {HEADER_SIZE} bytes, got {len(header76)}")
    return _hash(bytes(header76) + config.to_bytes())


def commitment(job_key_: bytes, data: bytes) -> bytes:
    """Keyed root of the 1024-byte-leaf tree of zero-padded data: H_A, H_B, H_R and H_O."""
    _check_hash("job_key", job_key_)
    return keyed_tree_root(job_key_, data, LEAF_SIZE)


def offsets_hash(job_key_: bytes, routing_end_offsets: list[int]) -> bytes:
    """H_O: the commitment of the per-expert end offsets as u32 LE."""
    return commitment(job_key_, struct.pack(f"<{len(routing_end_offsets)}I", *routing_end_offsets))


def salt(hash_: bytes, dim: int, salt_key: bytes) -> bytes:
    """V3 salting: keyed BLAKE3(salt, root ‖ u32le(dim) ‖ 28 zeros) binds the shape to the seed."""
    _check_hash("matrix root", hash_)
    if not 0 <= dim < 1 << 32:
        raise Int7Error(f"salted dimension {dim} does not fit in u32")
    return _hash(hash_ + struct.pack("<I", dim) + bytes(28), salt_key)


def routing_fold(hash_a: bytes, routing_hash: bytes, offsets_hash_: bytes) -> bytes:
    """hAct = BLAKE3(hA ‖ BLAKE3(H_R ‖ H_O)): folds the routing into A's seed input."""
    _check_hash("routing_hash", routing_hash)
    _check_hash("offsets_hash", offsets_hash_)
    return _hash(hash_a + _hash(routing_hash + offsets_hash_))


def noise_seeds(job_key: bytes, hash_a: bytes, hash_b: bytes, *, salted: bool, m: int | None = None,
                n: int | None = None, routing_hash: bytes | None = None,
                offsets_hash: bytes | None = None) -> tuple[bytes, bytes]:
    """(s_B, s_A): s_B = BLAKE3(job_key ‖ hB'), s_A = BLAKE3(s_B ‖ hAct); s_A keys the ticket.

    `salted` selects the V3 derivation (needs m, and n = per-expert n for MoE); MoE proofs pass
    routing_hash (H_R) and offsets_hash (H_O), folded in after salting.
    """
    _check_hash("job_key", job_key)
    _check_hash("hash_a", hash_a)
    _check_hash("hash_b", hash_b)
    if salted:
        if m is None or n is None:
            raise Int7Error("salted seeds need m and n")
        hash_a, hash_b = salt(hash_a, m, SEED_SALT_A), salt(hash_b, n, SEED_SALT_B)
    if (routing_hash is None) != (offsets_hash is None):
        raise Int7Error("MoE seeds need both routing_hash and offsets_hash")
    activations = hash_a if routing_hash is None else routing_fold(hash_a, routing_hash, offsets_hash)
    s_b = _hash(job_key + hash_b)
    return s_b, _hash(s_b + activations)


def salted_for(cert_version: int) -> bool:
    """Cert V3 uses salted seeds; V1 and V2 the legacy chain."""
    if cert_version not in (1, 2, 3):
        raise Int7Error(f"cert version {cert_version} is not an INT version (1, 2 or 3)")
    return cert_version == 3
