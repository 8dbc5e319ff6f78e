"""Lagged mining for decode (task L2, issue 8): launch t serves x_t and mines launch t−1's A side.

At decode the grouped GEMM is memory-bound (the weights stream once) and its 64-row tiles are
mostly empty (~16 rows an expert), so a second set of rows per expert is almost free. The left
operand of expert e is [READY rows of e ; clean rows of e]:

- READY rows: the noisy A′ codes of launch t−1 in t−1's expert order, prepared on a side stream
  while launch t−1's GEMM ran (`LagSlot`, filled as PENDING, copied to READY at the start of t);
- clean rows: x_t quantized for inference only, with a per-token scale α = bf16(448 / max|x|)
  and no noise. B′ still carries the B noise β_B E_B F_B, so their peel is the B-noise term only:
  A peel = [0 | A_c′ · F_Bᵀ] (the noisy formula with E_A = 0), and
  acc + A_peel · B_peelᵀ = A_c′ · (B′ − β_B N_B)ᵀ ≈ α_c x · (α_B B)ᵀ.

Row positions (r_e = READY rows of e, c_e = clean rows of e, rb / ct their bounds, cb = rb + ct
the combined bounds): READY row j of e sits at combined row j + ct[e]; clean row i of e at
i + rb[e + 1]. The lottery (`LotteryLatch.run(row_shift=)`) and the peel
(`peel.peel_and_unscale(row_shift=)`) read the accumulator through these per-expert shifts, so
neither the accumulator nor the output is copied. Nothing here syncs with the host.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton.language as tl

from kernels.int7._jit import jit

from .noisy_kernel import _bf16_of_bits, _e4m3_code, _rne_bf16
from .peel import a_peel
from .quant import NoisySide
from .routing import RoutingTable, dense_table

_ALIGN = 16  # bytes: every view of a slot starts on a 16-byte boundary
_QUANT_BLOCK = 1024  # elements per step of the clean quantization
_COPY_BLOCK = 1024  # 4-byte words per step of a READY row copy
_NORM_FLOOR = tl.constexpr(2.0 ** -32)  # an all-zero row gets a finite scale


class LagError(ValueError):
    """Bad arguments to the lagged mined pass."""


@dataclass
class LagSlot:
    """One launch's mined rows as persistent views of one flat byte buffer, so READY ← PENDING is
    a single copy (and a CUDA graph that contains it keeps rotating on every replay).

    a_rows: A′ codes (rows, k) in the launch's expert order; codes/scales: the committed A planes
    (token order, the payload of a winner); rflat/bounds: the launch's routing; pow_key: its
    jackpot key. bounds all zero = nothing to mine (no launch yet, or the job changed).
    """

    flat: torch.Tensor
    a_rows: torch.Tensor
    codes: torch.Tensor
    scales: torch.Tensor
    rflat: torch.Tensor
    bounds: torch.Tensor
    pow_key: torch.Tensor

    @classmethod
    def allocate(cls, m: int, rows: int, k: int, experts: int, device: torch.device) -> "LagSlot":
        layout = {"a_rows": ((rows, k), torch.uint8), "codes": ((m, k), torch.int8),
                  "scales": ((m, k // 8), torch.bfloat16), "rflat": ((rows,), torch.int32),
                  "bounds": ((experts + 1,), torch.int32), "pow_key": ((1, 8), torch.int32)}
        offsets, size = {}, 0
        for name, (shape, dtype) in layout.items():
            offsets[name] = size
            size += -(-(torch.Size(shape).numel() * dtype.itemsize) // _ALIGN) * _ALIGN
        flat = torch.zeros(size, dtype=torch.uint8, device=device)
        views = {name: flat[offsets[name]:offsets[name] + torch.Size(shape).numel() * dtype.itemsize]
                 .view(dtype).view(shape) for name, (shape, dtype) in layout.items()}
        return cls(flat, **views)

    def invalidate(self) -> None:
        """Nothing to mine in this slot (on the current stream)."""
        self.bounds.zero_()

    def fill(self, a_codes: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, pow_key: torch.Tensor,
             table: RoutingTable, moe: bool) -> None:
        """Store one launch's A′ rows (gathered into expert order), planes, routing and key."""
        if moe:
            torch.index_select(a_codes.view(torch.uint8), 0, table.rflat, out=self.a_rows)
        else:
            self.a_rows.copy_(a_codes.view(torch.uint8))
        self.codes.copy_(codes)
        self.scales.copy_(scales)
        self.rflat.copy_(table.rflat)
        self.bounds.copy_(table.bounds)
        self.pow_key.copy_(pow_key)

    def table(self) -> RoutingTable:
        return RoutingTable(self.rflat, self.bounds)

    def sources(self) -> dict[str, torch.Tensor]:
        """The payload a winner on these rows needs (LotteryLatch.capture)."""
        return {"codes": self.codes, "scales": self.scales, "rflat": self.rflat, "offsets": self.bounds[1:]}


