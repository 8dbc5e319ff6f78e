"""The INT seed chain on the device (int-protocol.md §3.3–3.5): V3 salting, the MoE routing fold,
s_B per job and s_A per launch, batched over instances, from roots that never leave the GPU.

Every step is one 64-byte BLAKE3 block (`blake3.hash_blocks`), so a launch derives its seeds with a
few tiny kernels and no host sync. proof.int7.seeds is the reference.
"""
from __future__ import annotations

import torch

from proof.int7.seeds import SEED_SALT_A, SEED_SALT_B

from .blake3 import KEYED_HASH, SINGLE_BLOCK, constant_words, hash_blocks, iv_words


class SeedError(ValueError):
    """Bad input to the device seed chain."""


def _check_words(name: str, words: torch.Tensor) -> None:
    if words.dtype != torch.int32 or words.dim() != 2 or words.shape[1] != 8:
        raise SeedError(f"{name} must be int32 (N, 8) hash words, got {words.dtype} {tuple(words.shape)}")


def hash_pair(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """Plain BLAKE3 of left ‖ right (32 + 32 bytes), row by row; a (1, 8) side broadcasts."""
    _check_words("left", left)
    _check_words("right", right)
    rows = max(left.shape[0], right.shape[0])
    message = torch.cat([left.expand(rows, 8), right.expand(rows, 8)], dim=1)
    return hash_blocks(iv_words(message.device), message, SINGLE_BLOCK)


def salted(roots: torch.Tensor, dim: int, salt: bytes) -> torch.Tensor:
    """V3 salting: keyed BLAKE3(salt, root ‖ u32le(dim) ‖ 28 zero bytes) for every root row."""
    _check_words("roots", roots)
    if not 0 <= dim < 1 << 32:
        raise SeedError(f"salted dimension {dim} does not fit in u32")
    tail = torch.zeros((roots.shape[0], 8), dtype=torch.int64, device=roots.device)
    tail[:, 0] = dim
    message = torch.cat([roots, tail.to(torch.int32)], dim=1)
    key = constant_words(salt, roots.device).view(1, 8)
    return hash_blocks(key, message, SINGLE_BLOCK | KEYED_HASH)


def noise_seed_b(job_key: torch.Tensor, hash_b: torch.Tensor, *, salted_seeds: bool,
                 n: int | None = None) -> torch.Tensor:
    """s_B = BLAKE3(job_key ‖ hB') per instance; hB' is H_B salted with n under cert V3."""
    if salted_seeds:
        if n is None:
            raise SeedError("salted seeds need n (the per-expert n for MoE)")
        hash_b = salted(hash_b, n, SEED_SALT_B)
    return hash_pair(job_key, hash_b)


def noise_seed_a(s_b: torch.Tensor, hash_a: torch.Tensor, *, salted_seeds: bool,
                 m: int | None = None, routing_hash: torch.Tensor | None = None,
                 offsets_hash: torch.Tensor | None = None) -> torch.Tensor:
    """s_A = BLAKE3(s_B ‖ hAct); hAct = hA' (dense) or BLAKE3(hA' ‖ BLAKE3(H_R ‖ H_O)) (MoE)."""
    if salted_seeds:
        if m is None:
            raise SeedError("salted seeds need m")
        hash_a = salted(hash_a, m, SEED_SALT_A)
    if (routing_hash is None) != (offsets_hash is None):
        raise SeedError("MoE seeds need both routing_hash and offsets_hash")
    if routing_hash is not None:
        hash_a = hash_pair(hash_a, hash_pair(routing_hash, offsets_hash))
    return hash_pair(s_b, hash_a)
