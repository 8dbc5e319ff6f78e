"""Lagged mining for decode (task L2, issue 8): launch t serves x_t and mines launch t−1's A side.

At decode the grouped GEMM is memory-bound (the weights stream once) and its 64-row tiles are
mostly empty (~16 rows an expert), so a second set of rows per expert is almost free. The left
operand of expert e is [READY rows of e ; clean rows of e]:

- READY rows: the noisy A′ codes of launch t−1 in t−1's expert order, prepared on a side stream
  while launch t−1's GEMM ran (`LagSlot` PENDING) and read from PENDING by launch t's front
  (`lagged_front`) before the side stream refills it; the READY slot keeps only PENDING's tail
  (planes, routing, key), which the take and the peel's row shift read after the refill;
- clean rows: x_t quantized for inference only, with a per-token scale α = bf16(448 / max|x|)
  and no noise. B′ still carries the B noise β_B E_B F_B, so their peel is the B-noise term only:
  A peel = [0 | A_c′ · F_Bᵀ] (the noisy formula with E_A = 0), and
  acc + A_peel · B_peelᵀ = A_c′ · (B′ − β_B N_B)ᵀ ≈ α_c x · (α_B B)ᵀ.

Row positions (r_e = READY rows of e, c_e = clean rows of e, rb / ct their bounds, cb = rb + ct
the combined bounds): READY row j of e sits at combined row j + ct[e]; clean row i of e at
i + rb[e + 1]. The peel (`peel.peel_and_unscale(row_shift=)`) reads the clean rows through these
per-expert shifts, so the output is never copied. For the next launch's lottery the GEMM folds
the READY rows' tiles into compact lanes in its epilogue (by the front's snapshot of rb,
`Operand.ready_bounds`), which MINED's take copies; where it cannot fold, the take copies the
READY rows' fp32 accumulator out compactly instead. Nothing here syncs with the host.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from triton.language.extra.cuda import gdc_wait

from kernels.triton_jit import jit, pdl_enabled, pdl_launch

from .noisy_kernel import _bf16_of_bits, _e4m3_code, _rne_bf16
from .peel import a_peel
from .quant import NoisySide
from .routing import (RoutingTable, clamped_ids, dense_table, entries_before, one_program_shape, routing_args,
                      routing_table)
from .word_copy import chunks, copy_two_ranges

_ALIGN = 16  # bytes: every view of a slot starts on a 16-byte boundary
_QUANT_BLOCK = 8192  # most elements per step of the clean quantization (k ≤ 8192: one load)
_QUANT_WARPS = 16  # the front's programs (H100, session 22, lagged pass: GLM-5 305.4 / 304.7 vs 306.8 / 307.2 µs at 8)
_ROW_STEP_WORDS = 2048  # most 4-byte words per step of a row copy (k ≤ 8192: one step)
_READY_ROWS = 4  # READY rows a `_front_kernel` program copies (GLM-5 decode: 128 programs beside 64 token ones)
_NORM_FLOOR = tl.constexpr(2.0 ** -32)  # an all-zero row gets a finite scale
# The MoE decode front launches as the programmatic dependent of the serving stream's kernel before
# it (whatever wrote x and the ids in a model; the previous launch's peel, which lets its dependents
# launch as its programs end, in back-to-back launches of one layer): its launch latency can then
# overlap that kernel's tail.
FRONT_PDL = True


class LagError(ValueError):
    """Bad arguments to the lagged mined pass."""


@dataclass
class LagSlot:
    """One launch's mined rows as persistent views of one flat byte buffer, so READY's tail ←
    PENDING's is a single copy (and a CUDA graph that contains it keeps rotating on every replay).

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
    def allocate(cls, m: int, rows: int, k: int, experts: int, device: torch.device,
                 with_rows: bool = True) -> "LagSlot":
        """with_rows = False: no A′ rows (a MINED slot keeps only what the lottery and payload read)."""
        layout = {"a_rows": ((rows if with_rows else 0, k), torch.uint8), "codes": ((m, k), torch.int8),
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

    def tail(self) -> torch.Tensor:
        """The slot's bytes after its A′ rows (planes, routing, key) as int32 words: the same
        layout in every slot of one launch shape, with or without rows."""
        return self.flat[self.codes.data_ptr() - self.flat.data_ptr():].view(torch.int32)

    def fill(self, a_codes: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, pow_key: torch.Tensor,
             table: RoutingTable) -> None:
        """Store one launch's A′ rows (gathered into expert order through Rflat; dense: the
        identity), planes, routing and key: one kernel, a program per row (was six copies at
        the side stream's tail)."""
        (m, k), rows = codes.shape, self.a_rows.shape[0]
        _fill_kernel[(rows + m,)](
            a_codes.view(torch.int32), table.rflat, codes.view(torch.int32), scales.view(torch.int32),
            table.bounds, pow_key, self.a_rows.view(torch.int32), self.codes.view(torch.int32),
            self.scales.view(torch.int32), self.rflat, self.bounds, self.pow_key, rows, k // 4, k // 16,
            self.bounds.shape[0], BW=_copy_block(k))

    def table(self) -> RoutingTable:
        return RoutingTable(self.rflat, self.bounds)

    def sources(self) -> dict[str, torch.Tensor]:
        """The payload a winner on these rows needs (LotteryLatch.capture)."""
        return {"codes": self.codes, "scales": self.scales, "rflat": self.rflat, "offsets": self.bounds[1:]}


@jit
def _copy_words(src_ptr, dst_ptr, words, BW: tl.constexpr):
    """`words` int32 words from src to dst, BW at a time."""
    for w0 in range(0, words, BW):
        offs = w0 + tl.arange(0, BW)
        live = offs < words
        tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=live), mask=live)