@jit
def _copy_row(src_ptr, dst_ptr, words, BW: tl.constexpr):
    """`words` int32 words from src to dst."""
    for w0 in range(0, words, BW):
        offs = w0 + tl.arange(0, BW)
        live = offs < words
        tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=live), mask=live)


@jit
def _quantize_row(x_ptr, k, out_ptr, codes_ptr, alpha_ptr, BK: tl.constexpr):
    """One bf16 row (x_ptr: its int16 bits) → e4m3 codes at out_ptr and codes_ptr with the
    per-token scale α = bf16(448 / max(|x|, 2^-32)), stored (bf16 bits) at alpha_ptr."""
    peak = tl.full((BK,), 0.0, tl.float32)
    for k0 in range(0, k, BK):
        offs = k0 + tl.arange(0, BK)
        peak = tl.maximum(peak, tl.abs(_bf16_of_bits(x_ptr, offs, offs < k)))
    amax = tl.maximum(tl.reduce(peak, 0, tl.standard._elementwise_max), _NORM_FLOOR)
    alpha = _rne_bf16(tl.math.div_rn(tl.full((BK,), 448.0, tl.float32), tl.full((BK,), 0.0, tl.float32) + amax)
                      .to(tl.int32, bitcast=True))
    lane = tl.arange(0, BK)
    tl.store(alpha_ptr + lane, (alpha >> 16).to(tl.int16), mask=lane == 0)
    scale = alpha.to(tl.float32, bitcast=True)
    for k0 in range(0, k, BK):
        offs = k0 + tl.arange(0, BK)
        live = offs < k
        value = _bf16_of_bits(x_ptr, offs, live) * scale
        value = tl.where(value > 448.0, 448.0, tl.where(value < -448.0, -448.0, value))
        code = _e4m3_code(value.to(tl.int32, bitcast=True)).to(tl.uint8)
        tl.store(out_ptr + offs, code, mask=live)
        tl.store(codes_ptr + offs, code, mask=live)


@jit
def _operand_kernel(x_ptr, rflat_ptr, clean_bounds_ptr, ready_ptr, ready_bounds_ptr, out_ptr, out_words_ptr,
                    codes_ptr, alpha_ptr, bounds_ptr, experts, k, capacity,
                    SEARCH: tl.constexpr, BK: tl.constexpr, BW: tl.constexpr):
    """Combined row program_id(0): a READY row copied, or a clean row quantized from its token.
    Programs 0..e also write the combined bounds cb = rb + ct, except cb[e] = capacity: the last
    expert's group runs to the operand's end (rows past the used ones are never read back), so
    the GEMM's offsets[e] = total rows holds even when nothing is READY."""
    i = tl.program_id(0)
    if i <= experts:
        both = tl.load(ready_bounds_ptr + i) + tl.load(clean_bounds_ptr + i)
        tl.store(bounds_ptr + i, tl.where(i == experts, capacity, both))
    total = tl.load(ready_bounds_ptr + experts) + tl.load(clean_bounds_ptr + experts)
    if i < total:
        lo = experts * 0  # the expert: the last w with cb[w] <= i (binary search over [lo, hi))
        hi = experts
        for _ in tl.static_range(SEARCH):
            mid = (lo + hi) // 2
            below = tl.load(ready_bounds_ptr + mid) + tl.load(clean_bounds_ptr + mid) <= i
            lo = tl.where(below, mid, lo)
            hi = tl.where(below, hi, mid)
        ready_start = tl.load(ready_bounds_ptr + lo)
        ready_count = tl.load(ready_bounds_ptr + lo + 1) - ready_start
        clean_start = tl.load(clean_bounds_ptr + lo)
        j = i - ready_start - clean_start
        words = k // 4
        if j < ready_count:
            _copy_row(ready_ptr + (ready_start + j).to(tl.int64) * words,
                      out_words_ptr + i.to(tl.int64) * words, words, BW)
        else:
            token = tl.load(rflat_ptr + clean_start + j - ready_count).to(tl.int64)
            _quantize_row(x_ptr + token * k, k, out_ptr + i.to(tl.int64) * k, codes_ptr + token * k,
                          alpha_ptr + token, BK)


