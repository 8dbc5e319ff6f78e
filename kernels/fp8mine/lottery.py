"""The lottery on the device (§9): fold each 4×64 tile of the pre-peel accumulator, hash it,
compare with the threshold, and latch the first winner into a record.

Lattice (Hopper 4×64, expert-local): tile (t, c) of expert w covers rows 4t..4t+3 of w's rows and
columns 64c..64c+63 of its n_e. Lane j = 4·row + g folds row `row` at columns 8·nb + 2·g + c in
(nb, c) order, lane = rotl32(lane·0x9E3779B1 + bits, 13); the 16 lanes are one 64-byte block and
J = one keyed compression under the jackpot key (int7's compression function). A tile wins iff
LE256(J) ≤ threshold. The first winner CASes a lock that only the host re-arms, writes the
record (Pearl's word layout, §9.5), raises the `fresh` flag for the payload copy, and stores
STATUS last with release semantics. The record lives in device memory; `LotteryLatch.publish`
copies it to pinned host memory in two stream-ordered copies, body first and STATUS last, so the
host never sees a doorbell before the fields.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
import triton
import triton.language as tl

from kernels.triton_jit import jit
from kernels.int7.blake3 import compress, store_words8, words_from_bytes
from kernels.int7.winner import publish_record
from proof.fp8.lottery import threshold, threshold_bytes

from .routing import RowTiles

TILE_ROWS = 4
TILE_COLS = 64
RECORD_WORDS = 64
MAGIC = (0x49473031, 0x48495453)
# Record word offsets (Pearl's HitSignal layout; J at 40..47 is this package's addition).
STATUS, M, N, K, TILE_ROW, TILE_COLUMN, LTILE_ROWS, LTILE_COLS = range(8)
CODES_BYTES, SCALES_BYTES, LAYER_ID = 8, 9, 10
TARGET, HASH_A, HASH_B, MAGIC_AT, GROUP_ID, TICKET = 12, 20, 28, 36, 38, 40

_PAYLOAD_COPIES = 4  # word ranges per payload launch
_PAYLOAD_PROGRAMS = 32  # the payload programs stride over the words (decode: 3 steps, only on a win)
_PAYLOAD_BLOCK = 1024
# Row tiles per lottery program, at every size. 128 at prefill (one tile per thread of the
# compression) measured slower on the H200: GLM-5 prefill (16384 row tiles × 64 columns) 542 µs at
# 128 against 433 / 412 / 409 at 64 / 32 / 16 (256 spilled: 18 ms), same tickets.
TILES_PER_PROGRAM = 32
# Tiles per program on folded lanes (`run_folded`): nothing is folded, so a program's 4 warps
# compress one tile a thread.
FOLDED_TILES_PER_PROGRAM = 128
# Folded lanes are loaded as 16 vectors of one word a tile (`_message_words`), not as one (BT, 16)
# tile split by 16 reductions: same tickets, and on the H200 (session 11, same run) GLM-5 prefill
# 91.0 against 198.4 µs, decode 5.7 against 7.6.


class LotteryError(ValueError):
    """Bad input to the device lottery."""


@jit
def _le256(h0, h1, h2, h3, h4, h5, h6, h7, t_ptr):
    """LE256(h) <= LE256(threshold), word 7 most significant."""
    le = h0 <= tl.load(t_ptr + 0).to(tl.uint32, bitcast=True)
    t = tl.load(t_ptr + 1).to(tl.uint32, bitcast=True)
    le = (h1 < t) | ((h1 == t) & le)
    t = tl.load(t_ptr + 2).to(tl.uint32, bitcast=True)
    le = (h2 < t) | ((h2 == t) & le)
    t = tl.load(t_ptr + 3).to(tl.uint32, bitcast=True)
    le = (h3 < t) | ((h3 == t) & le)
    t = tl.load(t_ptr + 4).to(tl.uint32, bitcast=True)
    le = (h4 < t) | ((h4 == t) & le)
    t = tl.load(t_ptr + 5).to(tl.uint32, bitcast=True)
    le = (h5 < t) | ((h5 == t) & le)
    t = tl.load(t_ptr + 6).to(tl.uint32, bitcast=True)
    le = (h6 < t) | ((h6 == t) & le)
    t = tl.load(t_ptr + 7).to(tl.uint32, bitcast=True)
    return (h7 < t) | ((h7 == t) & le)


@jit
def _fold(pair_ptr, row_base, col_base, live, n, BT: tl.constexpr):
    """The 16 lanes of BT tiles as a (BT, 16) uint32 tensor: lane j = 4·row + g folds row `row`
    at columns 8·nb + 2·g + c. The words of columns 8·nb + 2·g and +1 are one 8-byte load
    (`pair_ptr` is the accumulator as int64 pairs, low half = the even column): 8 vector loads per
    lane instead of 16 word loads, and a group of 4 lanes reads one 32-byte sector per load."""
    lane = tl.arange(0, 16)
    pair = (row_base[:, None] + lane[None, :] // 4) * (n // 2) + col_base // 2 + lane[None, :] % 4
    mask = live[:, None] & (lane[None, :] >= 0)
    lanes = tl.full((BT, 16), 0, tl.uint32)
    for nb in tl.static_range(8):
        both = tl.load(pair_ptr + pair + 4 * nb, mask=mask, other=0)
        for c in tl.static_range(2):
            word = (both >> (32 * c)).to(tl.uint32)  # truncation keeps the low word
            x = lanes * 0x9E3779B1 + word
            lanes = (x << 13) | (x >> 19)
    return lanes


@jit
def _lane(lanes, j):
    """Column j of the (BT, 16) lanes tensor."""
    return tl.reduce(tl.where(tl.arange(0, 16)[None, :] == j, lanes, 0), 1, tl.standard._sum_combine)


@jit
def _pick(values, slot_ids, slot):
    """The entry of `values` at `slot` as a scalar (a masked sum). Reductions here call tl.reduce
    with tl.sum's / tl.min's own combines: triton's jit'd tl.sum does not run under int7's
    interpreter wrapper, and the interpreter reduces these combines with numpy."""
    return tl.reduce(tl.where(slot_ids == slot, values, 0), 0, tl.standard._sum_combine)


@jit
def _lane_words(lanes):
    """The 16 columns of a (BT, 16) lanes tensor as (BT,) vectors."""
    return (_lane(lanes, 0), _lane(lanes, 1), _lane(lanes, 2), _lane(lanes, 3),
            _lane(lanes, 4), _lane(lanes, 5), _lane(lanes, 6), _lane(lanes, 7),
            _lane(lanes, 8), _lane(lanes, 9), _lane(lanes, 10), _lane(lanes, 11),
            _lane(lanes, 12), _lane(lanes, 13), _lane(lanes, 14), _lane(lanes, 15))


@jit
def _word(ptr, base, j, live):
    return tl.load(ptr + base + j, mask=live, other=0).to(tl.uint32, bitcast=True)


@jit
def _message_words(ptr, base, live):
    """The 16 words of each tile's stored message at word offsets `base` (BT,), as (BT,) vectors:
    16 loads of one word a tile, so no (BT, 16) tensor is split by reductions."""
    return (_word(ptr, base, 0, live), _word(ptr, base, 1, live), _word(ptr, base, 2, live),
            _word(ptr, base, 3, live), _word(ptr, base, 4, live), _word(ptr, base, 5, live),
            _word(ptr, base, 6, live), _word(ptr, base, 7, live), _word(ptr, base, 8, live),
            _word(ptr, base, 9, live), _word(ptr, base, 10, live), _word(ptr, base, 11, live),
            _word(ptr, base, 12, live), _word(ptr, base, 13, live), _word(ptr, base, 14, live),
            _word(ptr, base, 15, live))


@jit
def _mine_tiles(m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15,
                live, col, local, expert, key_ptr, thr_ptr, seed_b_ptr,
                lock_ptr, record_ptr, fresh_ptr, header_ptr, BT: tl.constexpr):
    """Hash and compare BT tiles' messages (16 (BT,) uint32 words; column tile `col`, `local`
    and `expert` per tile); the lowest winner among them CASes the lock and writes the record.
    Returns the tickets' 8 words."""
    slot_ids = tl.arange(0, BT)
    zero = tl.full((BT,), 0, tl.uint32)
    k0 = zero + tl.load(key_ptr + 0).to(tl.uint32, bitcast=True)
    k1 = zero + tl.load(key_ptr + 1).to(tl.uint32, bitcast=True)
    k2 = zero + tl.load(key_ptr + 2).to(tl.uint32, bitcast=True)
    k3 = zero + tl.load(key_ptr + 3).to(tl.uint32, bitcast=True)
    k4 = zero + tl.load(key_ptr + 4).to(tl.uint32, bitcast=True)
    k5 = zero + tl.load(key_ptr + 5).to(tl.uint32, bitcast=True)
    k6 = zero + tl.load(key_ptr + 6).to(tl.uint32, bitcast=True)
    k7 = zero + tl.load(key_ptr + 7).to(tl.uint32, bitcast=True)
    h0, h1, h2, h3, h4, h5, h6, h7 = compress(
        k0, k1, k2, k3, k4, k5, k6, k7,
        m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15, zero, zero + 27,
        True)  # rounds unrolled: 480 → 1000 static SASS, 55 → 40 registers, ~23 % fewer issued a tile
    wins = _le256(h0, h1, h2, h3, h4, h5, h6, h7, thr_ptr) & live
    slot = tl.reduce(tl.where(wins, slot_ids, BT), 0, tl.standard._elementwise_min)
    if slot < BT:
        if tl.atomic_cas(lock_ptr, 0, 1) == 0:
            header = tl.arange(0, 16)
            tl.store(record_ptr + header, tl.load(header_ptr + header), mask=header > 0)
            tl.store(record_ptr + 36, 0x49473031)
            tl.store(record_ptr + 37, 0x48495453)
            tl.store(record_ptr + 4, _pick(local, slot_ids, slot))
            tl.store(record_ptr + 5, _pick(col, slot_ids, slot))
            tl.store(record_ptr + 38, _pick(expert, slot_ids, slot))
            tl.store(record_ptr + 40, _pick(h0.to(tl.int32, bitcast=True), slot_ids, slot))
            tl.store(record_ptr + 41, _pick(h1.to(tl.int32, bitcast=True), slot_ids, slot))
            tl.store(record_ptr + 42, _pick(h2.to(tl.int32, bitcast=True), slot_ids, slot))
            tl.store(record_ptr + 43, _pick(h3.to(tl.int32, bitcast=True), slot_ids, slot))
            tl.store(record_ptr + 44, _pick(h4.to(tl.int32, bitcast=True), slot_ids, slot))
            tl.store(record_ptr + 45, _pick(h5.to(tl.int32, bitcast=True), slot_ids, slot))
            tl.store(record_ptr + 46, _pick(h6.to(tl.int32, bitcast=True), slot_ids, slot))
            tl.store(record_ptr + 47, _pick(h7.to(tl.int32, bitcast=True), slot_ids, slot))
            words = tl.arange(0, 8)
            tl.store(record_ptr + 12 + words, tl.load(thr_ptr + words))
            tl.store(record_ptr + 20 + words, tl.load(key_ptr + words))
            tl.store(record_ptr + 28 + words, tl.load(seed_b_ptr + words))
            tl.store(fresh_ptr, 1)
            tl.atomic_xchg(record_ptr, 1, sem="release")
    return h0, h1, h2, h3, h4, h5, h6, h7


