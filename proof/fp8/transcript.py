"""FP8 (certificate V4) transcript: labels, keyed-BLAKE3 subkeys, keys, seeds (fp8-and-integration.md §3).

keyA = H_key-A(σ̂)            keyB = H_key-B(σ_d)
HX   = BLAKE3(root_values ‖ root_scales; key = keyX)
seedB = H_seed-B(HB ‖ keyB ‖ pB)
seedA = H_seed-A(HA [‖ HR ‖ HO] ‖ seedB ‖ keyA ‖ pA)
noise-line key = Subkey("noise-line", seed), jackpot key = Subkey("jackpot", seedA)
J = BLAKE3(msg64; key = jackpot key)

Messages are plain concatenations (no tags, no length prefixes).
"""
from __future__ import annotations

import blake3

LABEL_PREFIX = b"pearl/v4/FP8/"
LABELS = ("key-A", "key-B", "seed-A", "seed-B", "noise-line", "jackpot", "zk-public")
DIGEST_SIZE = 32


def subkey(label: str, parent: bytes | None = None) -> bytes:
    """Subkey(label, parent): BLAKE3 of the full label, keyed by `parent` when one is given.

    Unkeyed is deliberately distinct from keyed with a zero key.
    """
    message = LABEL_PREFIX + label.encode("ascii")
    if parent is None:
        return blake3.blake3(message).digest()
    return blake3.blake3(message, key=_digest(parent, "parent key")).digest()


def hash_labelled(message: bytes, label: str, parent: bytes | None = None) -> bytes:
    """H_label(message; parent) = BLAKE3(message; key = Subkey(label, parent))."""
    return blake3.blake3(bytes(message), key=subkey(label, parent)).digest()


def key_a(proposed_header: bytes) -> bytes:
    """keyA = H_key-A(σ̂), over the 76-byte proposed header; also keys HR and HO."""
    if len(proposed_header) != 76:
        raise ValueError(f"the proposed header must be 76 bytes, got {len(proposed_header)}")
    return hash_labelled(proposed_header, "key-A")


def key_b(ancestor_header: bytes) -> bytes:
    """keyB = H_key-B(σ_d), over the complete 108-byte ancestor header."""
    if len(ancestor_header) != 108:
        raise ValueError(f"the ancestor header must be 108 bytes, got {len(ancestor_header)}")
    return hash_labelled(ancestor_header, "key-B")


def operand_digest(root_values: bytes, root_scales: bytes, key: bytes) -> bytes:
    """HX: one keyed compression folding the two plane roots of an operand."""
    message = _digest(root_values, "values root") + _digest(root_scales, "scales root")
    return blake3.blake3(message, key=_digest(key, "operand key")).digest()


def seed_b(hash_b: bytes, key_b_: bytes, p_b: bytes) -> bytes:
    """seedB = H_seed-B(HB ‖ keyB ‖ pB); fixed per job, before any A data exists."""
    return hash_labelled(_digest(hash_b, "HB") + _digest(key_b_, "keyB") + bytes(p_b), "seed-B")


def seed_a(hash_a: bytes, seed_b_: bytes, key_a_: bytes, p_a: bytes,
           routing: tuple[bytes, bytes] | None = None) -> bytes:
    """seedA = H_seed-A(HA ‖ seedB ‖ keyA ‖ pA), or with MoE (HR, HO) after HA."""
    parts = [_digest(hash_a, "HA")]
    if routing is not None:
        parts += [_digest(routing[0], "HR"), _digest(routing[1], "HO")]
    parts += [_digest(seed_b_, "seedB"), _digest(key_a_, "keyA"), bytes(p_a)]
    return hash_labelled(b"".join(parts), "seed-A")


def noise_line_key(seed: bytes) -> bytes:
    """Key of the noise-line XOF: Subkey("noise-line", seedX)."""
    return subkey("noise-line", _digest(seed, "seed"))


def jackpot_key(seed_a_: bytes) -> bytes:
    """pow_key = Subkey("jackpot", seedA): the key of every lottery ticket of a launch."""
    return subkey("jackpot", _digest(seed_a_, "seedA"))


def zk_public_digest(proposed_header: bytes, public_data: bytes) -> bytes:
    """The ZK statement digest H_zk-public(σ̂ ‖ public_data)."""
    return hash_labelled(bytes(proposed_header) + bytes(public_data), "zk-public")


def _digest(value: bytes, name: str) -> bytes:
    value = bytes(value)
    if len(value) != DIGEST_SIZE:
        raise ValueError(f"{name} must be {DIGEST_SIZE} bytes, got {len(value)}")
    return value
