"""Noise lines on the device (§6): keyed-BLAKE3 draws, exact isqrt normalisation, e4m3 entries.

A line is one 64-byte block side u8 ‖ factor u8 ‖ line u32 LE ‖ 58 zero bytes hashed under the
side's noise-line key (one keyed compression); the 32 digest bytes are the raw draw. Decoding
and the normalisation follow proof.fp8.noise.normalize_draws: samples ±((b & 0x7F) + 1),
c = isqrt(32² Σx²) (f64 estimate, then exact ±1 corrections), scale = bf16(8192 / bf16(c)),
entry = e4m3(bf16(x · scale)).
"""
from __future__ import annotations

import torch

from proof.fp8.noise import NOISE_TARGET_NORM

from .hashing import as_bytes, hash_short
from .numerics import bf16_div, bf16_mul

SIDES = {"A": 0, "B": 1}
FACTORS = {"E": 0, "F": 1}
_PRECISION = 32


class NoiseError(ValueError):
    """Bad input to the device noise lines."""


def line_messages(side: str, factor: str, lines: torch.Tensor) -> torch.Tensor:
    """The (N, 16) int32 XOF address blocks of the given line indices."""
    if side not in SIDES or factor not in FACTORS:
        raise NoiseError(f"side must be 'A'/'B' and factor 'E'/'F', got {side!r}, {factor!r}")
    index = lines.to(torch.int64).reshape(-1)
    words = torch.zeros((index.shape[0], 16), dtype=torch.int64, device=index.device)
    words[:, 0] = SIDES[side] | (FACTORS[factor] << 8) | ((index & 0xFFFF) << 16)
    words[:, 1] = (index >> 16) & 0xFFFF
    return words.to(torch.int32)


def noise_lines(key: torch.Tensor, side: str, factor: str, lines: torch.Tensor) -> torch.Tensor:
    """(N, 32) e4m3 noise lines for line indices `lines` under a side's noise-line key (1, 8)."""
    draws = hash_short(key, line_messages(side, factor, lines).view(torch.uint8))
    return normalize_draws(as_bytes(draws))


def normalize_draws(raw: torch.Tensor) -> torch.Tensor:
    """Raw draws (N, 32) uint8 → e4m3 lines with L2 norm ≈ 256."""
    b = raw.to(torch.int64)
    samples = torch.where((b & 0x80) != 0, -((b & 0x7F) + 1), (b & 0x7F) + 1)
    square = (samples * samples).sum(dim=1) * _PRECISION**2
    root = torch.sqrt(square.double()).floor().to(torch.int64)
    root = torch.where(root * root > square, root - 1, root)
    root = torch.where((root + 1) * (root + 1) <= square, root + 1, root)
    numerator = torch.full_like(root, NOISE_TARGET_NORM * _PRECISION, dtype=torch.bfloat16)
    scale = bf16_div(numerator, root.float().to(torch.bfloat16))
    entries = bf16_mul(samples.float().to(torch.bfloat16), scale[:, None])
    return entries.float().to(torch.float8_e4m3fn)

