"""Winners: the device record, its pinned host mirror, the retained operand snapshot, and the
plain proof built from them.

The mined GEMM's first winner claims record[0] with a CAS and writes (instance, tile row, tile
column, ticket). After the GEMM, still on the serving stream and without host syncs:
`retain` copies the winning instance's committed A bytes (and the MoE routing) into buffers that
later launches leave alone (record[12] marks the snapshot taken), then one kernel stores the record
into pinned host memory and, last, its doorbell word (a system-scope release), so the host never
sees a doorbell before the record. The host polls the doorbell, builds the proof from the snapshot (re-hashing
the small A on the CPU) and the job's B side (the kept device tree levels of the weights), and
re-arms.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from proof.blake3tree import _sibling_positions, leaves_for_rows
from proof.int7.plain_proof import LEAF_SIZE, MatrixOpening, MerkleOpening

from kernels.triton_jit import jit, pdl_enabled, pdl_launch
from .blake3 import bytes_from_words
from .mined_gemm import RECORD_WORDS, LagPhase, check_lag, lag_set

# Record words read on the host; the kernels also use [0] (claim) and [12] (snapshot taken).
INSTANCE, TILE_ROW, TILE_COL, TICKET = 1, 2, 3, 4
_BLOCK = 1024


@jit
def _retain_kernel(record_ptr, src_ptr, dst_ptr, per_instance, phase_ptr, phase_words,
                   USE_INDEX: tl.constexpr, PHASED: tl.constexpr, BLOCK: tl.constexpr,
                   WAIT_PRIOR: tl.constexpr = 0):
    """dst ← src[record's instance] once a winner is claimed and not yet snapshotted (PHASED: src
    is set 0 of a LagPhase pair; the READY set is read). WAIT_PRIOR: launched as a programmatic
    dependent (it may start before the GEMM ends), so it waits for that kernel before any read."""
    if WAIT_PRIOR:
        gdc_wait()
    src_ptr += lag_set(phase_ptr, PHASED, 0) * phase_words
    claimed = tl.load(record_ptr)
    taken = tl.load(record_ptr + 12)
    if (claimed == 1) & (taken == 0):
        if USE_INDEX:
            inst = tl.load(record_ptr + 1).to(tl.int64)
        else:
            inst = tl.full((), 0, tl.int64)
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        live = offs < per_instance
        tl.store(dst_ptr + offs, tl.load(src_ptr + inst * per_instance + offs, mask=live), mask=live)


@jit
def _publish_kernel(record_ptr, body_ptr, doorbell_ptr, WORDS: tl.constexpr, FIRST: tl.constexpr,
                    MARK: tl.constexpr, WAIT_PRIOR: tl.constexpr = 0):
    """Store record words [FIRST, WORDS) into the pinned host body (mapped: the GPU writes host
    memory, no copy launches), then record[0] into the host doorbell with release semantics at
    system scope, so a host polling the doorbell never sees it before the body. MARK ≥ 0:
    record[MARK] = 1 once record[0] == 1, on the device and in what is published. An unclaimed
    record writes nothing: the host mirrors were cleared with the record (`rearm`, `reset`), and
    the PCIe stores and the system-scope release are most of this launch's ~4 µs at the end of
    every prefill pass (H100, session 24)."""
    if WAIT_PRIOR:
        gdc_wait()
    words = tl.arange(0, WORDS)
    claimed = tl.load(record_ptr)
    if claimed != 0:
        record = tl.load(record_ptr + words)
        if MARK >= 0:
            record = tl.where((words == MARK) & (claimed == 1), 1, record)
            tl.store(record_ptr + words, record, mask=words == MARK)
        tl.store(body_ptr + words, record, mask=words >= FIRST)
        tl.debug_barrier()
        tl.atomic_xchg(doorbell_ptr, claimed, sem="release", scope="sys")


def publish_record(record: torch.Tensor, body: torch.Tensor, doorbell: torch.Tensor, *, first: int,
                   mark: int = -1) -> None:
    """One launch that publishes a device winner record to pinned host memory: body[first:] ←
    record[first:], then doorbell[0] ← record[0] (shared by the INT7 slot and the FP8 latch; on
    the H200 the two copy launches it replaces took ~7 µs of a decode launch's critical path)."""
    words = record.numel()
    if (record.dtype != torch.int32 or body.dtype != torch.int32 or doorbell.dtype != torch.int32
            or body.numel() < words or doorbell.numel() < 1 or words & (words - 1) or not 0 <= first < words):
        raise ValueError(f"publish: record {record.dtype} {tuple(record.shape)}, body {body.dtype} "
                         f"{tuple(body.shape)}, doorbell {tuple(doorbell.shape)}, first {first} do not fit")
    pdl = pdl_enabled()
    _publish_kernel[(1,)](record, body, doorbell, WORDS=words, FIRST=first, MARK=mark,
                          WAIT_PRIOR=int(pdl), num_warps=1, **pdl_launch(pdl))


class WinnerSlot:
    """One launch's winner record (device), its pinned mirror, and the retained snapshot."""

    def __init__(self, device: torch.device, retained_words: dict[str, int]) -> None:
        pin = device.type == "cuda"
        self.record = torch.zeros(RECORD_WORDS, dtype=torch.int32, device=device)
        self.host_record = torch.zeros(RECORD_WORDS, dtype=torch.int32, device="cpu", pin_memory=pin)
        self.host_doorbell = torch.zeros(1, dtype=torch.int32, device="cpu", pin_memory=pin)
        self.retained = {name: torch.zeros(words, dtype=torch.int32, device=device)
                         for name, words in retained_words.items()}

    def retain(self, name: str, source: torch.Tensor, *, by_instance: bool,
               lag: LagPhase | None = None) -> None:
        """Snapshot source (instances, words...) int32 row of the winner (row 0 if not by_instance);
        lag: source is set 0 of a LagPhase pair and the READY set is snapshotted."""
        dst = self.retained[name]
        per_instance = dst.numel()
        src = source.contiguous().view(-1)
        if src.numel() != per_instance * (source.shape[0] if by_instance else 1):
            raise ValueError(f"retain {name}: source of {src.numel()} words does not match "
                             f"{per_instance} words per instance")
        if lag is not None:
            check_lag(lag)
        pdl = pdl_enabled()
        _retain_kernel[(triton.cdiv(per_instance, _BLOCK),)](
            self.record, src, dst, per_instance, self.record if lag is None else lag.phase,
            0 if lag is None else lag.words, USE_INDEX=int(by_instance), PHASED=int(lag is not None),
            BLOCK=_BLOCK, WAIT_PRIOR=int(pdl), **pdl_launch(pdl))

    def publish(self) -> None:
        """Mark the snapshot taken, then write the record and, last, the doorbell to the host (one
        kernel storing into the pinned mirrors)."""
        publish_record(self.record, self.host_record, self.host_doorbell, first=0, mark=12)

    def rang(self) -> bool:
        """Whether the doorbell is set (read after the launch's stream work is complete)."""
        return int(self.host_doorbell[0]) == 1

    def rearm(self) -> None:
        """Clear the device record and the doorbell so the next launch can win again."""
        self.record.zero_()
        self.host_doorbell.zero_()


def merkle_opening(flat: torch.Tensor, levels: Sequence[torch.Tensor], root: torch.Tensor,
                   leaf_indices: Sequence[int]) -> MerkleOpening:
    """Open leaves of one committed buffer from its kept tree levels (no re-hashing).

    flat: the instance's committed bytes (int8/uint8, unpadded); levels: (count, 8) int32 per
    level, leaves first; root: (8,) int32.
    """
    total = max(1, math.ceil(flat.numel() / LEAF_SIZE))
    indices = tuple(int(i) for i in leaf_indices)
    leaves = tuple(_leaf(flat, i) for i in indices)
    siblings = tuple(bytes_from_words(levels[level][i]) for level, i in _sibling_positions(indices, total))
    return MerkleOpening(leaves, indices, total, bytes_from_words(root), siblings)


def _leaf(flat: torch.Tensor, index: int) -> bytes:
    """Leaf `index` of a committed buffer (zero-padded past its end), copied to the host."""
    raw = flat[index * LEAF_SIZE:(index + 1) * LEAF_SIZE].detach().to("cpu").contiguous()
    data = raw.view(torch.uint8).numpy().tobytes()
    return data + bytes(LEAF_SIZE - len(data))


def row_opening(flat: torch.Tensor, levels: Sequence[torch.Tensor], root: torch.Tensor,
                rows: Sequence[int], row_bytes: int) -> MatrixOpening:
    """Open full rows of a row-major committed matrix: every leaf they touch."""
    leaves = leaves_for_rows(rows, row_bytes, LEAF_SIZE)
    return MatrixOpening(merkle_opening(flat, levels, root, leaves), tuple(int(r) for r in rows))
