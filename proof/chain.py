"""Pearl chain primitives: header, compact targets, varints, transactions, merkle root, blocks.

Byte order is stated once here (docs/protocol-chain.md): every hash is held in *internal* (wire)
order, the order SHA256d produces and the wire carries; RPC and explorers show hashes byte-reversed
("display" order), which `display_hex` / `from_display_hex` convert.  Integers are little-endian.

A Pearl header is Bitcoin's without the nonce and with a trailing 32-byte proof commitment
(node-consensus.md §2.5); a block carries its certificate *before* the header (§2.6).
"""
from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from proof.certificate import Certificate

HASH_LEN = 32
HEADER_SIZE = 108
INCOMPLETE_HEADER_SIZE = 76
MAX_U32 = 0xFFFFFFFF
MAX_TARGET = (1 << 256) - 1

WITNESS_COMMITMENT_PREFIX = bytes.fromhex("6a24aa21a9ed")
WITNESS_RESERVED_VALUE = bytes(32)
COINBASE_PREV_INDEX = 0xFFFFFFFF
_MAX_COINBASE_SCRIPT = 100
_MIN_COINBASE_SCRIPT = 2


class DecodeError(ValueError):
    """Malformed wire bytes: names the field and offset that failed."""


def sha256d(data: bytes) -> bytes:
    """SHA256(SHA256(data)), internal byte order."""
    return hashlib.sha256(hashlib.sha256(data).digest()).digest()


def display_hex(hash_bytes: bytes) -> str:
    """Hex of a 32-byte hash in display (RPC, byte-reversed) order."""
    return bytes(hash_bytes)[::-1].hex()


def from_display_hex(text: str) -> bytes:
    """Internal-order bytes of a hash given in display hex."""
    raw = bytes.fromhex(text)
    if len(raw) != HASH_LEN:
        raise ValueError(f"a hash is {HASH_LEN} bytes, got {len(raw)} from {text!r}")
    return raw[::-1]


# --- reading --------------------------------------------------------------------------------------