@jit
def _fill_kernel(a_ptr, rflat_ptr, codes_ptr, scales_ptr, bounds_ptr, key_ptr, slot_a_ptr, slot_codes_ptr,
                 slot_scales_ptr, slot_rflat_ptr, slot_bounds_ptr, slot_key_ptr, rows, words, scale_words,
                 edges, BW: tl.constexpr):
    """Program r < rows: slot A′ row r ← A′ row Rflat[r]; program rows + t: token t's code and
    scale rows, and (t = 0) Rflat, the bounds and the key. int32 words throughout."""
    p = tl.program_id(0)
    if p < rows:
        source = tl.load(rflat_ptr + p).to(tl.int64)
        _copy_words(a_ptr + source * words, slot_a_ptr + p.to(tl.int64) * words, words, BW)
    else:
        t = (p - rows).to(tl.int64)
        _copy_words(codes_ptr + t * words, slot_codes_ptr + t * words, words, BW)
        _copy_words(scales_ptr + t * scale_words, slot_scales_ptr + t * scale_words, scale_words, BW)
        if t == 0:
            _copy_words(rflat_ptr, slot_rflat_ptr, rows, BW)
            _copy_words(bounds_ptr, slot_bounds_ptr, edges, BW)
            _copy_words(key_ptr, slot_key_ptr, 8, BW)


