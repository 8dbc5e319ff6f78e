"""Noise lines: the rank-32 e4m3 factors E and F (fp8-and-integration.md §6).

A line is addressed by (side, factor, line index) and drawn from the keyed-BLAKE3 XOF under
key = Subkey("noise-line", seed): the message is one 64-byte block, side u8 ‖ factor u8 ‖ line u32
LE ‖ 58 zero bytes, and the first r = 32 output bytes are the raw draw. Byte b decodes to
±((b & 0x7F) + 1) (sign = bit 7, never 0); the line is rescaled to an L2 norm ≈ 256 with
c = isqrt(Σx² · 32²), scale = RNE_bf16(bf16(8192) / bf16(c)), entry = e4m3(RNE_bf16(x · scale)).

E_A lines use seedA; E_B, F_A and F_B use seedB (F_A with the side byte of A).
"""
from __future__ import annotations

import blake3
import numpy as np

from .bf16 import bf16_div, bf16_mul, bf16_to_f32, f32_to_bf16
from .e4m3 import f32_to_e4m3
from .transcript import subkey

RANK = 32
NOISE_TARGET_NORM = 256
_INT_SQRT_PRECISION = 32
_SIDES = {"A": 0, "B": 1}
_FACTORS = {"E": 0, "F": 1}
_LINE_LIMIT = 1 << 32


def noise_line(seed: bytes, side: str, factor: str, line: int) -> bytes:
    """One noise line: 32 e4m3 bytes for (side "A"/"B", factor "E"/"F", line index) under seed."""
    return noise_lines(seed, side, factor, np.array([line], dtype=np.int64))[0].tobytes()


def noise_lines(seed: bytes, side: str, factor: str, lines: np.ndarray) -> np.ndarray:
    """Many noise lines at once: a (len(lines), 32) uint8 array of e4m3 codes."""
    key = _line_key(seed)
    indices = np.asarray(lines, dtype=np.int64).reshape(-1)
    if side not in _SIDES or factor not in _FACTORS:
        raise ValueError(f"side must be 'A' or 'B' and factor 'E' or 'F', got {side!r}, {factor!r}")
    if indices.size and (indices.min() < 0 or indices.max() >= _LINE_LIMIT):
        raise ValueError("noise line indices must lie in [0, 2^32)")
    prefix = bytes([_SIDES[side], _FACTORS[factor]])
    padding = bytes(58)
    raw = b"".join(
        blake3.blake3(prefix + int(i).to_bytes(4, "little") + padding, key=key).digest(length=RANK)
        for i in indices
    )
    return normalize_draws(np.frombuffer(raw, dtype=np.uint8).reshape(indices.size, RANK))


def _line_key(seed: bytes) -> bytes:
    if not isinstance(seed, (bytes, bytearray)) or len(seed) != 32:
        raise ValueError("the noise seed must be 32 bytes (seedA or seedB)")
    return subkey("noise-line", bytes(seed))


def normalize_draws(raw: np.ndarray) -> np.ndarray:
    """Raw XOF bytes (lines × r) → e4m3 noise lines with L2 norm ≈ 256 (bit-exact rule of §6)."""
    b = np.asarray(raw, dtype=np.uint8).astype(np.int64)
    samples = np.where(b & 0x80, -((b & 0x7F) + 1), (b & 0x7F) + 1)
    scaled_square = (samples * samples).sum(axis=1) * _INT_SQRT_PRECISION**2
    root = np.floor(np.sqrt(scaled_square.astype(np.float64))).astype(np.int64)
    root = np.where(root * root > scaled_square, root - 1, root)  # exact integer square root
    root = np.where((root + 1) * (root + 1) <= scaled_square, root + 1, root)
    numerator = f32_to_bf16(np.float32(NOISE_TARGET_NORM * _INT_SQRT_PRECISION))
    scale = bf16_div(numerator, f32_to_bf16(root.astype(np.float32)))
    entries = bf16_mul(f32_to_bf16(samples.astype(np.float32)), scale[:, None])
    return f32_to_e4m3(bf16_to_f32(entries))
