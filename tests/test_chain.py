"""proof.chain against node-consensus.md §6 and int-protocol.md §9.2, plus round trips."""
from __future__ import annotations

import random

import pytest

from proof import certificate as cert
from proof.chain import (
    Block, BlockHeader, ByteReader, DecodeError, Transaction, TxIn, TxOut, bits_from_target,
    coinbase_transaction, display_hex, from_display_hex, merkle_root, op_return_script, p2tr_script,
    push_int, read_varint, sha256d, target_from_bits, witness_commitment, write_varint,
)

GENESIS_MERKLE = from_display_hex("302f59c6f1239648bd38eddf16b22acc8c8df3c96de2e4f552bd2f38371675c1")
TESTNET_MERKLE = from_display_hex("7aa0a7ae1e223414cb807e40cd57e667b718e42aaf9306db9102fe28912b7b4e")
GENESIS_TEXT = (
    b"The native currency for machines and humans. Total 2.1e9 Pearls, Cumulative emission "
    b"h/(h+650226), WTEMA 3m14s 7d, Bitcoin block #946842 with MTP 1777270524 is "
    b"000000000000000000003a9221861ec7411427dd24f979fb91a3b8f7265e1dbc.")
BLOCK_ONE_PUBKEY = bytes.fromhex(
    "0496b538e853519c726a2c91e61ec11600ae1390813a627c66fb8be7947be63c52da7589379515d4e0a604f8141781"
    "e62294721166bf621e73a82cbf2342c858ee")


# --- §6.1 genesis ---------------------------------------------------------------------------------

@pytest.mark.parametrize("merkle, timestamp, bits, expected", [
    (GENESIS_MERKLE, 1776675600, 0x1E010000, "78d0ab27df6a51a8e9dbbdefffca1ebbbeb3818cb083ce2c2f43b047247e5832"),
    (TESTNET_MERKLE, 1776675600, 0x1B00FFFF, "b0c86d0cd8825f4d72260d2de46f470429eece413811d5d82b5f2e2ea0336f96"),
])
def test_genesis_hashes_recomputed(merkle, timestamp, bits, expected):
    header = BlockHeader(1, bytes(32), merkle, timestamp, bits)
    assert display_hex(header.block_hash()) == expected


def test_mainnet_genesis_coinbase_txid_is_the_merkle_root():
    assert len(GENESIS_TEXT) == 225
    script_sig = bytes.fromhex("04ffff001d0104") + b"\x4c\xe1" + GENESIS_TEXT
    tx = Transaction(1, (TxIn(bytes(32), 0xFFFFFFFF, script_sig),), (TxOut(0, b"\x6a"),))
    assert tx.is_coinbase() and not tx.has_witness
    assert tx.txid() == GENESIS_MERKLE
    assert merkle_root([tx.txid()]) == GENESIS_MERKLE


# --- §6.2 blockOne --------------------------------------------------------------------------------

def _block_one_coinbase() -> Transaction:
    txin = TxIn(bytes(32), 0xFFFFFFFF, bytes.fromhex("04ffff001d0104"))
    return Transaction(1, (txin,), (TxOut(0x12A05F200, b"\x41" + BLOCK_ONE_PUBKEY + b"\xac"),))


def _block_one() -> Block:
    header = BlockHeader(
        1, bytes.fromhex("6fe28c0ab6f1b372c1a6a246ae63f74f931e8365e15a089c68d6190000000000"),
        bytes.fromhex("982051fd1e4ba744bbbe680e1fee14677ba1a3c3540bf7b1cdb606e857233e0e"),
        0x4966BC61, 0x1D00FFFF)
    certificate = cert.CertificateV1(bytes(range(1, 33)), bytes(164), bytes.fromhex("deadbeefcafebabe"))
    return Block(certificate, header, (_block_one_coinbase(),))


def test_block_one_sizes_and_tx_hash():
    block = _block_one()
    tx = block.transactions[0]
    assert display_hex(tx.txid()) == "0e3e2357e806b6cdb1f70b54c3a3a17b6714ee1f0e68bebb44a74b1efd512098"
    assert block.computed_merkle_root() == block.header.merkle_root
    assert len(tx.to_bytes()) == 134
    encoded = block.to_bytes()
    assert len(cert.encode(block.certificate)) == 212
    assert len(encoded) == 455
    assert encoded[321:] == tx.to_bytes()  # TxLoc{321, 134}
    assert len(Block(block.certificate, block.header, ()).to_bytes()) == 321
    assert encoded[:212] == cert.encode(block.certificate)
    assert encoded[212:320] == block.header.to_bytes()