@jit
def _lottery_kernel(src_ptr, n, tile_row_ptr, tile_expert_ptr, tile_local_ptr, num_tiles,
                    key_ptr, thr_ptr, seed_b_ptr, lock_ptr, record_ptr, fresh_ptr, header_ptr,
                    tickets_ptr, BT: tl.constexpr, STORE_TICKETS: tl.constexpr, FOLDED: tl.constexpr):
    """BT tiles, each (a slot of the row-tile map: its row_start is the tile's accumulator row; a
    64-column tile c). src: the accumulator as int64 word pairs, BT slots × the column tile
    program_id(1); or (FOLDED) the tiles' folded lanes, int32 (rows // 4, n / 64, 16), tile
    (row_start, c) at [row_start // 4, c], loaded as 16 vectors of one word a tile, for BT
    consecutive (slot, c) pairs, c fastest: neighbouring threads read neighbouring 64-byte
    messages. With the slot fastest, neighbours read 4 KB apart at n = 4096 and the launch took
    76.3 µs where the same tiles 64 B apart took 51.9 (H100, session 20; GLM-5 prefill's 1.05 M
    tiles)."""
    cols = n // 64
    if FOLDED:
        pair = tl.program_id(0) * BT + tl.arange(0, BT)  # < 2^31: 549 G accumulator cells
        slots = pair // cols
        col = pair % cols
    else:
        slots = tl.program_id(0) * BT + tl.arange(0, BT)
        col = tl.full((BT,), 0, tl.int32) + tl.program_id(1)
    in_range = slots < num_tiles
    row_start = tl.load(tile_row_ptr + slots, mask=in_range, other=-1)
    live = in_range & (row_start >= 0)
    row_base = tl.where(live, row_start, 0).to(tl.int64)
    local = tl.load(tile_local_ptr + slots, mask=live, other=0)
    expert = tl.load(tile_expert_ptr + slots, mask=live, other=0)
    first_word = ((row_base // 4) * cols + col) * 16
    if FOLDED:
        message = _message_words(src_ptr, first_word, live)
    else:
        message = _lane_words(_fold(src_ptr, row_base, tl.program_id(1) * 64, live, n, BT))
    m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15 = message
    h0, h1, h2, h3, h4, h5, h6, h7 = _mine_tiles(
        m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15,
        live, col, local, expert, key_ptr, thr_ptr, seed_b_ptr,
        lock_ptr, record_ptr, fresh_ptr, header_ptr, BT)
    if STORE_TICKETS:  # checks only: every tile's ticket at [slot, column tile, word]
        base = tickets_ptr + (slots.to(tl.int64) * cols + col) * 8
        store_words8(base, h0, h1, h2, h3, h4, h5, h6, h7, live)


@jit
def _copy_words(src_ptr, dst_ptr, nwords, first, stride, BLOCK: tl.constexpr):
    """Words first, first + stride, … (BLOCK at a time) of src → dst."""
    offs = tl.arange(0, BLOCK)
    for start in range(first, nwords, stride):
        live = start + offs < nwords
        tl.store(dst_ptr + start + offs, tl.load(src_ptr + start + offs, mask=live), mask=live)


@jit
def _payload_kernel(fresh_ptr, done_ptr, src0, dst0, n0, src1, dst1, n1, src2, dst2, n2, src3, dst3, n3,
                    clear, BLOCK: tl.constexpr):
    """Copy up to four src → dst word ranges (the programs stride over each) only in the launch
    whose winner raised `fresh`; with `clear`, the last program to finish (an acq_rel counter,
    reset by it) lowers `fresh` — no separate fill launch behind the payload."""
    if tl.load(fresh_ptr) != 0:
        first = tl.program_id(0) * BLOCK
        stride = tl.num_programs(0) * BLOCK
        _copy_words(src0, dst0, n0, first, stride, BLOCK)
        _copy_words(src1, dst1, n1, first, stride, BLOCK)
        _copy_words(src2, dst2, n2, first, stride, BLOCK)
        _copy_words(src3, dst3, n3, first, stride, BLOCK)
    if clear != 0:
        tl.debug_barrier()  # every thread has read `fresh` before the release below
        if tl.atomic_add(done_ptr, 1, sem="acq_rel") == tl.num_programs(0) - 1:
            tl.store(fresh_ptr, 0)
            tl.store(done_ptr, 0)


@dataclass(frozen=True)
class WinnerRecord:
    """A published winner as the host reads it."""

    m: int
    n: int
    k: int
    tile_row: int
    tile_column: int
    group_id: int
    layer_id: int
    threshold: int
    pow_key: bytes
    seed_b: bytes
    ticket: bytes
    payload_bytes: tuple[int, int]


class LotteryBuffers(NamedTuple):
    """The device words a launch's lottery reads and writes (int32), in `_mine_tiles` order."""

    key: torch.Tensor  # (8,) the jackpot key
    threshold: torch.Tensor  # (8,) LE threshold words
    seed_b: torch.Tensor  # (8,)
    lock: torch.Tensor  # (1,) taken by the first winner; only the host re-arms it
    record: torch.Tensor  # (64,) Pearl's word layout, STATUS last
    fresh: torch.Tensor  # (1,) raised by the winner for the payload copy
    header: torch.Tensor  # (16,) the launch-shape words a winner copies


def threshold_words(target: int, k: int, device: torch.device | str) -> torch.Tensor:
    """The 4×64 tile's threshold min(target·4·64·k, 2²⁵⁶−1) as 8 LE int32 words."""
    return words_from_bytes(threshold_bytes(threshold(target, TILE_ROWS, TILE_COLS, k)), device)


class LotteryLatch:
    """The first-winner latch of one device: lock, device record, payload buffers, pinned copy.

    `payload` maps names to (device buffer) tensors that receive a snapshot of the launch's
    retained inputs (A planes, routing) in the launch that wins; the host reads them after the
    doorbell. Re-arm with `reset()` on the serving stream once the record has been consumed.
    """

    def __init__(self, device: torch.device | str, payload_shapes: dict[str, tuple[tuple[int, ...], torch.dtype]]):
        self.device = torch.device(device)
        self.lock = torch.zeros(1, dtype=torch.int32, device=self.device)
        self.fresh = torch.zeros(1, dtype=torch.int32, device=self.device)
        self.record = torch.zeros(RECORD_WORDS, dtype=torch.int32, device=self.device)
        pinned = self.device.type == "cuda"
        self.host = torch.zeros(RECORD_WORDS, dtype=torch.int32, device="cpu", pin_memory=pinned)
        self.payload = {name: torch.zeros(shape, dtype=dtype, device=self.device)
                        for name, (shape, dtype) in payload_shapes.items()}
        self.header = torch.zeros(16, dtype=torch.int32, device=self.device)
        self._done = torch.zeros(1, dtype=torch.int32, device=self.device)  # the payload's program count

    def set_header(self, m: int, n: int, k: int, layer_id: int, codes_bytes: int, scales_bytes: int) -> None:
        """The launch-shape words a winner copies into its record (words 1..10, magic)."""
        words = np.zeros(16, dtype=np.int64)
        words[[M, N, K, LTILE_ROWS, LTILE_COLS, CODES_BYTES, SCALES_BYTES, LAYER_ID]] = (
            m, n, k, TILE_ROWS, TILE_COLS, codes_bytes, scales_bytes, layer_id)
        self.header.copy_(torch.from_numpy(words.astype(np.int32)))

    def run(self, acc: torch.Tensor, tiles: RowTiles, pow_key: torch.Tensor, threshold_: torch.Tensor,
            seed_b: torch.Tensor, sources: dict[str, torch.Tensor],
            tickets: torch.Tensor | None = None) -> None:
        """Fold, hash and compare every tile of `acc` (rows, n_e) fp32; latch the first winner;
        then `capture(sources)`. The mined pass runs this right after its GEMM.

        `tickets`, for checks: an int32 (row tiles, n_e/64, 8) tensor that receives every ticket.
        """
        if acc.dtype != torch.float32 or acc.dim() != 2 or acc.shape[1] % TILE_COLS:
            raise LotteryError(f"acc must be fp32 (rows, n_e) with n_e % 64 == 0, got {acc.dtype} {tuple(acc.shape)}")
        self._draw(acc.contiguous().view(torch.int64), acc.shape[1], False, tiles, pow_key, threshold_, seed_b,
                   sources, tickets)

    def run_folded(self, lanes: torch.Tensor, tiles: RowTiles, pow_key: torch.Tensor, threshold_: torch.Tensor,
                   seed_b: torch.Tensor, sources: dict[str, torch.Tensor],
                   tickets: torch.Tensor | None = None) -> None:
        """`run` on tiles already folded (by the GEMM's epilogue): `lanes` int32 (rows // 4,
        n_e / 64, 16), the 16 lanes of the tile whose first accumulator row is r at [r // 4, c]."""
        if lanes.dtype != torch.int32 or lanes.dim() != 3 or lanes.shape[2] != 16:
            raise LotteryError(f"lanes must be int32 (rows // 4, n_e / 64, 16), got {lanes.dtype} {tuple(lanes.shape)}")
        self._draw(lanes.contiguous(), lanes.shape[1] * TILE_COLS, True, tiles, pow_key, threshold_, seed_b,
                   sources, tickets)

    def _draw(self, src: torch.Tensor, n: int, folded: bool, tiles: RowTiles, pow_key: torch.Tensor,
              threshold_: torch.Tensor, seed_b: torch.Tensor, sources: dict[str, torch.Tensor],
              tickets: torch.Tensor | None) -> None:
        num_tiles = tiles.row_start.shape[0]
        per_program = FOLDED_TILES_PER_PROGRAM if folded else TILES_PER_PROGRAM
        if folded:  # (slot, column tile) pairs, the column fastest
            grid = (max(1, triton.cdiv(num_tiles * (n // TILE_COLS), per_program)), 1)
        else:
            grid = (max(1, triton.cdiv(num_tiles, per_program)), n // TILE_COLS)
        tail = (*self.buffers(pow_key, threshold_, seed_b), self.record if tickets is None else tickets)
        _lottery_kernel[grid](src, n, tiles.row_start, tiles.expert, tiles.local, num_tiles, *tail,
                              BT=per_program, STORE_TICKETS=tickets is not None, FOLDED=folded)
        self.capture(sources)

    def buffers(self, pow_key: torch.Tensor, threshold_: torch.Tensor, seed_b: torch.Tensor) -> LotteryBuffers:
        """This latch's words with a launch's key, threshold and seedB: what the lottery kernel
        reads and writes."""
        return LotteryBuffers(pow_key.contiguous().view(-1), threshold_.contiguous().view(-1),
                              seed_b.contiguous().view(-1), self.lock, self.record, self.fresh, self.header)

    def capture(self, sources: dict[str, torch.Tensor]) -> None:
        """After a mining pass: snapshot `sources` into the payload if this launch's winner raised
        `fresh` (conditional kernels, no host sync), then lower the flag."""
        copies = [(src.contiguous().view(torch.int32).view(-1), self.payload[name].view(torch.int32).view(-1))
                  for name, src in sources.items()]
        for first in range(0, max(len(copies), 1), _PAYLOAD_COPIES):
            group = copies[first:first + _PAYLOAD_COPIES]
            args = [arg for src, dst in group for arg in (src, dst, src.numel())]
            args += [self.fresh, self.fresh, 0] * (_PAYLOAD_COPIES - len(group))
            longest = max([src.numel() for src, _ in group], default=0)
            programs = min(max(1, triton.cdiv(longest, _PAYLOAD_BLOCK)), _PAYLOAD_PROGRAMS)
            _payload_kernel[(programs,)](self.fresh, self._done, *args, int(first + _PAYLOAD_COPIES >= len(copies)),
                                         BLOCK=_PAYLOAD_BLOCK)

    def publish(self) -> None:
        """Write the record into the pinned host copy: the body first, STATUS last (one kernel)."""
        publish_record(self.record, self.host, self.host, first=1)

    def poll(self) -> WinnerRecord | None:
        """The published winner, or None; raises LotteryError on a malformed record."""
        words = self.host.numpy().astype(np.int64) & 0xFFFFFFFF
        if words[STATUS] == 0:
            return None
        if tuple(words[MAGIC_AT:MAGIC_AT + 2]) != MAGIC:
            raise LotteryError("winner record has a bad magic")
        if min(words[M], words[N], words[K]) <= 0 or words[K] % 32:
            raise LotteryError(f"winner record has a bad shape m={words[M]} n={words[N]} k={words[K]}")
        raw = words.astype("<u4")
        return WinnerRecord(
            m=int(words[M]), n=int(words[N]), k=int(words[K]), tile_row=int(words[TILE_ROW]),
            tile_column=int(words[TILE_COLUMN]), group_id=int(words[GROUP_ID]), layer_id=int(words[LAYER_ID]),
            threshold=int.from_bytes(raw[TARGET:TARGET + 8].tobytes(), "little"),
            pow_key=raw[HASH_A:HASH_A + 8].tobytes(), seed_b=raw[HASH_B:HASH_B + 8].tobytes(),
            ticket=raw[TICKET:TICKET + 8].tobytes(),
            payload_bytes=(int(words[CODES_BYTES]), int(words[SCALES_BYTES])))

    def reset(self) -> None:
        """Re-arm: clear the record, the flag and the lock (on the current stream)."""
        self.record.zero_()
        self.fresh.zero_()
        self.lock.zero_()
        self.host.zero_()