class ByteReader:
    """Sequential reader over wire bytes that raises DecodeError naming the field on truncation."""

    def __init__(self, data: bytes) -> None:
        self._data = bytes(data)
        self.offset = 0

    @property
    def remaining(self) -> int:
        return len(self._data) - self.offset

    def read(self, size: int, what: str) -> bytes:
        if size > self.remaining:
            raise DecodeError(f"truncated {what}: need {size} bytes at offset {self.offset}, "
                              f"{self.remaining} left")
        out = self._data[self.offset:self.offset + size]
        self.offset += size
        return out

    def u8(self, what: str) -> int:
        return self.read(1, what)[0]

    def u16(self, what: str) -> int:
        return struct.unpack("<H", self.read(2, what))[0]

    def u32(self, what: str) -> int:
        return struct.unpack("<I", self.read(4, what))[0]

    def i32(self, what: str) -> int:
        return struct.unpack("<i", self.read(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack("<Q", self.read(8, what))[0]

    def i64(self, what: str) -> int:
        return struct.unpack("<q", self.read(8, what))[0]

    def varint(self, what: str) -> int:
        """A Bitcoin CompactSize; non-canonical (longer than needed) encodings are rejected."""
        start = self.offset
        prefix = self.u8(what)
        if prefix < 0xFD:
            return prefix
        size, minimum = {0xFD: (2, 0xFD), 0xFE: (4, 0x10000), 0xFF: (8, 0x100000000)}[prefix]
        value = int.from_bytes(self.read(size, what), "little")
        if value < minimum:
            raise DecodeError(f"non-canonical varint for {what} at offset {start}: {value} "
                              f"encoded in {1 + size} bytes")
        return value

    def var_bytes(self, what: str) -> bytes:
        return self.read(self.varint(f"{what} length"), what)

    def expect_end(self, what: str) -> None:
        if self.remaining:
            raise DecodeError(f"{self.remaining} trailing bytes after {what}")


def write_varint(value: int) -> bytes:
    """Canonical Bitcoin CompactSize encoding of a non-negative integer < 2^64."""
    if not 0 <= value < 1 << 64:
        raise ValueError(f"varint value out of range: {value}")
    if value < 0xFD:
        return bytes([value])
    if value <= 0xFFFF:
        return b"\xfd" + value.to_bytes(2, "little")
    if value <= 0xFFFFFFFF:
        return b"\xfe" + value.to_bytes(4, "little")
    return b"\xff" + value.to_bytes(8, "little")


def read_varint(data: bytes, offset: int = 0) -> tuple[int, int]:
    """(value, offset after it) of the varint at `offset`; DecodeError if truncated or non-canonical."""
    reader = ByteReader(data)
    reader.offset = offset
    value = reader.varint("varint")
    return value, reader.offset


def _var_bytes(data: bytes) -> bytes:
    return write_varint(len(data)) + bytes(data)


# --- compact targets ------------------------------------------------------------------------------

def target_from_bits(bits: int) -> int:
    """The target of a compact `bits` value, as Pearl's verifier computes it.

    A zero exponent or mantissa, or a set sign bit, gives target 0 (nothing meets it); a mantissa
    shifted past 256 bits is truncated to 256 bits (U256 arithmetic in zk-pow proof_utils.rs).
    """
    if not 0 <= bits <= MAX_U32:
        raise ValueError(f"bits must be a u32, got {bits}")
    exponent = bits >> 24
    mantissa = bits & 0x00FFFFFF
    if mantissa == 0 or exponent == 0 or mantissa & 0x00800000:
        return 0
    if exponent <= 3:
        return mantissa >> (8 * (3 - exponent))
    return (mantissa << (8 * (exponent - 3))) & MAX_TARGET


def bits_from_target(target: int) -> int:
    """The canonical compact encoding of a target (Bitcoin's GetCompact; lossy below 3 bytes of mantissa)."""
    if not 0 <= target <= MAX_TARGET:
        raise ValueError(f"target must be in [0, 2^256), got {target}")
    size = (target.bit_length() + 7) // 8
    if size <= 3:
        mantissa = target << (8 * (3 - size))
    else:
        mantissa = target >> (8 * (size - 3))
    if mantissa & 0x00800000:
        mantissa >>= 8
        size += 1
    return (size << 24) | mantissa


# --- header ---------------------------------------------------------------------------------------

def _check_hash(name: str, value: bytes) -> None:
    if not isinstance(value, (bytes, bytearray)) or len(value) != HASH_LEN:
        got = f"{len(value)} bytes" if isinstance(value, (bytes, bytearray)) else type(value).__name__
        raise ValueError(f"{name} must be {HASH_LEN} bytes, got {got}")


def _check_range(name: str, value: int, low: int, high: int) -> None:
    if not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value!r}")


@dataclass(frozen=True)
class BlockHeader:
    """The 108-byte Pearl header; prev_block, merkle_root and proof_commitment in internal order."""

    version: int
    prev_block: bytes
    merkle_root: bytes
    timestamp: int
    bits: int
    proof_commitment: bytes = bytes(32)

    def __post_init__(self) -> None:
        _check_range("version", self.version, -(1 << 31), (1 << 31) - 1)
        _check_hash("prev_block", self.prev_block)
        _check_hash("merkle_root", self.merkle_root)
        _check_range("timestamp", self.timestamp, 0, MAX_U32)
        _check_range("bits", self.bits, 0, MAX_U32)
        _check_hash("proof_commitment", self.proof_commitment)

    def incomplete_bytes(self) -> bytes:
        """The first 76 bytes (everything but the proof commitment): what the gateway hands miners."""
        return (struct.pack("<i", self.version) + bytes(self.prev_block) + bytes(self.merkle_root)
                + struct.pack("<II", self.timestamp, self.bits))

    def to_bytes(self) -> bytes:
        return self.incomplete_bytes() + bytes(self.proof_commitment)

    def block_hash(self) -> bytes:
        """SHA256d of the 108 bytes, internal order (display it with `display_hex`)."""
        return sha256d(self.to_bytes())

    @classmethod
    def decode(cls, reader: ByteReader) -> BlockHeader:
        version = reader.i32("header version")
        prev_block = reader.read(HASH_LEN, "header prev_block")
        merkle_root = reader.read(HASH_LEN, "header merkle_root")
        timestamp = reader.u32("header timestamp")
        bits = reader.u32("header bits")
        commitment = reader.read(HASH_LEN, "header proof_commitment")
        return cls(version, prev_block, merkle_root, timestamp, bits, commitment)

    @classmethod
    def from_bytes(cls, data: bytes) -> BlockHeader:
        """Parse exactly 108 bytes."""
        reader = ByteReader(data)
        header = cls.decode(reader)
        reader.expect_end("the 108-byte header")
        return header

    @classmethod
    def from_incomplete_bytes(cls, data: bytes, proof_commitment: bytes = bytes(32)) -> BlockHeader:
        """Parse the 76-byte incomplete header and attach a proof commitment."""
        if len(data) != INCOMPLETE_HEADER_SIZE:
            raise DecodeError(f"an incomplete header is {INCOMPLETE_HEADER_SIZE} bytes, got {len(data)}")
        return cls.from_bytes(bytes(data) + bytes(proof_commitment))


# --- transactions ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class TxIn:
    prev_txid: bytes
    prev_index: int
    script_sig: bytes
    sequence: int = 0xFFFFFFFF
    witness: tuple[bytes, ...] = ()

    def __post_init__(self) -> None:
        _check_hash("prev_txid", self.prev_txid)
        _check_range("prev_index", self.prev_index, 0, MAX_U32)
        _check_range("sequence", self.sequence, 0, MAX_U32)


@dataclass(frozen=True)
class TxOut:
    value: int
    script_pubkey: bytes

    def __post_init__(self) -> None:
        _check_range("value", self.value, -(1 << 63), (1 << 63) - 1)


@dataclass(frozen=True)
class Transaction:
    """A transaction; serialized with BIP144 witness encoding whenever any input has a witness."""

    version: int
    inputs: tuple[TxIn, ...]
    outputs: tuple[TxOut, ...]
    locktime: int = 0

    def __post_init__(self) -> None:
        _check_range("tx version", self.version, -(1 << 31), (1 << 31) - 1)
        _check_range("locktime", self.locktime, 0, MAX_U32)
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))

    @property
    def has_witness(self) -> bool:
        return any(txin.witness for txin in self.inputs)

    def _serialize(self, with_witness: bool) -> bytes:
        parts = [struct.pack("<i", self.version)]
        if with_witness:
            parts.append(b"\x00\x01")
        parts.append(write_varint(len(self.inputs)))
        for txin in self.inputs:
            parts += [bytes(txin.prev_txid), struct.pack("<I", txin.prev_index),
                      _var_bytes(txin.script_sig), struct.pack("<I", txin.sequence)]
        parts.append(write_varint(len(self.outputs)))
        for txout in self.outputs:
            parts += [struct.pack("<q", txout.value), _var_bytes(txout.script_pubkey)]
        if with_witness:
            for txin in self.inputs:
                parts.append(write_varint(len(txin.witness)))
                parts += [_var_bytes(item) for item in txin.witness]
        parts.append(struct.pack("<I", self.locktime))
        return b"".join(parts)

    def to_bytes(self) -> bytes:
        """Wire encoding: BIP144 when there is witness data, legacy otherwise."""
        return self._serialize(self.has_witness)

    def legacy_bytes(self) -> bytes:
        """Encoding without witness data (what the txid hashes)."""
        return self._serialize(False)

    def txid(self) -> bytes:
        return sha256d(self.legacy_bytes())

    def wtxid(self) -> bytes:
        return sha256d(self.to_bytes())

    def is_coinbase(self) -> bool:
        return (len(self.inputs) == 1 and self.inputs[0].prev_txid == bytes(32)
                and self.inputs[0].prev_index == COINBASE_PREV_INDEX)

    @classmethod
    def decode(cls, reader: ByteReader) -> Transaction:
        version = reader.i32("tx version")
        input_count = reader.varint("tx input count")
        segwit = False
        if input_count == 0:
            flag = reader.u8("tx witness flag")
            if flag != 1:
                raise DecodeError(f"transaction has no inputs or a bad witness flag {flag:#04x}")
            segwit = True
            input_count = reader.varint("tx input count")
        raw_inputs = []
        for i in range(input_count):
            raw_inputs.append((reader.read(HASH_LEN, f"tx input {i} prev_txid"),
                               reader.u32(f"tx input {i} prev_index"),
                               reader.var_bytes(f"tx input {i} script_sig"),
                               reader.u32(f"tx input {i} sequence")))
        outputs = []
        for i in range(reader.varint("tx output count")):
            value = reader.i64(f"tx output {i} value")
            outputs.append(TxOut(value, reader.var_bytes(f"tx output {i} script_pubkey")))
        witnesses: list[tuple[bytes, ...]] = [()] * input_count
        if segwit:
            for i in range(input_count):
                items = reader.varint(f"tx input {i} witness count")
                witnesses[i] = tuple(reader.var_bytes(f"tx input {i} witness item {j}") for j in range(items))
            if not any(witnesses):
                raise DecodeError("transaction has the witness flag but no witness data")
        locktime = reader.u32("tx locktime")
        inputs = tuple(TxIn(*raw, witness=w) for raw, w in zip(raw_inputs, witnesses))
        return cls(version, inputs, tuple(outputs), locktime)

    @classmethod
    def from_bytes(cls, data: bytes) -> Transaction:
        reader = ByteReader(data)
        tx = cls.decode(reader)
        reader.expect_end("the transaction")
        return tx


