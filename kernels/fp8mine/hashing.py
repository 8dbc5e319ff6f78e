"""Keyed BLAKE3 pieces the FP8 transcript needs on the device, on top of kernels.int7.blake3.

kernels.int7.blake3 provides the compression rounds and the 1024-byte-leaf chunk trees. The V4
transcript also hashes short messages, often with a partial last block (labels of 20–23 bytes,
headers of 76/108 bytes, seed messages of 85/107/173 bytes, 64-byte digests and noise-line
addresses), which needs the compression's block-length word. `hash_short` adds that (one chunk,
up to 16 blocks), through int7's compression with an explicit block length.
"""
from __future__ import annotations

import functools

import numpy as np
import torch
import triton
import triton.language as tl

from kernels.triton_jit import jit
from kernels.int7.blake3 import IV, compress_block, load_words8, store_words8, words_from_bytes

MAX_SHORT_BYTES = 1024
_LANES = 64


class HashError(ValueError):
    """Bad input to the device hashing helpers."""


@jit
def _short_kernel(key_ptr, key_stride, msg_ptr, out_ptr, total, nbytes, blocks, keyed, LANES: tl.constexpr):
    """out[i] = BLAKE3 of msg[i] (nbytes ≤ 64·blocks, zero-padded words) under key[i] or the IV.

    The block loop is dynamic so one compiled kernel serves every message length (an unrolled
    compression is slow to compile)."""
    lane = tl.program_id(0) * LANES + tl.arange(0, LANES)
    live = lane < total
    row = lane.to(tl.int64)
    c0, c1, c2, c3, c4, c5, c6, c7 = load_words8(key_ptr + row * key_stride, live)
    base = msg_ptr + row * (16 * blocks)
    keyed_flag = tl.where(keyed != 0, 16, 0).to(tl.uint32)
    for block in range(blocks):
        m0, m1, m2, m3, m4, m5, m6, m7 = load_words8(base + block * 16, live)
        m8, m9, m10, m11, m12, m13, m14, m15 = load_words8(base + block * 16 + 8, live)
        last = block == blocks - 1
        flags = keyed_flag | tl.where(block == 0, 1, 0).to(tl.uint32) | tl.where(last, 2 | 8, 0).to(tl.uint32)
        block_len = tl.where(last, nbytes - 64 * (blocks - 1), 64).to(tl.uint32)
        c0, c1, c2, c3, c4, c5, c6, c7 = compress_block(
            c0, c1, c2, c3, c4, c5, c6, c7,
            m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15,
            0, block_len, flags)
    store_words8(out_ptr + row * 8, c0, c1, c2, c3, c4, c5, c6, c7, live)


def hash_short(keys: torch.Tensor | None, message: torch.Tensor) -> torch.Tensor:
    """BLAKE3 (keyed when `keys` is given) of each row of `message`, a (N, nbytes) uint8 tensor.

    keys: (N or 1, 8) int32 key words, or None for unkeyed hashing. nbytes in [1, 1024] (one
    chunk). Returns (N, 8) int32: the 32-byte digests as little-endian words.
    """
    if message.dtype != torch.uint8 or message.dim() != 2:
        raise HashError(f"message must be a (N, nbytes) uint8 tensor, got {message.dtype} {tuple(message.shape)}")
    rows, nbytes = message.shape
    if not 1 <= nbytes <= MAX_SHORT_BYTES:
        raise HashError(f"short messages hold 1..{MAX_SHORT_BYTES} bytes, got {nbytes}")
    blocks = -(-nbytes // 64)
    padded = torch.zeros((rows, blocks * 64), dtype=torch.uint8, device=message.device)
    padded[:, :nbytes] = message
    key_words = constant_words(np.array(IV, dtype="<u4").tobytes(), message.device) if keys is None else keys
    if key_words.dtype != torch.int32 or key_words.dim() != 2 or key_words.shape[1] != 8 \
            or key_words.shape[0] not in (1, rows):
        raise HashError(f"keys must be int32 (N or 1, 8), got {key_words.dtype} {tuple(key_words.shape)}")
    out = torch.empty((rows, 8), dtype=torch.int32, device=message.device)
    _short_kernel[(triton.cdiv(rows, _LANES),)](
        key_words.contiguous(), 0 if key_words.shape[0] == 1 else 8, padded.view(torch.int32), out,
        rows, nbytes, blocks, int(keys is not None), LANES=_LANES)
    return out


def as_bytes(words: torch.Tensor) -> torch.Tensor:
    """(N, 8) int32 digest words → (N, 32) uint8 (little-endian), on the same device."""
    return words.contiguous().view(torch.uint8)


@functools.lru_cache(maxsize=256)
def constant_bytes(data: bytes, device: torch.device | str) -> torch.Tensor:
    """A host constant (a label, pA) as a (1, len) uint8 device tensor.

    Cached per (bytes, device): the first call uploads it, later calls (inside a CUDA-graph
    capture too, where host-to-device copies are not allowed) reuse it. Never mutate the result.
    """
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device).view(1, -1)


@functools.lru_cache(maxsize=256)
def constant_words(digest: bytes, device: torch.device | str) -> torch.Tensor:
    """A 32-byte host constant (a fixed subkey) as cached (1, 8) int32 key words."""
    if len(digest) != 32:
        raise HashError(f"a key is 32 bytes, got {len(digest)}")
    return words_from_bytes(digest, device).view(1, 8)

