"""Noise lines on the device (§6), one Triton kernel: keyed-BLAKE3 draw, exact isqrt, e4m3.

A line is one 64-byte block side u8 ‖ factor u8 ‖ line u32 LE ‖ 58 zero bytes hashed under the
side's noise-line key (one keyed compression, flags CHUNK_START|CHUNK_END|ROOT|KEYED); its 32
digest bytes are the raw draw. As proof.fp8.noise.normalize_draws: samples ±((b & 0x7F) + 1),
c = isqrt(32² Σx²) (f64 estimate, then exact ±1 integer corrections), scale = bf16(8192 / bf16(c))
(correctly rounded f32 division), entry = e4m3(bf16(x · scale)); entries never exceed 256.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_jit import jit
from kernels.int7.blake3 import compress_block, load_words8
from proof.fp8.noise import NOISE_TARGET_NORM

from .noisy_kernel import _e4m3_code, _rne_bf16

SIDES = {"A": 0, "B": 1}
FACTORS = {"E": 0, "F": 1}
_LANES = 32


class NoiseError(ValueError):
    """Bad input to the device noise lines."""


@jit
def _pick_word(j, w0, w1, w2, w3, w4, w5, w6, w7):
    """word j // 4 of the digest for every (line, byte j) cell."""
    word = j // 4
    out = tl.where(word == 0, w0[:, None], w1[:, None])
    out = tl.where(word == 2, w2[:, None], out)
    out = tl.where(word == 3, w3[:, None], out)
    out = tl.where(word == 4, w4[:, None], out)
    out = tl.where(word == 5, w5[:, None], out)
    out = tl.where(word == 6, w6[:, None], out)
    return tl.where(word == 7, w7[:, None], out)


@jit
def noise_codes(k0, k1, k2, k3, k4, k5, k6, k7, line, address, target, LANES: tl.constexpr):
    """e4m3 codes (LANES, 32) int32 of the lines `line` (int64 lanes) under the key words (lane
    tensors). Shared by the noise kernel and the fused launch-keys kernel (transcript.py)."""
    zero = tl.full((LANES,), 0, tl.uint32)
    m0 = (address + ((line & 0xFFFF) << 16)).to(tl.uint32)
    m1 = ((line >> 16) & 0xFFFF).to(tl.uint32)
    w0, w1, w2, w3, w4, w5, w6, w7 = compress_block(
        k0, k1, k2, k3, k4, k5, k6, k7,
        m0, m1, zero, zero, zero, zero, zero, zero, zero, zero, zero, zero, zero, zero, zero, zero,
        0, 64, 27)
    j = tl.arange(0, 32)[None, :]
    raw = ((_pick_word(j, w0, w1, w2, w3, w4, w5, w6, w7) >> (8 * (j % 4)).to(tl.uint32)) & 0xFF).to(tl.int32)
    magnitude = (raw & 0x7F) + 1
    sample = tl.where((raw & 0x80) != 0, -magnitude, magnitude)
    square = (tl.reduce(sample * sample, 1, tl.standard._sum_combine) * 1024).to(tl.int64)
    root = tl.sqrt(square.to(tl.float64)).to(tl.int64)
    root = tl.where(root * root > square, root - 1, root)
    root = tl.where((root + 1) * (root + 1) <= square, root + 1, root)
    root_bf16 = _rne_bf16(root.to(tl.float32).to(tl.int32, bitcast=True)).to(tl.float32, bitcast=True)
    scale = _rne_bf16(tl.math.div_rn(tl.full((LANES,), 0.0, tl.float32) + target, root_bf16).to(tl.int32, bitcast=True))
    entry = _rne_bf16((sample.to(tl.float32) * scale.to(tl.float32, bitcast=True)[:, None]).to(tl.int32, bitcast=True))
    return _e4m3_code(entry)


@jit
def _noise_kernel(key_ptr, lines_ptr, out_ptr, count, address, target, LANES: tl.constexpr,
                  FIRST_LINES: tl.constexpr):
    lane = tl.program_id(0) * LANES + tl.arange(0, LANES)
    live = lane < count
    if FIRST_LINES:  # lines 0 .. count − 1: no index tensor
        line = lane.to(tl.int64)
    else:
        line = tl.load(lines_ptr + lane, mask=live, other=0)
    k0, k1, k2, k3, k4, k5, k6, k7 = load_words8(key_ptr + lane * 0, live)
    code = noise_codes(k0, k1, k2, k3, k4, k5, k6, k7, line, address, target, LANES)
    tl.store(out_ptr + lane.to(tl.int64)[:, None] * 32 + tl.arange(0, 32)[None, :], code.to(tl.uint8),
             mask=live[:, None])


def address(side: str, factor: str) -> int:
    """The first message word's side/factor bytes of a noise line."""
    if side not in SIDES or factor not in FACTORS:
        raise NoiseError(f"side must be 'A'/'B' and factor 'E'/'F', got {side!r}, {factor!r}")
    return SIDES[side] | (FACTORS[factor] << 8)


TARGET = float(NOISE_TARGET_NORM * 32)  # 32 · the target norm: the scale numerator


def noise_lines(key: torch.Tensor, side: str, factor: str, lines: torch.Tensor | int) -> torch.Tensor:
    """(N, 32) e4m3 noise lines under a side's noise-line key (1, 8): for the line indices in
    `lines`, or for lines 0 .. lines − 1 when `lines` is an int (what every operand uses)."""
    where = address(side, factor)
    if key.dtype != torch.int32 or key.shape != (1, 8):
        raise NoiseError(f"the noise-line key must be (1, 8) int32 words, got {key.dtype} {tuple(key.shape)}")
    first_lines = isinstance(lines, int)
    index = key if first_lines else lines.to(torch.int64).reshape(-1).contiguous()  # key: unused pointer
    count = lines if first_lines else index.shape[0]
    out = torch.empty((count, 32), dtype=torch.uint8, device=key.device)
    if count:
        _noise_kernel[(triton.cdiv(count, _LANES),)](
            key.contiguous(), index, out, count, where, TARGET, LANES=_LANES, FIRST_LINES=first_lines,
            enable_fp_fusion=False)
    return out.view(torch.float8_e4m3fn)