# --- §6.3 header ----------------------------------------------------------------------------------

HEADER_63 = bytes.fromhex(
    "01000000" "6fe28c0ab6f1b372c1a6a246ae63f74f931e8365e15a089c68d6190000000000"
    "3ba3edfd7a7b12b27ac72c3e67768f617fc81bc3888a51323a9fb8aa4b1e5e4a" "29ab5f49" "ffff001d") + bytes(32)


def test_header_golden_encoding():
    header = BlockHeader.from_bytes(HEADER_63)
    assert header.version == 1 and header.timestamp == 0x495FAB29 and header.bits == 0x1D00FFFF
    assert header.merkle_root == HEADER_63[36:68]
    assert header.proof_commitment == bytes(32)
    assert header.to_bytes() == HEADER_63
    assert header.incomplete_bytes() == HEADER_63[:76]
    assert header.block_hash() == sha256d(HEADER_63)


def test_incomplete_header_layout_ignores_commitment():
    header = BlockHeader(0x01020304, bytes(range(32)), bytes(range(0x80, 0xA0)), 0x11121314, 0x21222324)
    data = header.incomplete_bytes()
    assert len(data) == 76
    assert data[:4] == bytes.fromhex("04030201")
    assert data[4:36] == bytes(range(32)) and data[36:68] == bytes(range(0x80, 0xA0))
    assert data[68:76] == bytes.fromhex("1413121124232221")
    other = BlockHeader(0x01020304, bytes(range(32)), bytes(range(0x80, 0xA0)), 0x11121314, 0x21222324,
                        b"\xff" * 32)
    assert other.incomplete_bytes() == data and other.to_bytes() != header.to_bytes()
    assert BlockHeader.from_incomplete_bytes(data, b"\xff" * 32) == other


def test_header_errors():
    with pytest.raises(ValueError, match="prev_block must be 32 bytes"):
        BlockHeader(1, bytes(31), bytes(32), 0, 0)
    with pytest.raises(ValueError, match="bits"):
        BlockHeader(1, bytes(32), bytes(32), 0, 1 << 32)
    with pytest.raises(DecodeError, match="trailing"):
        BlockHeader.from_bytes(HEADER_63 + b"\x00")
    for cut in range(108):
        with pytest.raises(DecodeError, match="truncated header"):
            BlockHeader.from_bytes(HEADER_63[:cut])
    with pytest.raises(DecodeError, match="76 bytes"):
        BlockHeader.from_incomplete_bytes(HEADER_63)


def test_display_hex_round_trip():
    value = bytes(range(32))
    assert from_display_hex(display_hex(value)) == value
    assert display_hex(value).startswith("1f1e")
    with pytest.raises(ValueError, match="32 bytes"):
        from_display_hex("00")


# --- compact targets ------------------------------------------------------------------------------

@pytest.mark.parametrize("bits, target", [
    (0x1D00FFFF, 0xFFFF << 208),
    (0x1B0404CB, 0x0404CB << (8 * 24)),
    (0x03123456, 0x123456),
    (0x1D000000, 0),
    (0x2077FFFF, 0x77FFFF << 232),
    (0x1D800000, 0),
])
def test_target_from_bits_int_protocol_cases(bits, target):
    assert target_from_bits(bits) == target


def test_target_edge_cases():
    assert target_from_bits(0x1D80FFFF) == 0  # sign bit
    assert target_from_bits(0x00123456) == 0  # zero exponent
    assert target_from_bits(0x01123456) == 0x12
    assert target_from_bits(0x02123456) == 0x1234
    assert target_from_bits(0x2200FFFF) == (0xFFFF << 248) & ((1 << 256) - 1)  # U256 truncation
    with pytest.raises(ValueError, match="u32"):
        target_from_bits(-1)


