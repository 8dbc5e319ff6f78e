"""Noisy quantization to e4m3 with per-row scales (fp8-and-integration.md §7).

Per row, from the BF16 norms (l2, linf), floored at 2^-32 with a NaN-propagating max:
  nb = fma(delta_r, l2f, linf_f), α = bf16(448 / nb), β = bf16(bf16(α · l2f) · delta_over_std)
with delta_r = bf16(δ√r) and delta_over_std = bf16(δ√r / 256²) rounded once from f64.
Per element, with N the E@F dot of the element's two noise lines on the device's FP8 atom (one
K = 32 group from +0, fp32 rounded RNE to BF16):
  code = e4m3(clamp(fma(α, X, bf16(β · N)), ±448))
All scalar arithmetic is BF16 ("decode to f32, one op, RNE to BF16"; fma rounds once).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .bf16 import (
    bf16_clamp_symmetric,
    bf16_div,
    bf16_fma,
    bf16_max,
    bf16_mul,
    bf16_to_f32,
    f32_bits_to_f32,
    f32_to_bf16,
    f64_to_bf16,
)
from .devices import DeviceModel, device_model
from .e4m3 import f32_to_e4m3
from .mma import GROUP_K, fp8_matmul
from .noise import NOISE_TARGET_NORM, RANK

MAX_E4M3_BF16 = 0x43E0  # 448.0
NORM_FLOOR_BF16 = 0x2F80  # 2^-32


@dataclass(frozen=True)
class NoisyRows:
    """One side's noisy-quantized strip: e4m3 codes (rows × k) and the per-row α, β and floored l2."""

    codes: np.ndarray
    alpha: np.ndarray
    beta: np.ndarray
    l2f: np.ndarray


def scale_constants(device: str | int | DeviceModel, rank: int = RANK) -> tuple[int, int]:
    """(delta_r, delta_over_std) BF16 bits: bf16(δ√r) and bf16(δ√r / 256²), each rounded once."""
    if rank <= 0:
        raise ValueError(f"rank must be positive, got {rank}")
    delta_root_r = device_model(device).delta * math.sqrt(rank)
    delta_r = f64_to_bf16(np.float64(delta_root_r))
    delta_over_std = f64_to_bf16(np.float64(delta_root_r / NOISE_TARGET_NORM**2))
    return int(delta_r), int(delta_over_std)


def floor_norm(bits: np.ndarray) -> np.ndarray:
    """max(norm, 2^-32) with NaN propagation: what keeps α finite on an all-zero row."""
    return bf16_max(_bf16_bits(bits, "norm"), NORM_FLOOR_BF16)


def _bf16_bits(values, name: str) -> np.ndarray:
    array = np.asarray(values)
    if array.dtype.kind not in "ui" or (array.size and (array.min() < 0 or array.max() > 0xFFFF)):
        raise ValueError(f"{name} must be BF16 bit patterns (integers in [0, 0xFFFF])")
    return array.astype(np.uint16)


def _scales(model: DeviceModel, l2_bits, linf_bits, rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    delta_r, delta_over_std = scale_constants(model, rank)
    l2f = floor_norm(l2_bits)
    linf_f = floor_norm(linf_bits)
    bound = bf16_fma(np.uint16(delta_r), l2f, linf_f)
    alpha = bf16_div(np.uint16(MAX_E4M3_BF16), bound)
    beta = bf16_mul(bf16_mul(alpha, l2f), np.uint16(delta_over_std))
    return alpha, beta, l2f


def row_scales(device: str | int | DeviceModel, l2_bits: int, linf_bits: int, rank: int = RANK) -> tuple[int, int]:
    """Per-row (α, β) BF16 bits from the row's raw BF16 norms (floored inside)."""
    alpha, beta, _ = _scales(device_model(device), l2_bits, linf_bits, rank)
    return int(alpha), int(beta)


def noise_dot(device: str | int | DeviceModel, e_line: bytes, f_line: bytes) -> int:
    """E@F entry as fp32 bits: one K = 32 FP8 group from +0 on the device's MMA model."""
    e = np.frombuffer(bytes(e_line), dtype=np.uint8)
    f = np.frombuffer(bytes(f_line), dtype=np.uint8)
    if e.size != GROUP_K or f.size != GROUP_K:
        raise ValueError(f"noise lines must be {GROUP_K} e4m3 bytes each, got {e.size} and {f.size}")
    return int(fp8_matmul(device, e[None, :], f[None, :]).view(np.uint32)[0, 0])


def _noisy_codes(alpha: np.ndarray, beta: np.ndarray, x_bits: np.ndarray, noise_bf16: np.ndarray) -> np.ndarray:
    noised = bf16_fma(alpha, x_bits, bf16_mul(beta, noise_bf16))
    return f32_to_e4m3(bf16_to_f32(bf16_clamp_symmetric(noised, MAX_E4M3_BF16)))


def noisy_code(alpha_bits: int, beta_bits: int, x_bf16_bits: int, noise_fp32_bits: int) -> int:
    """One element's e4m3 code: e4m3(clamp(fma(α, X, bf16(β · bf16(N))), ±448))."""
    if not 0 <= noise_fp32_bits <= 0xFFFFFFFF:
        raise ValueError("noise_fp32_bits must be an fp32 bit pattern")
    noise_bf16 = f32_to_bf16(f32_bits_to_f32(np.uint32(noise_fp32_bits)))
    alpha, beta, x = (_bf16_bits(v, name) for v, name in ((alpha_bits, "alpha"), (beta_bits, "beta"), (x_bf16_bits, "x")))
    return int(_noisy_codes(alpha, beta, x, noise_bf16))


def noisy_quantize(
    device: str | int | DeviceModel,
    x_bits: np.ndarray,
    l2_bits: np.ndarray,
    linf_bits: np.ndarray,
    e_lines: np.ndarray,
    f_lines: np.ndarray,
) -> NoisyRows:
    """A whole row strip: x (rows × k BF16 bits), raw norms (rows), E lines (rows × 32), F lines (k × 32)."""
    model = device_model(device)
    x = _bf16_bits(x_bits, "x_bits")
    e = np.asarray(e_lines, dtype=np.uint8)
    f = np.asarray(f_lines, dtype=np.uint8)
    rows, k = x.shape if x.ndim == 2 else (None, None)
    if rows is None or e.shape != (rows, RANK) or f.shape != (k, RANK):
        raise ValueError(f"need x (rows × k), e_lines (rows × {RANK}), f_lines (k × {RANK}); got {x.shape}, {e.shape}, {f.shape}")
    if np.shape(l2_bits) != (rows,) or np.shape(linf_bits) != (rows,):
        raise ValueError(f"l2_bits and linf_bits must have one entry per row ({rows})")
    alpha, beta, l2f = _scales(model, l2_bits, linf_bits, RANK)
    noise_bf16 = f32_to_bf16(fp8_matmul(model, e, f))
    codes = _noisy_codes(alpha[:, None], beta[:, None], x, noise_bf16)
    return NoisyRows(codes=codes, alpha=alpha, beta=beta, l2f=l2f)
