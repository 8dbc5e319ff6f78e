"""Noise factors and noised operands on the device, bit-exact with proof.int7.noise (§4).

The PRNG block G(index, label, key, slot) is one keyed BLAKE3 compression of (eight i32 slots with
slot `slot` = index + 1) ‖ label; a Triton kernel computes one block per lane. The uniform factor
U (rows × rank, [−32, 31]) takes byte f of the flat row-major stream from block f // 32; the sparse
±1 factor P (k × rank) is stored as two index vectors (first, second). Applying them is torch:
X' = X + U[:, first] − U[:, second] row by row, the same rule for A (rows = tokens) and for Bᵀ
(rows = output columns).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from proof.int7.noise import LABEL_A, LABEL_B

from ._jit import jit
from .blake3 import compress, constant_words, load_words8

_LANES = 64
_SINGLE_BLOCK_KEYED = tl.constexpr(1 | 2 | 8 | 16)  # a global read inside a kernel must be constexpr
LIMB_BITS = 8


class NoiseError(ValueError):
    """Bad input to the device noise functions."""


@jit
def _prng_kernel(key_ptr, label_ptr, out_ptr, second_ptr, blocks, total, limit, rank,
                 SPARSE: tl.constexpr, LANES: tl.constexpr):
    """Uniform (SPARSE=0): 32 factor bytes per block. Sparse (SPARSE=1): 8 (first, second) pairs."""
    lane = tl.program_id(0) * LANES + tl.arange(0, LANES)
    live = lane < total
    inst = (lane // blocks).to(tl.int64)
    block = (lane % blocks).to(tl.int64)
    k0, k1, k2, k3, k4, k5, k6, k7 = load_words8(key_ptr + inst * 8, live)
    l0, l1, l2, l3, l4, l5, l6, l7 = load_words8(label_ptr + tl.full(lane.shape, 0, tl.int64), live)
    zero = tl.full(lane.shape, 0, tl.uint32)
    index = (block + 1).to(tl.uint32)
    if SPARSE:
        s0 = zero
        s1 = index
    else:
        s0 = index
        s1 = zero
    w0, w1, w2, w3, w4, w5, w6, w7 = compress(
        k0, k1, k2, k3, k4, k5, k6, k7,
        s0, s1, zero, zero, zero, zero, zero, zero, l0, l1, l2, l3, l4, l5, l6, l7,
        zero, zero + _SINGLE_BLOCK_KEYED)
    words = (w0, w1, w2, w3, w4, w5, w6, w7)
    if SPARSE:
        mask = zero + (rank - 1)
        for j in tl.static_range(8):
            u = words[j]
            first = u & mask
            spread = ((tl.full(lane.shape, 0, tl.uint64) + (rank - 1)) * u.to(tl.uint64)) >> 32
            second = first ^ (1 + spread.to(tl.uint32))
            pos = block * 8 + j
            ok = live & (pos < limit)
            tl.store(out_ptr + inst * limit + pos, first.to(tl.int32), mask=ok)
            tl.store(second_ptr + inst * limit + pos, second.to(tl.int32), mask=ok)
    else:
        for j in tl.static_range(8):
            for byte in tl.static_range(4):
                value = ((words[j] >> (8 * byte)) & 0x3F).to(tl.int32) - 32
                pos = block * 32 + 4 * j + byte
                tl.store(out_ptr + inst * limit + pos, value.to(tl.int8), mask=live & (pos < limit))


def _check_keys(keys: torch.Tensor) -> None:
    if keys.dtype != torch.int32 or keys.dim() != 2 or keys.shape[1] != 8:
        raise NoiseError(f"keys must be int32 (instances, 8), got {keys.dtype} {tuple(keys.shape)}")


def _check_rank(rank: int) -> None:
    if rank < 32 or rank & (rank - 1):
        raise NoiseError(f"noise rank must be a power of two >= 32, got {rank}")


def uniform_factor(keys: torch.Tensor, label: bytes, rows: int, rank: int) -> torch.Tensor:
    """U for rows 0..rows−1 of every instance: (instances, rows, rank) int8 in [−32, 31]."""
    _check_keys(keys)
    _check_rank(rank)
    instances = keys.shape[0]
    blocks = rows * rank // 32
    out = torch.empty((instances, rows, rank), dtype=torch.int8, device=keys.device)
    total = instances * blocks
    _prng_kernel[(triton.cdiv(total, _LANES),)](keys.contiguous(), constant_words(label, keys.device),
                                                 out, out, blocks, total, rows * rank, rank,
                                                 SPARSE=0, LANES=_LANES)
    return out


def sparse_factor(keys: torch.Tensor, label: bytes, k: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """P as (first, second), each (instances, k) int64: row l has +1 at first, −1 at second."""
    _check_keys(keys)
    _check_rank(rank)
    instances = keys.shape[0]
    blocks = triton.cdiv(k, 8)
    first = torch.empty((instances, k), dtype=torch.int32, device=keys.device)
    second = torch.empty_like(first)
    total = instances * blocks
    _prng_kernel[(triton.cdiv(total, _LANES),)](keys.contiguous(), constant_words(label, keys.device),
                                                 first, second, blocks, total, k, rank,
                                                 SPARSE=1, LANES=_LANES)
    return first.long(), second.long()


def noised(x: torch.Tensor, uniform: torch.Tensor, first: torch.Tensor,
           second: torch.Tensor) -> torch.Tensor:
    """X' = X + U·Pᵀ: x (I, rows, k) int8 in [−64, 64], uniform (I, rows, r), first/second (I, k)."""
    if x.dim() != 3 or uniform.shape[:2] != x.shape[:2] or first.shape != (x.shape[0], x.shape[2]):
        raise NoiseError(f"noised: shapes x {tuple(x.shape)}, uniform {tuple(uniform.shape)}, "
                         f"first {tuple(first.shape)} do not agree")
    rows = x.shape[1]
    plus = torch.gather(uniform, 2, first.unsqueeze(1).expand(-1, rows, -1))
    minus = torch.gather(uniform, 2, second.unsqueeze(1).expand(-1, rows, -1))
    return (x.to(torch.int16) + plus.to(torch.int16) - minus.to(torch.int16)).to(torch.int8)


def sparse_product(x: torch.Tensor, first: torch.Tensor, second: torch.Tensor, rank: int) -> torch.Tensor:
    """X·P (I, rows, rank) int32: column t sums X[:, l] over first[l] = t minus over second[l] = t."""
    rows = x.shape[1]
    values = x.to(torch.int32)
    out = torch.zeros((x.shape[0], rows, rank), dtype=torch.int32, device=x.device)
    out.scatter_add_(2, first.unsqueeze(1).expand(-1, rows, -1), values)
    out.scatter_add_(2, second.unsqueeze(1).expand(-1, rows, -1), -values)
    return out


def int8_limbs(x: torch.Tensor, count: int = 3) -> torch.Tensor:
    """Signed base-256 limbs of int32 x: (count, *x.shape) int8 with x = Σ limb_i·256^i.

    Exact while |x| ≤ 127·(256^count − 1)/255 (8,355,711 for three limbs; |A·P_B| ≤ 64·k is far
    below); used to run exact int32 × int8 products on int8 MMAs.
    """
    limbs = []
    rest = x.to(torch.int32)
    for _ in range(count):
        low = ((rest + 128) & 0xFF) - 128
        limbs.append(low.to(torch.int8))
        rest = (rest - low) >> LIMB_BITS
    return torch.stack(limbs)