def merkle_root(hashes: Sequence[bytes]) -> bytes:
    """Bitcoin merkle root of internal-order hashes (an odd last hash is paired with itself)."""
    if not hashes:
        raise ValueError("merkle root of an empty list")
    level = [bytes(h) for h in hashes]
    for h in level:
        _check_hash("merkle leaf", h)
    while len(level) > 1:
        if len(level) % 2:
            level.append(level[-1])
        level = [sha256d(level[i] + level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]


def witness_commitment(transactions: Sequence[Transaction]) -> bytes:
    """SHA256d(witness merkle root ‖ reserved value); the coinbase's wtxid counts as zero (BIP141)."""
    wtxids = [bytes(32)] + [tx.wtxid() for tx in transactions[1:]]
    return sha256d(merkle_root(wtxids) + WITNESS_RESERVED_VALUE)


# --- scripts and coinbase -------------------------------------------------------------------------

def push_data(data: bytes) -> bytes:
    """The minimal script push of `data`."""
    size = len(data)
    if size < 0x4C:
        return bytes([size]) + bytes(data)
    if size <= 0xFF:
        return b"\x4c" + bytes([size]) + bytes(data)
    if size <= 0xFFFF:
        return b"\x4d" + size.to_bytes(2, "little") + bytes(data)
    return b"\x4e" + size.to_bytes(4, "little") + bytes(data)


def push_int(value: int) -> bytes:
    """The minimal script push of a small integer (OP_0, OP_1..OP_16, or a script number)."""
    if value == 0:
        return b"\x00"
    if 1 <= value <= 16:
        return bytes([0x50 + value])
    if value == -1:
        return b"\x4f"
    magnitude = abs(value)
    number = bytearray(magnitude.to_bytes((magnitude.bit_length() + 7) // 8, "little"))
    if number[-1] & 0x80:
        number.append(0x80 if value < 0 else 0)
    elif value < 0:
        number[-1] |= 0x80
    return push_data(bytes(number))


def p2tr_script(output_key: bytes) -> bytes:
    """Pay-to-Taproot (witness v1) script for a 32-byte x-only output key."""
    _check_hash("taproot output key", output_key)
    return b"\x51\x20" + bytes(output_key)


def op_return_script(data: bytes = b"") -> bytes:
    """An unspendable OP_RETURN output script carrying `data`."""
    return b"\x6a" + (push_data(data) if data else b"")


def _is_allowed_payout(script: bytes) -> bool:
    """Pearl only allows P2TR (v1), P2MR (v2) or OP_RETURN outputs (node-consensus.md §1.3)."""
    witness_program = len(script) == 34 and script[0] in (0x51, 0x52) and script[1] == 0x20
    return witness_program or script[:1] == b"\x6a"


def coinbase_transaction(height: int, value: int, payout_script: bytes,
                         witness_commitment_hash: bytes | None = None, extra_nonce: int = 0,
                         flags: bytes = b"") -> Transaction:
    """The coinbase of a block at `height` paying `value` to `payout_script`.

    scriptSig = push(height) (BIP34) ‖ push(extra_nonce) ‖ push(flags), as btcd builds it.  With a
    witness commitment, the input carries the 32-byte zero reserved value as its witness and an
    OP_RETURN output `6a24aa21a9ed ‖ commitment` follows the payout.
    """
    _check_range("height", height, 0, (1 << 31) - 1)
    if not _is_allowed_payout(payout_script):
        raise ValueError(f"payout script must be P2TR, P2MR or OP_RETURN, got {bytes(payout_script).hex()}")
    script_sig = push_int(height) + push_int(extra_nonce) + (push_data(flags) if flags else b"")
    if not _MIN_COINBASE_SCRIPT <= len(script_sig) <= _MAX_COINBASE_SCRIPT:
        raise ValueError(f"coinbase scriptSig must be {_MIN_COINBASE_SCRIPT}..{_MAX_COINBASE_SCRIPT} "
                         f"bytes, got {len(script_sig)}")
    outputs = [TxOut(value, bytes(payout_script))]
    witness: tuple[bytes, ...] = ()
    if witness_commitment_hash is not None:
        _check_hash("witness commitment", witness_commitment_hash)
        outputs.append(TxOut(0, WITNESS_COMMITMENT_PREFIX + bytes(witness_commitment_hash)))
        witness = (WITNESS_RESERVED_VALUE,)
    txin = TxIn(bytes(32), COINBASE_PREV_INDEX, script_sig, 0xFFFFFFFF, witness)
    return Transaction(1, (txin,), tuple(outputs), 0)


# --- block ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Block:
    """certificate ‖ header ‖ varint tx count ‖ transactions (node-consensus.md §2.6).

    `certificate` is None for a block without one (version 0 on the wire).
    """

    certificate: Certificate | None
    header: BlockHeader
    transactions: tuple[Transaction, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        object.__setattr__(self, "transactions", tuple(self.transactions))

    def to_bytes(self) -> bytes:
        from proof.certificate import encode  # deferred: proof.certificate imports this module
        return b"".join([encode(self.certificate), self.header.to_bytes(),
                         write_varint(len(self.transactions))]
                        + [tx.to_bytes() for tx in self.transactions])

    def block_hash(self) -> bytes:
        return self.header.block_hash()

    def computed_merkle_root(self) -> bytes:
        return merkle_root([tx.txid() for tx in self.transactions])

    @classmethod
    def from_bytes(cls, data: bytes) -> Block:
        """Parse a whole block; truncation, bad fields and trailing bytes raise DecodeError."""
        from proof.certificate import decode_from  # deferred: proof.certificate imports this module
        reader = ByteReader(data)
        certificate = decode_from(reader)
        header = BlockHeader.decode(reader)
        transactions = tuple(Transaction.decode(reader) for _ in range(reader.varint("tx count")))
        reader.expect_end("the block")
        return cls(certificate, header, transactions)