def test_bits_from_target_round_trips():
    for bits in (0x1D00FFFF, 0x1B0404CB, 0x03123456, 0x2077FFFF, 0x1E010000, 0x1B00FFFF, 0x1D0FFFFF,
                 0x1A07FFF8, 0x1E01FFFF):
        assert bits_from_target(target_from_bits(bits)) == bits
    assert bits_from_target(0) == 0
    assert bits_from_target(0x80) == 0x02008000  # the sign bit forces one more byte
    assert bits_from_target((1 << 233) - 1) == 0x1E01FFFF
    rng = random.Random(5)
    for _ in range(200):
        target = rng.getrandbits(rng.randrange(1, 256))
        bits = bits_from_target(target)
        approx = target_from_bits(bits)
        assert approx <= target and bits_from_target(approx) == bits
    with pytest.raises(ValueError, match="target"):
        bits_from_target(1 << 256)


# --- varints --------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, encoded", [
    (0, "00"), (0xFC, "fc"), (0xFD, "fdfd00"), (0xFFFF, "fdffff"), (0x10000, "fe00000100"),
    (0xFFFFFFFF, "feffffffff"), (0x100000000, "ff0000000001000000"), ((1 << 64) - 1, "ff" + "ff" * 8),
])
def test_varint_canonical(value, encoded):
    assert write_varint(value).hex() == encoded
    assert read_varint(bytes.fromhex(encoded)) == (value, len(encoded) // 2)


@pytest.mark.parametrize("encoded", ["fd0200", "fdfc00", "feffff0000", "ffffffffff00000000"])
def test_varint_non_canonical_rejected(encoded):
    with pytest.raises(DecodeError, match="non-canonical"):
        read_varint(bytes.fromhex(encoded))


def test_varint_truncated_and_out_of_range():
    for encoded in ("", "fd", "fd02", "fe000001", "ff00000000000001"):
        with pytest.raises(DecodeError, match="truncated"):
            read_varint(bytes.fromhex(encoded))
    with pytest.raises(ValueError, match="out of range"):
        write_varint(-1)
    assert read_varint(b"\x00\x05", 1) == (5, 2)


# --- transactions ---------------------------------------------------------------------------------

def _witness_tx(rng: random.Random) -> Transaction:
    inputs = tuple(TxIn(rng.randbytes(32), rng.randrange(1 << 32), rng.randbytes(rng.randrange(0, 300)),
                        rng.randrange(1 << 32),
                        tuple(rng.randbytes(rng.randrange(0, 80)) for _ in range(i % 3)))
                   for i in range(rng.randrange(1, 4)))
    outputs = tuple(TxOut(rng.randrange(1 << 40), p2tr_script(rng.randbytes(32)))
                    for _ in range(rng.randrange(1, 3)))
    return Transaction(2, inputs, outputs, rng.randrange(1 << 32))


def test_transaction_round_trips_and_ids():
    rng = random.Random(6)
    for _ in range(30):
        tx = _witness_tx(rng)
        data = tx.to_bytes()
        assert Transaction.from_bytes(data) == tx
        assert Transaction.from_bytes(data).to_bytes() == data
        assert tx.txid() == sha256d(tx.legacy_bytes())
        if tx.has_witness:
            assert data[4:6] == b"\x00\x01"
            assert tx.wtxid() != tx.txid()
        else:
            assert data == tx.legacy_bytes() and tx.wtxid() == tx.txid()


def test_transaction_decode_errors():
    tx = _block_one_coinbase()
    data = tx.to_bytes()
    for cut in range(len(data)):
        with pytest.raises(DecodeError, match="truncated"):
            Transaction.from_bytes(data[:cut])
    witness_free = data[:4] + b"\x00\x01" + data[4:-4] + b"\x00" + data[-4:]
    with pytest.raises(DecodeError, match="no witness data"):
        Transaction.from_bytes(witness_free)
    with pytest.raises(DecodeError, match="witness flag"):
        Transaction.from_bytes(data[:4] + b"\x00\x02" + data[4:])
    with pytest.raises(ValueError, match="prev_txid"):
        TxIn(bytes(31), 0, b"")


# --- merkle and coinbase --------------------------------------------------------------------------

def test_merkle_root_literal():
    a, b, c = (sha256d(bytes([i])) for i in range(3))
    assert merkle_root([a]) == a
    assert merkle_root([a, b]) == sha256d(a + b)
    assert merkle_root([a, b, c]) == sha256d(sha256d(a + b) + sha256d(c + c))
    with pytest.raises(ValueError, match="empty"):
        merkle_root([])


@pytest.mark.parametrize("height, push", [
    (0, "00"), (1, "51"), (16, "60"), (17, "0111"), (127, "017f"), (128, "028000"), (255, "02ff00"),
    (256, "020001"), (65535, "03ffff00"), (65536, "03000001"), (91630, "03ee6501"), (8388608, "0400008000"),
])
def test_bip34_height_push(height, push):
    assert push_int(height).hex() == push
    tx = coinbase_transaction(height, 50, p2tr_script(bytes(32)))
    assert tx.inputs[0].script_sig.startswith(bytes.fromhex(push))


def test_coinbase_with_witness_commitment():
    rng = random.Random(7)
    others = [_witness_tx(rng) for _ in range(3)]
    placeholder = coinbase_transaction(120001, 0, p2tr_script(bytes(32)))
    commitment = witness_commitment([placeholder] + others)
    wtxids = [bytes(32)] + [tx.wtxid() for tx in others]
    assert commitment == sha256d(merkle_root(wtxids) + bytes(32))
    key = rng.randbytes(32)
    coinbase = coinbase_transaction(120001, 123456789, p2tr_script(key), commitment, extra_nonce=7,
                                    flags=b"/P2SH/pearld/")
    assert coinbase.is_coinbase()
    assert coinbase.inputs[0].script_sig == bytes.fromhex("03c1d401") + b"\x57" + b"\x0d/P2SH/pearld/"
    assert coinbase.inputs[0].witness == (bytes(32),)
    assert coinbase.outputs[0] == TxOut(123456789, b"\x51\x20" + key)
    assert coinbase.outputs[1] == TxOut(0, bytes.fromhex("6a24aa21a9ed") + commitment)
    assert witness_commitment([coinbase] + others) == commitment  # the coinbase's own wtxid is zeroed
    assert Transaction.from_bytes(coinbase.to_bytes()) == coinbase


def test_coinbase_payouts_and_errors():
    assert coinbase_transaction(5, 0, op_return_script()).outputs[0].script_pubkey == b"\x6a"
    assert op_return_script(b"hi") == b"\x6a\x02hi"
    p2mr = b"\x52\x20" + bytes(32)
    assert coinbase_transaction(5, 0, p2mr).outputs[0].script_pubkey == p2mr
    p2pkh = bytes.fromhex("76a914") + bytes(20) + bytes.fromhex("88ac")
    with pytest.raises(ValueError, match="P2TR, P2MR or OP_RETURN"):
        coinbase_transaction(5, 0, p2pkh)
    with pytest.raises(ValueError, match="scriptSig"):
        coinbase_transaction(5, 0, op_return_script(), flags=bytes(99))
    with pytest.raises(ValueError, match="witness commitment"):
        coinbase_transaction(5, 0, op_return_script(), bytes(31))


# --- blocks ---------------------------------------------------------------------------------------

def _blocks() -> list[Block]:
    rng = random.Random(8)
    header = _block_one().header
    ancestors = (BlockHeader.from_bytes(HEADER_63),)
    certificates = [
        _block_one().certificate,
        cert.CertificateV2(rng.randbytes(32), rng.randbytes(300), rng.randbytes(50)),
        cert.CertificateV3(rng.randbytes(32), rng.randbytes(164), rng.randbytes(20)),
        cert.CertificateV4(rng.randbytes(32), rng.randbytes(244), rng.randbytes(40), ancestors),
        None,
    ]
    txs = (coinbase_transaction(100, 5, p2tr_script(bytes(32)), bytes(32)), _witness_tx(rng))
    return [Block(c, header, txs) for c in certificates] + [_block_one()]


def test_block_encode_decode_encode_identical():
    for block in _blocks():
        data = block.to_bytes()
        decoded = Block.from_bytes(data)
        assert decoded == block
        assert decoded.to_bytes() == data


def test_every_block_truncation_fails_clearly():
    for block in _blocks():
        data = block.to_bytes()
        for cut in range(len(data)):
            with pytest.raises(DecodeError, match="truncated"):
                Block.from_bytes(data[:cut])
        with pytest.raises(DecodeError, match="trailing"):
            Block.from_bytes(data + b"\x00")


def test_byte_reader_names_the_field():
    reader = ByteReader(b"\x01\x02")
    with pytest.raises(DecodeError, match=r"truncated widget: need 4 bytes at offset 0, 2 left"):
        reader.u32("widget")