@dataclass
class Operand:
    """The GEMM's left operand of a lagged launch and what the clean rows' peel needs."""

    rows: torch.Tensor  # (2·rows, k) e4m3: per expert [READY rows ; clean rows], unused tail
    table: RoutingTable  # the combined bounds cb (e+1,) over those rows (cb[e] = 2·rows)
    clean_codes: torch.Tensor  # (m, k) e4m3, token order
    clean_alpha: torch.Tensor  # (m,) bf16, token order


def build_operand(x: torch.Tensor, table: RoutingTable, ready: LagSlot) -> Operand:
    """One launch: READY rows copied and x's clean rows quantized into the combined operand, the
    combined bounds, and the clean codes/scales in token order (their peel is computed from
    those). A token routed to top_k experts is quantized by each of its rows' programs, which
    store the same bytes into its token-order row."""
    m, k = x.shape
    rows = table.rflat.shape[0]
    experts = table.experts
    if x.dtype != torch.bfloat16 or k % 32 or ready.a_rows.shape != (rows, k) or ready.bounds.shape != table.bounds.shape:
        raise LagError(f"x must be bf16 (m, k) with k % 32 == 0 and READY must hold ({rows}, {k}) rows for "
                       f"{experts} experts; got x {x.dtype} {tuple(x.shape)}, READY {tuple(ready.a_rows.shape)}")
    device = x.device
    operand = torch.empty((2 * rows, k), dtype=torch.uint8, device=device)
    codes = torch.empty((m, k), dtype=torch.uint8, device=device)
    alpha = torch.empty(m, dtype=torch.int16, device=device)
    bounds = torch.empty(experts + 1, dtype=torch.int32, device=device)
    _operand_kernel[(max(2 * rows, experts + 1),)](
        x.contiguous().view(torch.int16), table.rflat, table.bounds, ready.a_rows.view(torch.int32),
        ready.bounds, operand, operand.view(torch.int32), codes, alpha, bounds, experts, k, 2 * rows,
        SEARCH=max(1, (experts - 1).bit_length()) + 1, BK=_QUANT_BLOCK, BW=_COPY_BLOCK,
        enable_fp_fusion=False)
    return Operand(operand.view(torch.float8_e4m3fn), RoutingTable(_rows(2 * rows, device), bounds),
                   codes.view(torch.float8_e4m3fn), alpha.view(torch.bfloat16))


def _rows(count: int, device: torch.device) -> torch.Tensor:
    """The combined operand's rows in order (its rows are not gathered again)."""
    return dense_table(count, device).rflat


@functools.lru_cache(maxsize=16)
def _zero_noise(m: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """β = 0 (m,) bf16 and E = 0 (m, 32) e4m3: the clean rows carry no A noise. Made once per
    (m, device), before any graph capture, and never written."""
    return (torch.zeros(m, dtype=torch.bfloat16, device=device),
            torch.zeros((m, 32), dtype=torch.uint8, device=device).view(torch.float8_e4m3fn))


def clean_peel(operand: Operand, f_b: torch.Tensor) -> torch.Tensor:
    """(m, 64) bf16 [0 | A_c′ · F_Bᵀ]: the A peel of the clean rows (peel.a_peel with E_A = 0)."""
    beta, e_lines = _zero_noise(operand.clean_codes.shape[0], operand.clean_codes.device)
    return a_peel(NoisySide(operand.clean_codes, operand.clean_alpha, beta, e_lines), f_b)
