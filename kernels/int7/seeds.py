"""The INT seed chain on the device (int-protocol.md §3.3–3.5): V3 salting, the MoE routing fold,
s_B per job and s_A per launch, batched over instances, from roots that never leave the GPU.

One kernel, one lane per instance, runs the whole chain for a side (2–4 one-block BLAKE3
compressions), so a launch derives its seeds without host syncs and in a single launch:
    s_B = BLAKE3(job_key ‖ hB'),   hB' = keyed(SALT_B, H_B ‖ u32le(n) ‖ 0²⁸) under V3, else H_B;
    s_A = BLAKE3(s_B ‖ hAct),      hAct = hA' (dense) or BLAKE3(hA' ‖ BLAKE3(H_R ‖ H_O)) (MoE).
proof.int7.seeds is the reference.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from proof.int7.seeds import SEED_SALT_A, SEED_SALT_B

from kernels.triton_jit import jit
from .blake3 import compress, constant_words, load_words8, store_words8

_LANES = 32


class SeedError(ValueError):
    """Bad input to the device seed chain."""


@jit
def _hash64(k0, k1, k2, k3, k4, k5, k6, k7, a0, a1, a2, a3, a4, a5, a6, a7,
            b0, b1, b2, b3, b4, b5, b6, b7, flags):
    """One-block BLAKE3 of the 64 bytes a ‖ b with chaining value k (flags say keyed or plain)."""
    zero = a0 & 0
    return compress(k0, k1, k2, k3, k4, k5, k6, k7, a0, a1, a2, a3, a4, a5, a6, a7,
                    b0, b1, b2, b3, b4, b5, b6, b7, zero, zero + flags)


@jit
def _iv(zero):
    return (tl.full(zero.shape, 0x6A09E667, tl.uint32), tl.full(zero.shape, 0xBB67AE85, tl.uint32),
            tl.full(zero.shape, 0x3C6EF372, tl.uint32), tl.full(zero.shape, 0xA54FF53A, tl.uint32),
            tl.full(zero.shape, 0x510E527F, tl.uint32), tl.full(zero.shape, 0x9B05688C, tl.uint32),
            tl.full(zero.shape, 0x1F83D9AB, tl.uint32), tl.full(zero.shape, 0x5BE0CD19, tl.uint32))


@jit
def seed_chain(p0, p1, p2, p3, p4, p5, p6, p7, h0, h1, h2, h3, h4, h5, h6, h7, salt_ptr, dim,
               routing_ptr, offsets_ptr, SALTED: tl.constexpr, FOLD: tl.constexpr):
    """The seed of one side from its parent (job key or s_B) p and its root h: salting with
    (salt, dim) under V3, the MoE routing fold, then BLAKE3(p ‖ h'). Shared by the seed kernel and
    the fused decode A side."""
    zero = h0 & 0
    every = zero == 0
    i0, i1, i2, i3, i4, i5, i6, i7 = _iv(zero)
    if SALTED:
        s0, s1, s2, s3, s4, s5, s6, s7 = load_words8(salt_ptr + zero.to(tl.int64), every)
        h0, h1, h2, h3, h4, h5, h6, h7 = _hash64(
            s0, s1, s2, s3, s4, s5, s6, s7, h0, h1, h2, h3, h4, h5, h6, h7,
            zero + dim, zero, zero, zero, zero, zero, zero, zero, 27)  # keyed single block
    if FOLD:
        r0, r1, r2, r3, r4, r5, r6, r7 = load_words8(routing_ptr + zero.to(tl.int64), every)
        o0, o1, o2, o3, o4, o5, o6, o7 = load_words8(offsets_ptr + zero.to(tl.int64), every)
        f0, f1, f2, f3, f4, f5, f6, f7 = _hash64(
            i0, i1, i2, i3, i4, i5, i6, i7, r0, r1, r2, r3, r4, r5, r6, r7,
            o0, o1, o2, o3, o4, o5, o6, o7, 11)  # plain single block
        h0, h1, h2, h3, h4, h5, h6, h7 = _hash64(
            i0, i1, i2, i3, i4, i5, i6, i7, h0, h1, h2, h3, h4, h5, h6, h7,
            f0, f1, f2, f3, f4, f5, f6, f7, 11)
    return _hash64(i0, i1, i2, i3, i4, i5, i6, i7, p0, p1, p2, p3, p4, p5, p6, p7,
                   h0, h1, h2, h3, h4, h5, h6, h7, 11)


@jit
def _seed_kernel(parent_ptr, parent_stride, root_ptr, salt_ptr, dim, routing_ptr, offsets_ptr,
                 out_ptr, total, SALTED: tl.constexpr, FOLD: tl.constexpr, LANES: tl.constexpr):
    lane = tl.program_id(0) * LANES + tl.arange(0, LANES)
    live = lane < total
    row = lane.to(tl.int64)
    h0, h1, h2, h3, h4, h5, h6, h7 = load_words8(root_ptr + row * 8, live)
    p0, p1, p2, p3, p4, p5, p6, p7 = load_words8(parent_ptr + row * parent_stride, live)
    c0, c1, c2, c3, c4, c5, c6, c7 = seed_chain(
        p0, p1, p2, p3, p4, p5, p6, p7, h0, h1, h2, h3, h4, h5, h6, h7, salt_ptr, dim,
        routing_ptr, offsets_ptr, SALTED, FOLD)
    store_words8(out_ptr + row * 8, c0, c1, c2, c3, c4, c5, c6, c7, live)


def _check_words(name: str, words: torch.Tensor) -> None:
    if words.dtype != torch.int32 or words.dim() != 2 or words.shape[1] != 8:
        raise SeedError(f"{name} must be int32 (N, 8) hash words, got {words.dtype} {tuple(words.shape)}")


def _chain(parent: torch.Tensor, roots: torch.Tensor, salt: bytes, dim: int | None, salted: bool,
           routing_hash: torch.Tensor | None = None, offsets_hash: torch.Tensor | None = None) -> torch.Tensor:
    _check_words("parent seed", parent)
    _check_words("roots", roots)
    total = roots.shape[0]
    if parent.shape[0] not in (1, total):
        raise SeedError(f"parent seed has {parent.shape[0]} rows for {total} roots")
    if salted and (dim is None or not 0 <= dim < 1 << 32):
        raise SeedError(f"salted seeds need the dimension as a u32, got {dim}")
    fold = routing_hash is not None
    if fold:
        _check_words("routing_hash", routing_hash)
        _check_words("offsets_hash", offsets_hash)
    out = torch.empty((total, 8), dtype=torch.int32, device=roots.device)
    salt_words = constant_words(salt, roots.device)
    _seed_kernel[(triton.cdiv(total, _LANES),)](
        parent.contiguous(), 0 if parent.shape[0] == 1 else 8, roots.contiguous(), salt_words,
        dim if salted else 0, (routing_hash if fold else roots).contiguous(),
        (offsets_hash if fold else roots).contiguous(), out,
        total, SALTED=int(salted), FOLD=int(fold), LANES=_LANES)
    return out


def noise_seed_b(job_key: torch.Tensor, hash_b: torch.Tensor, *, salted_seeds: bool,
                 n: int | None = None) -> torch.Tensor:
    """s_B per instance from the job key (1, 8) and the weight roots H_B (N, 8); n per expert."""
    return _chain(job_key, hash_b, SEED_SALT_B, n, salted_seeds)


def noise_seed_a(s_b: torch.Tensor, hash_a: torch.Tensor, *, salted_seeds: bool,
                 m: int | None = None, routing_hash: torch.Tensor | None = None,
                 offsets_hash: torch.Tensor | None = None) -> torch.Tensor:
    """s_A per instance from s_B (N or 1, 8) and the activation roots H_A (N, 8); MoE passes the
    routing and offsets roots (1, 8) to fold in after salting."""
    if (routing_hash is None) != (offsets_hash is None):
        raise SeedError("MoE seeds need both routing_hash and offsets_hash")
    return _chain(s_b, hash_a, SEED_SALT_A, m, salted_seeds, routing_hash, offsets_hash)
