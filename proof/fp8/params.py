"""FP8 (certificate V4) parameter tuples and their wire encodings (fp8-and-integration.md §2, §9.1).

Everything a V4 statement commits to about the job's shape lives here: the enumerations (HashId,
Quant, Device), the committed axis patterns that define the lottery tile, the lottery layout
limits, and the parameter blocks pB / pA that enter the seed chain and the public data.
All integers are little-endian.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Iterable

HEADER_SIZE = 108  # a complete block header σ_d (proof commitment included)
INCOMPLETE_HEADER_SIZE = 76  # the proposed header σ̂
STATE_WINDOW_DEPTH = 4  # σ_d is one of the 4 most recent ancestors
PROTOCOL_RANK = 32
MIN_K = 1 << 10
MAX_K = 1 << 16
MAX_NUM_ROWS = 1 << 24
MAX_EXPERTS = 1024
PREQUANT_BLOCK = 8  # int8 codes per BF16 scale along k


class ParamsError(ValueError):
    """A parameter tuple or encoding that the V4 rules reject."""


class HashId(IntEnum):
    """Merkle leaf length of a committed plane (one byte on the wire)."""

    CHUNK_128 = 0
    CHUNK_256 = 1
    CHUNK_512 = 2
    CHUNK_1024 = 3

    @property
    def leaf_size(self) -> int:
        return 128 << int(self)

    @classmethod
    def decode(cls, value: int) -> "HashId":
        try:
            return cls(value)
        except ValueError:
            raise ParamsError(f"unknown HashId discriminant {value}") from None

    def padded_len(self, raw_len: int) -> int:
        """Byte length after zero-padding to a whole number of leaves."""
        return -(-raw_len // self.leaf_size) * self.leaf_size

    def num_leaves(self, raw_len: int) -> int:
        return self.padded_len(raw_len) // self.leaf_size


class Quant(IntEnum):
    FP8_E4M3_PREQUANT = 0

    @classmethod
    def decode(cls, value: int) -> "Quant":
        try:
            return cls(value)
        except ValueError:
            raise ParamsError(f"unknown Quant discriminant {value}") from None


class Device(IntEnum):
    """The FP8 MMA datapath a proof replays. H200 is sm_90 and commits HOPPER (= H100)."""

    HOPPER = 0  # H100 / H200, sm_90
    BLACKWELL = 1  # B200, sm_100 (sm_120 also commits Blackwell)

    @property
    def model(self) -> str:
        """The device name used by the numerics models (proof.fp8.mma, quantization, policy)."""
        return "hopper" if self is Device.HOPPER else "blackwell"

    @classmethod
    def decode(cls, value: int) -> "Device":
        try:
            return cls(value)
        except ValueError:
            raise ParamsError(f"unsupported Device discriminant {value}") from None

    @classmethod
    def parse(cls, device: "Device | str | int") -> "Device":
        """Accept a Device, its byte value, or a model name ("hopper"/"blackwell"/"h100"/"b200")."""
        if isinstance(device, Device):
            return device
        if isinstance(device, int):
            return cls.decode(device)
        names = {"hopper": cls.HOPPER, "h100": cls.HOPPER, "h200": cls.HOPPER,
                 "blackwell": cls.BLACKWELL, "b200": cls.BLACKWELL}
        try:
            return names[str(device).lower()]
        except KeyError:
            raise ParamsError(f"unknown device {device!r}") from None


# --------------------------------------------------------------------------------------------
# Axis patterns
# --------------------------------------------------------------------------------------------


class DimType(IntEnum):
    NULL = 0  # free placement digit
    FOLD = 1  # inside one subtile (folded by one lane)
    BLAKE = 2  # enumerates the lanes
    NONE = 3  # wire padding only


PATTERN_BYTES = 6
MAX_DIM_LEN = 64
MAX_PATTERN_TOTAL = 1 << 24
_PAD_BYTE = int(DimType.NONE)


class AxisPattern:
    """One axis of the committed lottery layout: mixed-radix dims (length, type), lowest stride first.

    The constructor normalizes to the canonical form (no length-1 dims, adjacent same-type dims
    merged) and rejects what the wire cannot carry, so every instance has exactly one encoding.
    """

    __slots__ = ("dims",)

    def __init__(self, dims: Iterable[tuple[int, DimType | int]]):
        canonical: list[tuple[int, DimType]] = []
        total = 1
        for length, dim_type in dims:
            dim_type = DimType(dim_type)
            if length < 1:
                raise ParamsError("axis pattern dim length must be >= 1")
            if dim_type is DimType.NONE and length != 1:
                raise ParamsError("None dims are wire padding only and must have length 1")
            if length == 1:
                continue
            total *= length
            if total > MAX_PATTERN_TOTAL:
                raise ParamsError(f"axis pattern total {total} exceeds 2^24")
            if canonical and canonical[-1][1] is dim_type:
                canonical[-1] = (canonical[-1][0] * length, dim_type)
            else:
                canonical.append((length, dim_type))
        if canonical and canonical[-1][1] is DimType.NULL:
            raise ParamsError("a trailing Null dim is redundant; omit it")
        self.dims: tuple[tuple[int, DimType], ...] = tuple(canonical)
        self._encode()  # serializability is a construction-time invariant

    def _encode(self) -> bytes:
        out: list[int] = []
        for length, dim_type in self.dims:
            rest = length
            while rest > 1:
                part = next((d for d in range(min(MAX_DIM_LEN, rest), 1, -1) if rest % d == 0), None)
                if part is None:
                    raise ParamsError(f"dim length {length} has a prime factor > 64 and cannot be encoded")
                out.append(((part - 1) << 2) | int(dim_type))
                rest //= part
        if len(out) > PATTERN_BYTES:
            raise ParamsError(f"axis pattern needs more than {PATTERN_BYTES} dim bytes")
        return bytes(out + [_PAD_BYTE] * (PATTERN_BYTES - len(out)))

    def to_bytes(self) -> bytes:
        return self._encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "AxisPattern":
        """Decode the 6-byte form; only the canonical encoding is accepted."""
        data = bytes(data)
        if len(data) != PATTERN_BYTES:
            raise ParamsError(f"axis pattern must be {PATTERN_BYTES} bytes, got {len(data)}")
        pattern = cls(((b >> 2) + 1, DimType(b & 3)) for b in data)
        if pattern.to_bytes() != data:
            raise ParamsError(f"non-canonical axis pattern encoding {data.hex()}")
        return pattern

    def _product(self, types: frozenset[DimType] | None = None) -> int:
        out = 1
        for length, dim_type in self.dims:
            if types is None or dim_type in types:
                out *= length
        return out

    @property
    def total(self) -> int:
        """One period of the placement lattice."""
        return self._product()

    @property
    def fold_size(self) -> int:
        return self._product(frozenset({DimType.FOLD}))

    @property
    def blake_size(self) -> int:
        return self._product(frozenset({DimType.BLAKE}))

    @property
    def tile_size(self) -> int:
        return self.fold_size * self.blake_size

    def _offsets(self, types: frozenset[DimType]) -> list[int]:
        offsets = [0]
        stride = 1
        for length, dim_type in self.dims:
            if dim_type in types:
                offsets = [o + d * stride for d in range(length) for o in offsets]
            stride *= length
        return offsets  # sorted: each digit block starts above every earlier offset

    def tile_offsets(self) -> list[int]:
        """Sorted offsets of the tile: sums of the Fold and Blake digits."""
        return self._offsets(frozenset({DimType.FOLD, DimType.BLAKE}))

    def fold_offsets(self) -> list[int]:
        return self._offsets(frozenset({DimType.FOLD}))

    def blake_offsets(self) -> list[int]:
        return self._offsets(frozenset({DimType.BLAKE}))

    def valid_offsets(self) -> list[int]:
        """Valid tile bases within one period (the Null-digit lattice)."""
        return self._offsets(frozenset({DimType.NULL}))

    @property
    def tile_max(self) -> int:
        """The largest tile offset."""
        return self.tile_offsets()[-1]

    def offset_is_valid(self, offset: int) -> bool:
        """True iff every Fold/Blake digit of offset mod total is 0 and offset + total <= 2^32."""
        if offset < 0 or offset + self.total > 1 << 32:
            return False
        rest = offset
        for length, dim_type in self.dims:
            if rest % length and dim_type is not DimType.NULL:
                return False
            rest //= length
        return True

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AxisPattern) and self.dims == other.dims

    def __hash__(self) -> int:
        return hash(self.dims)

    def __repr__(self) -> str:
        dims = ", ".join(f"({n}, {t.name})" for n, t in self.dims)
        return f"AxisPattern([{dims}])"


# --------------------------------------------------------------------------------------------
# Lottery layout limits (layout.rs)
# --------------------------------------------------------------------------------------------

JACKPOT_LANES = 16
MIN_SUBTILE_ELEMS = 16
MAX_SUBTILE_ELEMS = 256
MIN_TILE_ROWS = 4
MIN_TILE_COLS = 16
MAX_TILE_ELEMS = 2048
MAX_TILE_ROWS = MAX_TILE_ELEMS // MIN_TILE_COLS
MAX_OPENED_STRIP_ELEMS = 1 << 22  # (h + w)·k


def check_lottery_layout(rows: AxisPattern, cols: AxisPattern) -> None:
    """The extractor envelope: 16 Blake lanes, a legal subtile, h >= 4, w >= 16, 256 <= h·w <= 2048."""
    h, w = rows.tile_size, cols.tile_size
    if h < MIN_TILE_ROWS:
        raise ParamsError(f"tile rows h={h} must be >= {MIN_TILE_ROWS}")
    if w < MIN_TILE_COLS:
        raise ParamsError(f"tile cols w={w} must be >= {MIN_TILE_COLS}")
    if not JACKPOT_LANES * MIN_SUBTILE_ELEMS <= h * w <= MAX_TILE_ELEMS:
        raise ParamsError(f"tile area h*w={h * w} must be in [256, {MAX_TILE_ELEMS}]")
    lanes = rows.blake_size * cols.blake_size
    if lanes != JACKPOT_LANES:
        raise ParamsError(f"Blake dims must select exactly {JACKPOT_LANES} lanes, got {lanes}")
    subtile = rows.fold_size * cols.fold_size
    if not MIN_SUBTILE_ELEMS <= subtile <= MAX_SUBTILE_ELEMS:
        raise ParamsError(f"subtile has {subtile} elements, must be in [16, 256]")


def check_opened_strips(h: int, w: int, k: int) -> None:
    """(h + w)·k <= 2^22: the opened strips envelope."""
    if (h + w) * k > MAX_OPENED_STRIP_ELEMS:
        raise ParamsError(f"opened strips (h+w)*k={(h + w) * k} exceed 2^22")


# --------------------------------------------------------------------------------------------
# Tile shapes (mining_config.select_tile)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TileShape:
    """An official lottery tile: h rows of A × w rows of B."""

    rows: int
    cols: int

    @property
    def row_pattern(self) -> AxisPattern:
        return AxisPattern([(self.rows, DimType.BLAKE)])

    @property
    def col_pattern(self) -> AxisPattern:
        if self.rows == 4:  # the Hopper family: lanes = 4 rows × 4 column groups
            return AxisPattern([(2, DimType.FOLD), (4, DimType.BLAKE), (self.cols // 8, DimType.FOLD)])
        return AxisPattern([(self.cols, DimType.FOLD)])  # tall tiles: one lane per row

    @property
    def max_k(self) -> int:
        return tile_max_k(self.rows, self.cols)


TILE_4X64 = TileShape(4, 64)
TILE_4X128 = TileShape(4, 128)
TILE_16X32 = TileShape(16, 32)
DEVICE_TILES: dict[Device, tuple[TileShape, ...]] = {
    Device.HOPPER: (TILE_4X64, TILE_4X128),
    Device.BLACKWELL: (TILE_4X64, TILE_4X128, TILE_16X32),
}


def tile_max_k(rows: int, cols: int) -> int:
    """floor(2^22 / (rows + cols) / 512)·512, capped at 65536."""
    return min((MAX_OPENED_STRIP_ELEMS // (rows + cols)) // 512 * 512, MAX_K)


def select_tile(device: Device | str, n: int, k: int) -> TileShape:
    """The first official tile of the device with n % cols == 0 and k <= its max k.

    For MoE, n is the per-expert row count n_e. Raises ParamsError when no tile fits.
    """
    device = Device.parse(device)
    if k % 512 or not MIN_K <= k <= MAX_K:
        raise ParamsError(f"k={k} must be a multiple of 512 in [{MIN_K}, {MAX_K}]")
    for tile in DEVICE_TILES[device]:
        if n % tile.cols == 0 and k <= tile.max_k:
            return tile
    raise ParamsError(f"no {device.model} lottery tile fits n={n}, k={k}")


# --------------------------------------------------------------------------------------------
# Parameter tuples and pB / pA
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CommonParams:
    k: int
    r: int = PROTOCOL_RANK
    quant: Quant = Quant.FP8_E4M3_PREQUANT
    device: Device = Device.HOPPER

    def check(self) -> None:
        if self.r != PROTOCOL_RANK:
            raise ParamsError(f"rank must be exactly {PROTOCOL_RANK}, got r={self.r}")
        if self.k % 32 or not MIN_K <= self.k <= MAX_K:
            raise ParamsError(f"k={self.k} must be a multiple of 32 in [{MIN_K}, {MAX_K}]")


@dataclass(frozen=True)
class OperandParams:
    num_rows: int
    hash_id: HashId
    pattern: AxisPattern

    def check(self, side: str) -> None:
        if not 1 <= self.num_rows <= MAX_NUM_ROWS:
            raise ParamsError(f"{side} num_rows={self.num_rows} must be in [1, 2^24]")


@dataclass(frozen=True)
class MoeParams:
    experts: int
    hash_id_r: HashId = HashId.CHUNK_1024
    hash_id_o: HashId = HashId.CHUNK_1024


P_B_SIZE = 21
P_A_SIZE_DENSE = 11
P_A_SIZE_MOE = 13


@dataclass(frozen=True)
class JobParams:
    """The job tuple: σ_d, the common tuple, both operand tuples and the optional MoE tuple."""

    ancestor_header: bytes
    common: CommonParams
    a: OperandParams
    b: OperandParams
    moe: MoeParams | None = None

    @property
    def experts(self) -> int:
        return self.moe.experts if self.moe else 0

    @property
    def expert_rows(self) -> int:
        """Per-expert B rows η (dense: n)."""
        return self.b.num_rows // self.experts if self.moe else self.b.num_rows

    def p_b(self) -> bytes:
        """pB = n u32 ‖ k u32 ‖ r u16 ‖ quant u8 ‖ device u8 ‖ hash_idB u8 ‖ Pcol(6) ‖ e u16 (21 B)."""
        return (struct.pack("<IIHBBB", self.b.num_rows, self.common.k, self.common.r,
                            self.common.quant, self.common.device, self.b.hash_id)
                + self.b.pattern.to_bytes() + struct.pack("<H", self.experts))

    def p_a(self) -> bytes:
        """pA = m u32 ‖ hash_idA u8 ‖ Prow(6) [‖ hash_idR u8 ‖ hash_idO u8] (11 or 13 bytes)."""
        out = struct.pack("<IB", self.a.num_rows, self.a.hash_id) + self.a.pattern.to_bytes()
        if self.moe:
            out += bytes([self.moe.hash_id_r, self.moe.hash_id_o])
        return out

    def to_wire_bytes(self) -> bytes:
        """The PlainProofV4 job blob: σ_d(108) ‖ pB ‖ pA."""
        return bytes(self.ancestor_header) + self.p_b() + self.p_a()

    @classmethod
    def from_wire_bytes(cls, wire: bytes) -> "JobParams":
        reader = ByteCursor(wire, "job tuple")
        ancestor = reader.take(HEADER_SIZE)
        common, b, experts = parse_p_b(reader)
        a, moe_ids = parse_p_a(reader, experts)
        reader.finish()
        moe = MoeParams(experts, *moe_ids) if moe_ids else None
        return cls(ancestor, common, a, b, moe)

    def check(self) -> None:
        """Field-level rules (CommonParams, both operands, expert count) and the layout envelope."""
        if len(self.ancestor_header) != HEADER_SIZE:
            raise ParamsError(f"ancestor header must be {HEADER_SIZE} bytes")
        self.common.check()
        self.b.check("B")
        self.a.check("A")
        if self.moe and not 1 <= self.moe.experts <= MAX_EXPERTS:
            raise ParamsError(f"experts e={self.moe.experts} must be in [1, {MAX_EXPERTS}]")
        if self.moe and self.b.num_rows % self.moe.experts:
            raise ParamsError(f"n={self.b.num_rows} must be divisible by e={self.moe.experts}")
        check_lottery_layout(self.a.pattern, self.b.pattern)
        check_opened_strips(self.a.pattern.tile_size, self.b.pattern.tile_size, self.common.k)


class ByteCursor:
    """Sequential reader over a byte string with errors that name what was being read."""

    def __init__(self, data: bytes, what: str):
        self.data, self.pos, self.what = bytes(data), 0, what

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ParamsError(f"truncated {self.what}")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str) -> tuple:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))

    @property
    def remaining(self) -> int:
        return len(self.data) - self.pos

    def finish(self) -> None:
        if self.pos != len(self.data):
            raise ParamsError(f"trailing bytes in {self.what}")


def parse_p_b(reader: ByteCursor) -> tuple[CommonParams, OperandParams, int]:
    """Decode pB; returns (common, B operand, e)."""
    n, k, r = reader.unpack("<IIH")
    quant = Quant.decode(reader.take(1)[0])
    device = Device.decode(reader.take(1)[0])
    hash_id = HashId.decode(reader.take(1)[0])
    pattern = AxisPattern.from_bytes(reader.take(PATTERN_BYTES))
    (experts,) = reader.unpack("<H")
    return CommonParams(k, r, quant, device), OperandParams(n, hash_id, pattern), experts


def parse_p_a(reader: ByteCursor, experts: int) -> tuple[OperandParams, tuple[HashId, HashId] | None]:
    """Decode pA; the MoE suffix is present iff pB's e != 0."""
    (m,) = reader.unpack("<I")
    hash_id = HashId.decode(reader.take(1)[0])
    pattern = AxisPattern.from_bytes(reader.take(PATTERN_BYTES))
    moe_ids = None
    if experts:
        moe_ids = (HashId.decode(reader.take(1)[0]), HashId.decode(reader.take(1)[0]))
    return OperandParams(m, hash_id, pattern), moe_ids


def make_job(ancestor_header: bytes, *, m: int, n: int, k: int, device: Device | str = Device.HOPPER,
             tile: TileShape | None = None, experts: int = 0,
             hash_id: HashId = HashId.CHUNK_1024) -> JobParams:
    """Build the job tuple the official miner uses: 1024-byte leaves, r = 32, the device's tile."""
    device = Device.parse(device)
    tile = tile or select_tile(device, n // experts if experts else n, k)
    if tile not in DEVICE_TILES[device]:
        raise ParamsError(f"the {tile.rows}x{tile.cols} tile is not one of the {device.model} tiles")
    job = JobParams(
        bytes(ancestor_header), CommonParams(k, PROTOCOL_RANK, Quant.FP8_E4M3_PREQUANT, device),
        OperandParams(m, hash_id, tile.row_pattern), OperandParams(n, hash_id, tile.col_pattern),
        MoeParams(experts, hash_id, hash_id) if experts else None)
    job.check()
    return job