@dataclass
class MinedSlot:
    """A launch's READY rows after its GEMM: their accumulator rows (compact, in the mined
    launch's expert order) or, where the lagged GEMM folds them in its epilogue, their whole
    tiles' folded lanes (64 bytes a 4×64 tile, in the same compact layout), and the READY slot's
    planes, routing and key. The next launch's side stream runs the lottery, payload and publish
    on it beside its own GEMM, so none of them is on a launch's tail; a winner is published one
    launch later than the GEMM that hashed its rows."""

    acc: torch.Tensor  # (rows, n) fp32, or folded: (rows // 4, n / 64, 16) int32 lanes
    slot: LagSlot  # no A′ rows

    @classmethod
    def allocate(cls, m: int, rows: int, n: int, k: int, experts: int, device: torch.device,
                 folded: bool = False) -> "MinedSlot":
        acc = (torch.zeros((rows // 4, n // 64, 16), dtype=torch.int32, device=device) if folded
               else torch.zeros((rows, n), dtype=torch.float32, device=device))
        return cls(acc, LagSlot.allocate(m, rows, k, experts, device, with_rows=False))

    @property
    def folded(self) -> bool:
        """Whether the slot holds folded lanes (`LotteryLatch.run_folded`) rather than rows (`run`)."""
        return self.acc.dim() == 3

    def invalidate(self) -> None:
        """Nothing to mine (bounds all zero: no row tiles), on the current stream."""
        self.slot.invalidate()

    def take(self, acc: torch.Tensor, ready: LagSlot, clean_bounds: torch.Tensor) -> None:
        """MINED ← the READY rows of the combined accumulator `acc` (expert w's READY row j at
        combined row rb[w] + j + ct[w]) and READY's tail; one kernel: a program per READY row,
        then programs striding the tail's words. Folded: `acc` is the lanes the GEMM folded from
        the READY rows, already compact, so the same kernel copies them whole, then the tail (the
        lagged pass has the serving peel copy these instead: `folded_copies`)."""
        if self.folded:
            first, second = self.folded_copies(acc, ready)
            rows, n = 0, 1
        else:
            src, dst = ready.tail(), self.slot.tail()
            if acc.shape[1:] != self.acc.shape[1:] or src.shape != dst.shape:
                raise LagError(f"MINED {tuple(self.acc.shape)} does not match {tuple(acc.shape)} / READY")
            first, second = (src, dst), (src, dst[:0])
            rows, n = self.acc.shape
        if ready.bounds.shape != clean_bounds.shape:
            raise LagError(f"READY bounds {tuple(ready.bounds.shape)} do not match {tuple(clean_bounds.shape)}")
        words = self.acc.view(torch.int32).view(-1)
        programs = rows + chunks(first[1].numel()) + chunks(second[1].numel())
        _take_kernel[(programs,)](
            acc.view(torch.int32), ready.bounds, clean_bounds, words, rows, n, ready.bounds.shape[0] - 1,
            *first, first[1].numel(), *second, second[1].numel(), EB=triton.next_power_of_2(ready.bounds.shape[0]),
            BW=min(triton.next_power_of_2(n), _ROW_STEP_WORDS))

    def folded_copies(self, lanes: torch.Tensor, ready: LagSlot) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
        """A folded take as two int32 (source, destination) word ranges: MINED's lanes ← `lanes`
        (the GEMM's, already in MINED's layout), MINED's tail ← READY's."""
        src, dst = ready.tail(), self.slot.tail()
        if not self.folded or lanes.shape != self.acc.shape or src.shape != dst.shape:
            raise LagError(f"MINED {tuple(self.acc.shape)} does not take {tuple(lanes.shape)} / READY")
        return (lanes.view(torch.int32).view(-1), self.acc.view(-1)), (src, dst)


@jit
def _take_kernel(acc_ptr, ready_bounds_ptr, clean_bounds_ptr, mined_ptr, rows, n, experts, first_src_ptr,
                 first_dst_ptr, first_words, second_src_ptr, second_dst_ptr, second_words, EB: tl.constexpr,
                 BW: tl.constexpr):
    """Program r < rows: MINED acc row r ← combined row r + ct[w] (w: READY row r's expert, the
    number of w ≥ 1 with rb[w] ≤ r; rows past rb[e] are not copied). The programs after them:
    COPY_WORDS-word chunks (`word_copy`) of a first, then a second word range (READY's tail; or the folded lanes,
    then the tail)."""
    p = tl.program_id(0)
    if p < rows:
        w = tl.arange(0, EB)
        edge = w <= experts
        rb = tl.load(ready_bounds_ptr + w, mask=edge, other=0)
        ct = tl.load(clean_bounds_ptr + w, mask=edge, other=0)
        if p < tl.reduce(tl.where(w == experts, rb, 0), 0, tl.standard._sum_combine):
            expert = tl.reduce(((w >= 1) & (w < experts) & (rb <= p)).to(tl.int32), 0, tl.standard._sum_combine)
            shift = tl.reduce(tl.where(w == expert, ct, 0), 0, tl.standard._sum_combine)
            _copy_words(acc_ptr + (p + shift).to(tl.int64) * n, mined_ptr + p.to(tl.int64) * n, n, BW)
    else:
        copy_two_ranges(p - rows, first_src_ptr, first_dst_ptr, first_words, second_src_ptr, second_dst_ptr,
                        second_words)


@jit
def _row_scale(x_ptr, k, alpha_ptr, BK: tl.constexpr):
    """The per-token scale of one bf16 row (x_ptr: its int16 bits), α = bf16(448 / max(|x|, 2^-32)):
    stored (bf16 bits) at alpha_ptr and returned as an f32 (BK,) vector for `_row_codes`. k ≤ BK:
    one load (the codes pass re-reads it from L1)."""
    peak = tl.full((BK,), 0.0, tl.float32)
    for k0 in range(0, k, BK):
        offs = k0 + tl.arange(0, BK)
        peak = tl.maximum(peak, tl.abs(_bf16_of_bits(x_ptr, offs, offs < k)))
    amax = tl.maximum(tl.reduce(peak, 0, tl.standard._elementwise_max), _NORM_FLOOR)
    alpha = _rne_bf16(tl.math.div_rn(tl.full((BK,), 448.0, tl.float32), tl.full((BK,), 0.0, tl.float32) + amax)
                      .to(tl.int32, bitcast=True))
    lane = tl.arange(0, BK)
    tl.store(alpha_ptr + lane, (alpha >> 16).to(tl.int16), mask=lane == 0)
    return alpha.to(tl.float32, bitcast=True)


@jit
def _row_codes(x_ptr, k0, k, scale, BK: tl.constexpr):
    """Columns [k0, k0 + BK) of one bf16 row as e4m3 codes of clamp(α·x, ±448): (offsets, live,
    codes); the caller stores them wherever the row goes (token order, operand rows)."""
    offs = k0 + tl.arange(0, BK)
    live = offs < k
    value = _bf16_of_bits(x_ptr, offs, live) * scale
    value = tl.where(value > 448.0, 448.0, tl.where(value < -448.0, -448.0, value))
    return offs, live, _e4m3_code(value.to(tl.int32, bitcast=True)).to(tl.uint8)


@jit
def _clean_kernel(x_ptr, k, codes_ptr, alpha_ptr, BK: tl.constexpr):
    """Token program_id(0)'s clean codes (token order) and α."""
    token = tl.program_id(0).to(tl.int64)
    scale = _row_scale(x_ptr + token * k, k, alpha_ptr + token, BK)
    for k0 in range(0, k, BK):
        offs, live, codes = _row_codes(x_ptr + token * k, k0, k, scale, BK)
        tl.store(codes_ptr + token * k + offs, codes, mask=live)


@dataclass
class CleanRows:
    """x_t quantized for inference only (token order) and its routing table."""

    table: RoutingTable
    codes: torch.Tensor  # (m, k) e4m3
    alpha: torch.Tensor  # (m,) bf16 per-token scale


def clean_rows(x: torch.Tensor, topk_ids: torch.Tensor | None, experts: int) -> CleanRows:
    """The clean codes and α of every token (one launch, a program per token), and the routing
    table (`routing_table`; dense: one group when topk_ids is None). The lagged pass takes this
    path only where `lagged_front` does not fuse (dense, or routing too large to rank per token)."""
    m, k = x.shape
    _clean_args(x)
    codes = torch.empty((m, k), dtype=torch.uint8, device=x.device)
    alpha = torch.empty(m, dtype=torch.int16, device=x.device)
    table = dense_table(m, x.device) if topk_ids is None else routing_table(topk_ids, experts)
    _clean_kernel[(m,)](x.contiguous().view(torch.int16), k, codes, alpha, BK=_quant_block(k), num_warps=_QUANT_WARPS,
                        enable_fp_fusion=False)
    return CleanRows(table, codes.view(torch.float8_e4m3fn), alpha.view(torch.bfloat16))


def _clean_args(x: torch.Tensor) -> None:
    """Raise LagError unless x is bf16 (m, k) with k % 32 == 0."""
    if x.dtype != torch.bfloat16 or x.dim() != 2 or x.shape[1] % 32:
        raise LagError(f"x must be bf16 (m, k) with k % 32 == 0, got {x.dtype} {tuple(x.shape)}")


def _quant_block(k: int) -> int:
    """Elements per step of the clean quantization (k ≤ 8192: the whole row in one step)."""
    return min(triton.next_power_of_2(k), _QUANT_BLOCK)


@jit
def _operand_kernel(codes_ptr, rflat_ptr, clean_bounds_ptr, ready_ptr, ready_bounds_ptr, out_ptr, bounds_ptr,
                    ready_copy_ptr, counter_ptr, experts, words, capacity, EB: tl.constexpr, BW: tl.constexpr):
    """Combined row program_id(0): a READY row or a clean token's codes, copied (int32 words).
    Its expert comes from one vector load of both bounds (the number of experts w ≥ 1 with
    cb[w] ≤ row, no dependent search). Program 0 also writes the combined bounds cb = rb + ct,
    except cb[e] = capacity: the last expert's group runs to the operand's end (rows past the
    used ones are never read back), so the GEMM's offsets[e] = total rows holds even when
    nothing is READY; the snapshot of rb (`Operand.ready_bounds`); and the GEMM's counters
    zeroed (`Operand.tile_counter`, `Operand.expert_done`)."""
    i = tl.program_id(0)
    w = tl.arange(0, EB)
    edge = w <= experts
    rb = tl.load(ready_bounds_ptr + w, mask=edge, other=0)
    ct = tl.load(clean_bounds_ptr + w, mask=edge, other=0)
    cb = rb + ct
    tl.store(bounds_ptr + w, tl.where(w == experts, capacity, cb), mask=edge & (w * 0 + i == 0))
    tl.store(ready_copy_ptr + w, rb, mask=edge & (w * 0 + i == 0))
    tl.store(counter_ptr + w, w * 0, mask=edge & (w * 0 + i == 0))
    if i < tl.reduce(tl.where(w == experts, cb, 0), 0, tl.standard._sum_combine):
        expert = tl.reduce(((w >= 1) & (w < experts) & (cb <= i)).to(tl.int32), 0, tl.standard._sum_combine)
        ready_start = tl.reduce(tl.where(w == expert, rb, 0), 0, tl.standard._sum_combine)
        ready_count = tl.reduce(tl.where(w == expert + 1, rb, 0), 0, tl.standard._sum_combine) - ready_start
        clean_start = tl.reduce(tl.where(w == expert, ct, 0), 0, tl.standard._sum_combine)
        j = i - ready_start - clean_start
        if j < ready_count:
            source = ready_ptr + (ready_start + j).to(tl.int64) * words
        else:
            source = codes_ptr + tl.load(rflat_ptr + clean_start + j - ready_count).to(tl.int64) * words
        _copy_words(source, out_ptr + i.to(tl.int64) * words, words, BW)


@dataclass
class Operand:
    """The GEMM's left operand of a lagged launch and what the clean rows' peel needs."""

    rows: torch.Tensor  # (2·rows, k) e4m3: per expert [READY rows ; clean rows], unused tail
    table: RoutingTable  # the combined bounds cb (e+1,) over those rows (cb[e] = 2·rows)
    clean_table: RoutingTable  # this launch's routing (Rflat, bounds) of the clean rows
    clean_codes: torch.Tensor  # (m, k) e4m3, token order
    clean_alpha: torch.Tensor  # (m,) bf16, token order
    ready_bounds: torch.Tensor  # (e+1,) the READY rows' bounds rb as the operand was built (a
    # snapshot on the serving stream: the GEMM's fold reads it while the side stream refills the slot)
    tile_counter: torch.Tensor  # (1,) int32, zeroed with the bounds: the GEMM's dynamic tile scheduler
    expert_done: torch.Tensor  # (e,) int32, zeroed with them: the GEMM's finished tiles an expert
    # (`fold_epilogue.folded_grouped_gemm(expert_done=)`), for a peel that polls them


def build_operand(clean: CleanRows, ready: LagSlot) -> Operand:
    """One launch: the rows to mine (`ready`'s A′ rows) and the clean rows (each token's codes,
    through Rflat) copied into the combined operand, and the combined bounds; one program a
    combined row."""
    table = clean.table
    k, rows, experts = clean.codes.shape[1], table.rflat.shape[0], table.experts
    _operand_args(ready, rows, k, experts)
    operand, bounds, ready_bounds, counter = _operand_buffers(rows, k, experts, clean.codes.device)
    _operand_kernel[(2 * rows,)](
        clean.codes.view(torch.int32), table.rflat, table.bounds, ready.a_rows.view(torch.int32), ready.bounds,
        operand.view(torch.int32), bounds, ready_bounds, counter, experts, k // 4, 2 * rows,
        EB=triton.next_power_of_2(experts + 1), BW=_copy_block(k))
    return _operand(operand, bounds, ready_bounds, counter, table, clean.codes, clean.alpha)


def lagged_front(x: torch.Tensor, topk_ids: torch.Tensor | None, experts: int, ready: LagSlot) -> Operand:
    """Everything the serving stream does before a lagged GEMM: x's routing table, clean codes
    and α, and the combined operand over `ready`'s A′ rows (the pipeline passes PENDING: it is
    refilled only after this launch). MoE decode (`one_program_shape`: at
    most 4096 routing entries) in ONE launch (`_front_kernel`); dense and larger routings by
    `clean_rows` then `build_operand`."""
    if topk_ids is None:
        return build_operand(clean_rows(x, None, experts), ready)
    routing_args(topk_ids, experts)
    shape = one_program_shape(topk_ids.numel(), experts)
    if shape is None:
        return build_operand(clean_rows(x, topk_ids, experts), ready)
    _clean_args(x)
    (m, k), (_, top_k), rows = x.shape, topk_ids.shape, topk_ids.numel()
    _operand_args(ready, rows, k, experts)
    device = x.device
    codes = torch.empty((m, k), dtype=torch.uint8, device=device)
    alpha = torch.empty(m, dtype=torch.int16, device=device)
    table = RoutingTable(torch.empty(rows, dtype=torch.int32, device=device),
                         torch.empty(experts + 1, dtype=torch.int32, device=device))
    operand, bounds, ready_bounds, counter = _operand_buffers(rows, k, experts, device)
    overlap = FRONT_PDL and pdl_enabled()
    _front_kernel[(m + 1 + triton.cdiv(rows, _READY_ROWS),)](
        topk_ids.contiguous(), rows, experts, top_k, x.contiguous().view(torch.int16), k, codes, alpha,
        ready.a_rows.view(torch.int32), ready.bounds, table.rflat, table.bounds, operand, operand.view(torch.int32),
        bounds, ready_bounds, counter, m, 2 * rows, EB=shape[0], TK=triton.next_power_of_2(top_k), CHUNK=shape[1],
        BK=_quant_block(k), BW=_copy_block(k), RP=_READY_ROWS, WAIT=int(overlap), num_warps=_QUANT_WARPS,
        enable_fp_fusion=False, **pdl_launch(overlap))
    return _operand(operand, bounds, ready_bounds, counter, table, codes.view(torch.float8_e4m3fn),
                    alpha.view(torch.bfloat16))


@jit
def _front_kernel(ids_ptr, total, experts, top_k, x_ptr, k, codes_ptr, alpha_ptr, ready_ptr, ready_bounds_ptr,
                  rflat_ptr, bounds_ptr, out_ptr, out_words_ptr, out_bounds_ptr, ready_copy_ptr, counter_ptr, m, capacity,
                  EB: tl.constexpr, TK: tl.constexpr, CHUNK: tl.constexpr, BK: tl.constexpr, BW: tl.constexpr,
                  RP: tl.constexpr, WAIT: tl.constexpr = 0):
    """`lagged_front` at MoE decode, one launch. Program t < m: token t ranks its own top_k
    entries (`entries_before`: its Rflat positions, stable, no table needed), writes them into
    Rflat, quantizes x_t once (α, token-order codes) and stores the codes straight into its
    combined rows (Rflat position i of expert w → combined row i + rb[w + 1]; out_ptr and
    out_words_ptr: the operand as bytes and as int32 words). Program m: the bounds ct, the
    combined bounds cb = rb + ct (cb[e] = capacity, as `_operand_kernel`), rb's snapshot and the
    GEMM's counters zeroed.
    Program m + 1 + c: READY rows [c·RP, (c + 1)·RP), row j → combined row j + ct[w] (w: its
    expert from rb; ct[w] counted from the ids). No program waits for another, so the routing →
    quantization → copy chain (two launches and a READY copy before) is one launch. WAIT:
    launched as the programmatic dependent of the kernel before it (which may write x or the
    ids), so every program waits for it first; what it saves is the launch's latency."""
    if WAIT:
        gdc_wait()
    p = tl.program_id(0)
    if p < m:
        lane = tl.arange(0, TK)
        live = lane < top_k
        at = p * top_k + lane
        ids = clamped_ids(ids_ptr, at, live, experts)
        position = entries_before(ids_ptr, total, experts, ids, at, CHUNK)
        tl.store(rflat_ptr + position, p + lane * 0, mask=live)
        rows = position + tl.load(ready_bounds_ptr + ids + 1, mask=live, other=0)
        token = p.to(tl.int64)
        scale = _row_scale(x_ptr + token * k, k, alpha_ptr + token, BK)
        for k0 in range(0, k, BK):
            offs, in_row, codes = _row_codes(x_ptr + token * k, k0, k, scale, BK)
            tl.store(codes_ptr + token * k + offs, codes, mask=in_row)
            for j in range(0, top_k):
                row = tl.reduce(tl.where(lane == j, rows, 0), 0, tl.standard._sum_combine).to(tl.int64)
                tl.store(out_ptr + row * k + offs, codes, mask=in_row)
    elif p == m:
        w = tl.arange(0, EB)
        ct = entries_before(ids_ptr, total, experts, w, w * 0, CHUNK)
        rb = tl.load(ready_bounds_ptr + w, mask=w < experts, other=0)
        tl.store(ready_copy_ptr + w, rb, mask=w < experts)
        tl.store(ready_copy_ptr + experts + w, tl.load(ready_bounds_ptr + experts + w, mask=w == 0), mask=w == 0)
        tl.store(bounds_ptr + w, ct, mask=w < experts)
        tl.store(out_bounds_ptr + w, rb + ct, mask=w < experts)
        tl.store(bounds_ptr + experts + w, total + w * 0, mask=w == 0)
        tl.store(out_bounds_ptr + experts + w, capacity + w * 0, mask=w == 0)
        tl.store(counter_ptr + w, w * 0, mask=w < experts)
        tl.store(counter_ptr + experts + w, w * 0, mask=w == 0)
    else:
        j = (p - m - 1) * RP + tl.arange(0, RP)
        w = tl.arange(0, EB)
        rb = tl.load(ready_bounds_ptr + w, mask=w < experts, other=0)
        below = (w[None, :] >= 1) & (w[None, :] < experts) & (rb[None, :] <= j[:, None])
        expert = tl.reduce(below.to(tl.int32), 1, tl.standard._sum_combine)
        start = entries_before(ids_ptr, total, experts, expert, expert * 0, CHUNK)
        words = k // 4
        _copy_rows(ready_ptr + j.to(tl.int64) * words, out_words_ptr + (j + start).to(tl.int64) * words,
                   j < tl.load(ready_bounds_ptr + experts), words, BW)


@jit
def _copy_rows(src_rows, dst_rows, live, words, BW: tl.constexpr):
    """`words` int32 words of each live row (src_rows, dst_rows: (rows,) row pointers), BW at a
    time: the rows' loads are issued together (one 2-D access), not one row after another."""
    for w0 in range(0, words, BW):
        offs = w0 + tl.arange(0, BW)
        mask = live[:, None] & (offs < words)[None, :]
        tl.store(dst_rows[:, None] + offs[None, :], tl.load(src_rows[:, None] + offs[None, :], mask=mask), mask=mask)


def _operand_args(ready: LagSlot, rows: int, k: int, experts: int) -> None:
    """Raise LagError unless the slot holds (rows, k) A′ rows and bounds for `experts`."""
    if ready.a_rows.shape != (rows, k) or ready.bounds.shape != (experts + 1,):
        raise LagError(f"READY must hold ({rows}, {k}) rows for {experts} experts; "
                       f"got READY {tuple(ready.a_rows.shape)}, bounds {tuple(ready.bounds.shape)}")


def _operand_buffers(rows: int, k: int, experts: int,
                     device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The combined operand (2·rows, k) uint8 (rows past the used ones are never written), its
    bounds, the READY bounds' snapshot (each (e+1,)) and the GEMM's counters (e+1,): the tile
    counter, then each expert's finished tiles; 16-byte aligned views of one buffer."""
    edges = -(-(experts + 1) // 4) * 4
    bounds = torch.empty((3, edges), dtype=torch.int32, device=device)
    return (torch.empty((2 * rows, k), dtype=torch.uint8, device=device), bounds[0, :experts + 1],
            bounds[1, :experts + 1], bounds[2, :experts + 1])


def _operand(rows: torch.Tensor, bounds: torch.Tensor, ready_bounds: torch.Tensor, counters: torch.Tensor,
             table: RoutingTable, codes: torch.Tensor, alpha: torch.Tensor) -> Operand:
    return Operand(rows.view(torch.float8_e4m3fn), RoutingTable(_rows(rows.shape[0], rows.device), bounds), table,
                   codes, alpha, ready_bounds, counters[:1], counters[1:])


def _copy_block(k: int) -> int:
    """Words a row copy moves per step (k ≤ 8192 bytes: one step)."""
    return min(triton.next_power_of_2(k // 4), _ROW_STEP_WORDS)


def _rows(count: int, device: torch.device) -> torch.Tensor:
    """The combined operand's rows in order (its rows are not gathered again)."""
    return dense_table(count, device).rflat


@functools.lru_cache(maxsize=16)
def _zero_noise(m: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """β = 0 (m,) bf16 and E = 0 (m, 32) e4m3: the clean rows carry no A noise. Made once per
    (m, device), before any graph capture, and never written."""
    return (torch.zeros(m, dtype=torch.bfloat16, device=device),
            torch.zeros((m, 32), dtype=torch.uint8, device=device).view(torch.float8_e4m3fn))


def clean_peel(operand: Operand, f_b: torch.Tensor, f_b_t: torch.Tensor | None = None) -> torch.Tensor:
    """(m, 64) bf16 [0 | A_c′ · F_Bᵀ]: the A peel of the clean rows (peel.a_peel with E_A = 0;
    f_b_t: F_Bᵀ's codes formed once per job)."""
    beta, e_lines = _zero_noise(operand.clean_codes.shape[0], operand.clean_codes.device)
    return a_peel(NoisySide(operand.clean_codes, operand.clean_alpha, beta, e_lines), f_b, f_b_t=f_b_t)
