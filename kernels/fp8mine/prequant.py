"""Block-scaled int8 pre-quantization and the exact row norms on the device (§4).

Same rules as proof.fp8.prequant, as torch tensor code without host syncs:
- planes: per block of 8 along k, s = bf16(max(amax, 2^-100) · f32(1/127)), q = RNE(x · (1/s))
  clamped to ±127; the opened value is RNE_bf16(q · s);
- linf = RNE_bf16(max |q|·|s|);
- l2 = grid4(RNE_bf16(√v)), v = S · 2^(E_MAX − 268 − Wl2) / k in the exact integer frame. The
  square root is correctly rounded without big integers: an f64 estimate gives a candidate code
  that is off by at most one, and exact int64 comparisons against the two neighbouring midpoints
  (with shifted remainders, so nothing overflows) decide the RNE result.
"""
from __future__ import annotations

import numpy as np
import torch

from proof.fp8.prequant import BLOCK_SIZE, CODE_MAX, l2_frame_width

from .numerics import bits16, from_bits16

_RECIP_127 = float(np.float32(1) / np.float32(CODE_MAX))
_AMAX_FLOOR = 2.0**-100
_FRAME_EXPONENT = 268  # the 2^-134 of a scale's frame, squared


class PrequantError(ValueError):
    """Bad input to the device pre-quantization."""


def prequantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, k) activations or weights → (int8 codes (rows, k), bf16 scales (rows, k/8))."""
    if x.dim() != 2 or x.shape[1] % BLOCK_SIZE or x.shape[1] == 0:
        raise PrequantError(f"x must be (rows, k) with k a positive multiple of {BLOCK_SIZE}, "
                            f"got {tuple(x.shape)}")
    blocks = x.float().reshape(x.shape[0], -1, BLOCK_SIZE)
    amax = blocks.abs().amax(dim=-1).clamp_min(_AMAX_FLOOR)
    scales = (amax * _RECIP_127).to(torch.bfloat16)  # the f32 constant converts exactly
    reciprocal = 1.0 / scales.float()
    codes = torch.round(blocks * reciprocal[..., None]).clamp(-CODE_MAX, CODE_MAX)
    return codes.to(torch.int8).reshape(x.shape), scales


def _check_planes(codes: torch.Tensor, scales: torch.Tensor) -> None:
    if codes.dtype != torch.int8 or codes.dim() != 2 or codes.shape[1] % BLOCK_SIZE:
        raise PrequantError(f"codes must be int8 (rows, k), k % 8 == 0, got {codes.dtype} {tuple(codes.shape)}")
    if scales.dtype != torch.bfloat16 or scales.shape != (codes.shape[0], codes.shape[1] // BLOCK_SIZE):
        raise PrequantError(f"scales must be bf16 (rows, k/8) for codes {tuple(codes.shape)}, "
                            f"got {scales.dtype} {tuple(scales.shape)}")


def open_values(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The opened operand RNE_bf16(q · s), (rows, k) bf16."""
    _check_planes(codes, scales)
    blocks = codes.reshape(codes.shape[0], -1, BLOCK_SIZE).float() * scales.float()[..., None]
    return blocks.reshape(codes.shape).to(torch.bfloat16)


def row_norms(codes: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (l2, linf) as bf16 tensors, bit-identical to proof.fp8.prequant.row_norms."""
    _check_planes(codes, scales)
    rows, k = codes.shape
    wl2 = l2_frame_width(k)
    q = codes.reshape(rows, -1, BLOCK_SIZE).to(torch.int64)
    magnitude = bits16(scales) & 0x7FFF
    exp_field = magnitude >> 7
    mantissa = (magnitude & 0x7F) + torch.where(exp_field != 0, 128, 0)
    doubled_exp = 2 * exp_field.clamp_min(1)
    energy = mantissa * mantissa * (q * q).sum(dim=-1)  # < 2^33
    e_max = torch.where(energy != 0, doubled_exp, torch.zeros_like(doubled_exp)).amax(dim=-1)
    shift = (e_max[:, None] - doubled_exp).clamp(0, 63)
    frame_sum = ((energy << wl2) >> shift).sum(dim=-1)  # < 2^61
    root = _rne_sqrt_bf16(frame_sum, e_max - _FRAME_EXPONENT - wl2, k)
    l2 = torch.where(frame_sum != 0, (root + 2) & ~3, torch.zeros_like(root))

    peak = q.abs().amax(dim=-1).float() * from_bits16(magnitude).float()
    linf = peak.amax(dim=-1).to(torch.bfloat16)
    return from_bits16(l2), linf


def _compare_scaled(a: torch.Tensor, a_exp: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """sign(a · 2^a_exp − b) exactly, for int64 a, b in [0, 2^62) (−1, 0 or +1)."""
    up = a_exp >= 0
    shift = a_exp.abs().clamp(max=63)
    # a_exp >= 0: compare a with b / 2^shift; else compare a / 2^shift with b.
    big = torch.where(up, b, a)
    small = torch.where(up, a, b)
    quotient = big >> shift
    remainder = big - (quotient << shift)
    order = torch.sign(small - quotient)  # small vs floor(big / 2^shift)
    tie = torch.where(remainder != 0, -1, 0)  # small == floor: the remainder tips it
    small_vs_big = torch.where(order != 0, order, tie)
    return torch.where(up, small_vs_big, -small_vs_big)


def _code_value(code: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A positive bf16 code as (significand, exponent): value = sig · 2^exp."""
    exp_field = code >> 7
    significand = (code & 0x7F) + torch.where(exp_field != 0, 128, 0)
    return significand, exp_field.clamp_min(1) - 134


def _sqrt_vs_midpoint(num: torch.Tensor, exponent: torch.Tensor, k: int, code: torch.Tensor) -> torch.Tensor:
    """sign(√(num · 2^exponent / k) − midpoint(code, code + 1)), exactly."""
    sig_lo, exp_lo = _code_value(code)
    sig_hi, exp_hi = _code_value(code + 1)
    doubled_mid = sig_lo + (sig_hi << (exp_hi - exp_lo))  # midpoint = doubled_mid · 2^(exp_lo − 1)
    # √v vs mid ⇔ num · 2^exponent vs k · doubled_mid² · 2^(2·exp_lo − 2)
    return _compare_scaled(num, exponent - 2 * exp_lo + 2, k * doubled_mid * doubled_mid)


def _rne_sqrt_bf16(num: torch.Tensor, exponent: torch.Tensor, k: int) -> torch.Tensor:
    """RNE_bf16(√(num · 2^exponent / k)) as int64 codes (num ≥ 0; callers mask num == 0)."""
    estimate = torch.sqrt(torch.ldexp(num.double(), exponent.double()) / k)
    candidate = bits16(estimate.float().to(torch.bfloat16))  # within one code of the answer
    lower = (candidate - 1).clamp_min(0)
    below = _sqrt_vs_midpoint(num, exponent, k, lower)
    above = _sqrt_vs_midpoint(num, exponent, k, candidate)
    go_down = (candidate > 0) & ((below < 0) | ((below == 0) & (lower % 2 == 0)))
    go_up = (above > 0) | ((above == 0) & (candidate % 2 == 1))
    return torch.where(go_down, lower, torch.where(go_up, candidate + 1, candidate))
