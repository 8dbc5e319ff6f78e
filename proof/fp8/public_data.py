"""The V4 consensus statement `public_data`: 244 bytes dense, plus the MoE tail (§12).

Layout (pearl-research-labs/pearl `zk-pow/src/v4/api/public_params.rs` @
9f5cead5d95cb5669eb8094e005c53dc1276b9c3, `to_bytes`/`from_bytes`, WIRE_SIZE = 244):

    σ_d(108) ‖ pB(21) ‖ HB(32) ‖ pA(11|13) ‖ HA(32) ‖ tA u32 ‖ tB u32 ‖ J(32) ‖ [MoE tail]
    MoE tail = w u16 ‖ O_{w−1} u32 ‖ O_w u32 ‖ O_{e−1} u32 ‖ HR(32) ‖ HO(32) ‖ I_A (h × u32)

HA/HB are the folded per-operand digests. Decoding requires the canonical encoding and runs the
statement checks (field rules, layout, tile fit, MoE bounds, the BLAKE3 work bound).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from proof.fp8.params import (HEADER_SIZE, PREQUANT_BLOCK, HashId, JobParams, MoeParams, ParamsError,
                              ByteCursor, check_lottery_layout, parse_p_a, parse_p_b)

DENSE_SIZE = 244
MAX_ROUTING_ENTRIES = 1 << 29
MAX_BLAKE3_WORK_BLOCKS = (1 << 22) // 64


@dataclass(frozen=True)
class MoeStatement:
    """The public MoE fields: winner, routing counts around it, HR, HO and the opened tokens I_A."""

    w: int
    o_w_prev: int
    o_w: int
    o_last: int
    hash_routing: bytes
    hash_offsets: bytes
    i_a: tuple[int, ...]

    def check(self, job: JobParams, t_a: int) -> None:
        moe, a = job.moe, job.a
        assert moe is not None
        if not 0 <= self.w < moe.experts:
            raise ParamsError(f"winner expert w={self.w} must be < e={moe.experts}")
        if len(self.i_a) != a.pattern.tile_size:
            raise ParamsError(f"I_A holds {len(self.i_a)} rows, the tile has {a.pattern.tile_size}")
        if any(x >= y for x, y in zip(self.i_a, self.i_a[1:])):
            raise ParamsError("I_A must be strictly increasing")
        if any(i >= a.num_rows for i in self.i_a):
            raise ParamsError(f"I_A must lie in [0, m={a.num_rows})")
        if not self.o_w_prev <= self.o_w <= self.o_last:
            raise ParamsError("routing offsets must satisfy O_{w-1} <= O_w <= O_{e-1}")
        if self.w == 0 and self.o_w_prev != 0:
            raise ParamsError("O_{w-1} must be 0 for w = 0")
        if self.w == moe.experts - 1 and self.o_w != self.o_last:
            raise ParamsError("O_w must equal O_{e-1} for the last expert")
        if self.o_w - self.o_w_prev > a.num_rows:
            raise ParamsError("the winner's routing slice is longer than m")
        if self.o_last > MAX_ROUTING_ENTRIES:
            raise ParamsError("O_{e-1} must be <= 2^29")
        if t_a + a.pattern.tile_max >= self.o_w - self.o_w_prev:
            raise ParamsError(f"tA={t_a} + tile max must be < |R[w]|={self.o_w - self.o_w_prev}")


@dataclass(frozen=True)
class PublicData:
    """The V4 statement: the job, HA/HB, the tile bases, the ticket J and the MoE fields."""

    job: JobParams
    hash_b: bytes
    hash_a: bytes
    t_a: int
    t_b: int
    jackpot: bytes
    moe: MoeStatement | None = None

    def a_inner_rows(self) -> list[int]:
        """The tile's A rows in the lattice (expert-local for MoE)."""
        return [self.t_a + o for o in self.job.a.pattern.tile_offsets()]

    def a_rows(self) -> list[int]:
        """The committed A rows the proof opens: I_A for MoE, the tile rows for dense."""
        return list(self.moe.i_a) if self.moe else self.a_inner_rows()

    def b_rows(self) -> list[int]:
        """The committed B rows the proof opens (offset by w·η for MoE)."""
        offset = self.moe.w * self.job.expert_rows if self.moe else 0
        return [offset + self.t_b + o for o in self.job.b.pattern.tile_offsets()]

    def check(self) -> None:
        """The statement rules of PublicParams::try_new; raises ParamsError."""
        job = self.job
        job.check()
        if (job.moe is None) != (self.moe is None):
            raise ParamsError("the MoE statement must be present iff the job is MoE")
        if self.moe:
            self.moe.check(job, self.t_a)
        a, b = job.a.pattern, job.b.pattern
        if not a.offset_is_valid(self.t_a):
            raise ParamsError(f"tA={self.t_a} is not a valid tile base for the A pattern")
        if not b.offset_is_valid(self.t_b):
            raise ParamsError(f"tB={self.t_b} is not a valid tile base for the B pattern")
        if self.t_a + a.tile_max >= job.a.num_rows:
            raise ParamsError(f"tA={self.t_a} + tile max must be < m={job.a.num_rows}")
        if self.t_b + b.tile_max >= job.expert_rows:
            raise ParamsError(f"tB={self.t_b} + tile max must be < {job.expert_rows} B rows")
        if self._blake3_work_blocks() > MAX_BLAKE3_WORK_BLOCKS:
            raise ParamsError("the openings' BLAKE3 work exceeds 2^22 bytes")

    def _blake3_work_blocks(self) -> int:
        job = self.job
        k = job.common.k
        scale_row = 2 * (k // PREQUANT_BLOCK)
        count = 3  # two operand folds and the ticket
        for rows_total, row_bytes, hash_id, rows in (
                (job.a.num_rows, k, job.a.hash_id, self.a_rows()),
                (job.b.num_rows, k, job.b.hash_id, self.b_rows()),
                (job.a.num_rows, scale_row, job.a.hash_id, self.a_rows()),
                (job.b.num_rows, scale_row, job.b.hash_id, self.b_rows())):
            spans = [(r * row_bytes, (r + 1) * row_bytes) for r in rows]
            count += _tree_block_bound(rows_total * row_bytes, hash_id, spans)
        if self.moe and job.moe:
            count += _tree_block_bound(self.moe.o_last * 4, job.moe.hash_id_r,
                                       [(self.moe.o_w_prev * 4, self.moe.o_w * 4)])
            offsets_bytes = job.moe.experts * 4
            count += _tree_block_bound(offsets_bytes, job.moe.hash_id_o, [(0, offsets_bytes)])
        return count

    def to_bytes(self) -> bytes:
        out = [self.job.ancestor_header, self.job.p_b(), _d(self.hash_b), self.job.p_a(), _d(self.hash_a),
               struct.pack("<II", self.t_a, self.t_b), _d(self.jackpot)]
        if self.moe:
            m = self.moe
            out += [struct.pack("<HIII", m.w, m.o_w_prev, m.o_w, m.o_last), _d(m.hash_routing),
                    _d(m.hash_offsets), struct.pack(f"<{len(m.i_a)}I", *m.i_a)]
        return b"".join(out)

    @classmethod
    def from_bytes(cls, data: bytes) -> "PublicData":
        """Decode, check and require the canonical encoding; raises ParamsError."""
        reader = ByteCursor(data, "V4 public data")
        ancestor = reader.take(HEADER_SIZE)
        common, b, experts = parse_p_b(reader)
        hash_b = reader.take(32)
        a, moe_ids = parse_p_a(reader, experts)
        hash_a = reader.take(32)
        t_a, t_b = reader.unpack("<II")
        jackpot = reader.take(32)
        moe_params, moe = None, None
        if experts:
            assert moe_ids is not None
            moe_params = MoeParams(experts, *moe_ids)
            w, o_w_prev, o_w, o_last = reader.unpack("<HIII")
            hash_routing, hash_offsets = reader.take(32), reader.take(32)
            check_lottery_layout(a.pattern, b.pattern)  # bounds |I_A| before reading it
            h = a.pattern.tile_size
            i_a = reader.unpack(f"<{h}I")
            moe = MoeStatement(w, o_w_prev, o_w, o_last, hash_routing, hash_offsets, tuple(i_a))
        reader.finish()
        statement = cls(JobParams(ancestor, common, a, b, moe_params), hash_b, hash_a, t_a, t_b, jackpot, moe)
        statement.check()
        if statement.to_bytes() != bytes(data):
            raise ParamsError("non-canonical V4 public data encoding")
        return statement


def _tree_block_bound(raw_bytes: int, hash_id: HashId, spans: list[tuple[int, int]]) -> int:
    """Upper bound on the compressions that authenticating `spans` of one tree costs (public_params.rs)."""
    chunk = hash_id.leaf_size
    total_chunks = -(-raw_bytes // chunk)
    if total_chunks == 0:
        raise ParamsError("a committed tree must hold at least one leaf")
    ranges = sorted((s // chunk, -(-e // chunk)) for s, e in spans if s < e)
    merged: list[list[int]] = []
    for start, end in ranges:
        if end > total_chunks:
            raise ParamsError("an opening exceeds its tree")
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    depth = (total_chunks - 1).bit_length()
    return sum((end - start) * (chunk // 64 + 1) + 2 * (depth + 1) for start, end in merged)


def _d(value: bytes) -> bytes:
    if len(value) != 32:
        raise ParamsError(f"a public-data digest must be 32 bytes, got {len(value)}")
    return bytes(value)
