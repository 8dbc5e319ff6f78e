"""The V4 transcript on the device (§3, §5): keys, operand digests, seeds, noise and jackpot keys.

Every value is a (1, 8) int32 tensor of digest words that never leaves the device; the fixed
label subkeys and the pA/pB parameter blocks are host constants. proof.fp8.transcript is the
reference. Plane roots come from int7's keyed 1024-byte-leaf chunk trees (HashId 3, the only leaf
size the official miner commits; other HashIds are rejected here).
"""
from __future__ import annotations

import torch

from kernels.int7.blake3 import keyed_trees
from proof.fp8.params import HashId
from proof.fp8.transcript import LABEL_PREFIX, subkey

from .hashing import HashError, as_bytes, constant_bytes, constant_words, hash_short

DEVICE_LEAF = HashId.CHUNK_1024


def _labelled(label: str, message: torch.Tensor) -> torch.Tensor:
    """H_label(message) with an unkeyed label subkey (a host constant)."""
    return hash_short(constant_words(subkey(label), message.device), message)


def _cat_bytes(*parts: torch.Tensor) -> torch.Tensor:
    return torch.cat([as_bytes(p) if p.dtype == torch.int32 else p for p in parts], dim=1)


def key_a(proposed_header: torch.Tensor) -> torch.Tensor:
    """keyA = H_key-A(σ̂) from the 76-byte header as a (1, 76) uint8 tensor."""
    _check_header(proposed_header, 76)
    return _labelled("key-A", proposed_header)


def key_b(ancestor_header: torch.Tensor) -> torch.Tensor:
    """keyB = H_key-B(σ_d) from the 108-byte ancestor header as a (1, 108) uint8 tensor."""
    _check_header(ancestor_header, 108)
    return _labelled("key-B", ancestor_header)


def _check_header(header: torch.Tensor, size: int) -> None:
    if header.dtype != torch.uint8 or tuple(header.shape) != (1, size):
        raise HashError(f"the header must be a (1, {size}) uint8 tensor, got {header.dtype} {tuple(header.shape)}")


def check_hash_id(hash_id: HashId) -> None:
    """The device trees use 1024-byte leaves only."""
    if HashId(hash_id) != DEVICE_LEAF:
        raise HashError(f"device trees use 1024-byte leaves (HashId 3), not {HashId(hash_id).name}")


def tree_root(key: torch.Tensor, data: torch.Tensor) -> torch.Tensor:
    """Keyed chunk-tree root of a tensor's bytes (row-major, zero-padded to 1024-byte leaves)."""
    flat = data.contiguous().view(torch.uint8).view(1, -1)
    return keyed_trees(key, flat).roots


def operand_digest(key: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """HX = BLAKE3(root(codes) ‖ root(scales); key = keyX): one keyed single-block compression."""
    return hash_short(key, _cat_bytes(tree_root(key, codes), tree_root(key, scales)))


def seed_b(hash_b: torch.Tensor, key_b_: torch.Tensor, p_b: bytes) -> torch.Tensor:
    """seedB = H_seed-B(HB ‖ keyB ‖ pB)."""
    return _labelled("seed-B", _cat_bytes(hash_b, key_b_, constant_bytes(p_b, hash_b.device)))


def seed_a(hash_a: torch.Tensor, seed_b_: torch.Tensor, key_a_: torch.Tensor, p_a: bytes,
           routing: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """seedA = H_seed-A(HA [‖ HR ‖ HO] ‖ seedB ‖ keyA ‖ pA)."""
    parts = [hash_a, *(routing or ()), seed_b_, key_a_, constant_bytes(p_a, hash_a.device)]
    return _labelled("seed-A", _cat_bytes(*parts))


def _child_key(label: str, parent: torch.Tensor) -> torch.Tensor:
    """Subkey(label, parent) = BLAKE3(full label; key = parent)."""
    return hash_short(parent, constant_bytes(LABEL_PREFIX + label.encode("ascii"), parent.device))


def noise_key(seed: torch.Tensor) -> torch.Tensor:
    """Subkey("noise-line", seed): the key of a side's noise-line XOF."""
    return _child_key("noise-line", seed)


def jackpot_key(seed_a_: torch.Tensor) -> torch.Tensor:
    """pow_key = Subkey("jackpot", seedA): keys every lottery ticket of the launch."""
    return _child_key("jackpot", seed_a_)
