"""proof.fp8.params / transcript / lottery: the §15 vectors and randomized checks against literal references."""
import random
import struct

import blake3
import numpy as np
import pytest

from proof.blake3tree import keyed_tree_root
from proof.fp8 import lottery, transcript
from proof.fp8.params import (AxisPattern, Device, DimType, HashId, JobParams, ParamsError, TileShape,
                              check_lottery_layout, make_job, select_tile, tile_max_k)

PARENT = bytes(range(32))
F, B, N = DimType.FOLD, DimType.BLAKE, DimType.NULL

SUBKEYS = {  # label: (unkeyed, keyed with PARENT) — fp8-and-integration.md §15
    "key-A": ("8bd812084a635e5161f84d2fb34f5c50d4e979becc07437fd4d4f6f4896cbc9d",
              "e97059b9fd3a5c744225db08e9dc3e63d795a51ddce01e2ea82f5e9c06925165"),
    "key-B": ("521d46f9dd031c281000380a382c3fdcd393ff59c71336c13b7347ad2c1a938f",
              "028107616c23fc723994b6e249e45b58f4e2e36aa1b4263be9c1041002ad8a58"),
    "seed-A": ("060fe1ea0482eb3b2cfb927fbcf7e5dd48118192fcb45dca34a58faec0469299",
               "9b454df4917a237f845a35fec59bda9e598b0c1222e09abe52cea8bf118890e6"),
    "seed-B": ("5472d30cc74f93d9273d7d3612bde3702b8f2f5958b4efc5e9235b0ec86b4e3a",
               "8330940458d1f040028c474dff27882dcf717656c5ed49bb9ca083bbff39faf1"),
    "noise-line": ("7aadc28ccbbef879bd58974d4b38c9d538c33b21ee6460b3185e933df1179e90",
                   "3f5176a01068c0b9e3c364a8670767a1b909dc5e2762ff99110edbcfe424c198"),
    "jackpot": ("bce6af9f8fc1313d6904c8315a10e58b476a0cda822c1be77233c98eb1127eb5",
                "1abccbdca824c1fa9707f6456144fcd48a2567a143ac8dc85c7b6ff11f3dc28f"),
}


@pytest.mark.parametrize("label", sorted(SUBKEYS))
def test_subkeys(label):
    unkeyed, keyed = SUBKEYS[label]
    assert transcript.subkey(label).hex() == unkeyed
    assert transcript.subkey(label, PARENT).hex() == keyed


def test_zk_public_unkeyed_subkey():
    assert transcript.subkey("zk-public").hex() == \
        "ffc5d44fcccba998161cc9890c2d2ceb6133a1689a4d6699d3552d646fa04ff3"


@pytest.mark.parametrize("message,unkeyed,keyed", [
    (b"", "f9c774347cc10b0dd5729b13925f246e8d21487dce485be8ab4013727c2a2d15",
     "79311dd1640edf6873c8d7a956b501b2562e203e41a11bf24ff24adf1c1a32f9"),
    (b"x", "7cdc56fbcde7155cbe3604c99a35831cca9fbeb53e1964d7b6f0cb7b5ce65c69", None),
    (bytes(range(64)), "8cd0fb004b120832471a26ce8958f469c55cb19684b6dee0687bbc6dbf890bbb",
     "c9bfd8a818a577b8aa717b0b58294381fff818e0af65ed1283189e644f778d11"),
])
def test_h_seed_a_vectors(message, unkeyed, keyed):
    assert transcript.hash_labelled(message, "seed-A").hex() == unkeyed
    if keyed:
        assert transcript.hash_labelled(message, "seed-A", PARENT).hex() == keyed


def test_unkeyed_subkey_differs_from_zero_key():
    assert transcript.subkey("jackpot") != transcript.subkey("jackpot", bytes(32))


def test_seed_chain_is_the_literal_concatenation():
    rng = random.Random(1)
    d = [bytes(rng.getrandbits(8) for _ in range(32)) for _ in range(6)]
    header76, header108 = bytes(range(76)), bytes(range(108))
    ka, kb = transcript.key_a(header76), transcript.key_b(header108)
    assert ka == blake3.blake3(header76, key=transcript.subkey("key-A")).digest()
    assert kb == blake3.blake3(header108, key=transcript.subkey("key-B")).digest()
    hb = transcript.operand_digest(d[0], d[1], kb)
    assert hb == blake3.blake3(d[0] + d[1], key=kb).digest()
    p_b, p_a = bytes(21), bytes(11)
    sb = transcript.seed_b(hb, kb, p_b)
    assert sb == blake3.blake3(hb + kb + p_b, key=transcript.subkey("seed-B")).digest()
    dense = transcript.seed_a(d[2], sb, ka, p_a)
    assert dense == blake3.blake3(d[2] + sb + ka + p_a, key=transcript.subkey("seed-A")).digest()
    moe = transcript.seed_a(d[2], sb, ka, p_a + b"\x03\x03", routing=(d[3], d[4]))
    assert moe == blake3.blake3(d[2] + d[3] + d[4] + sb + ka + p_a + b"\x03\x03",
                                key=transcript.subkey("seed-A")).digest()
    assert transcript.jackpot_key(dense) == blake3.blake3(b"pearl/v4/FP8/jackpot", key=dense).digest()
    assert transcript.noise_line_key(sb) == blake3.blake3(b"pearl/v4/FP8/noise-line", key=sb).digest()
    assert transcript.zk_public_digest(header76, b"pd") == \
        blake3.blake3(header76 + b"pd", key=transcript.subkey("zk-public")).digest()


def test_transcript_rejects_bad_lengths():
    with pytest.raises(ValueError, match="76 bytes"):
        transcript.key_a(bytes(75))
    with pytest.raises(ValueError, match="108 bytes"):
        transcript.key_b(bytes(76))
    with pytest.raises(ValueError, match="HB"):
        transcript.seed_b(bytes(31), bytes(32), bytes(21))


def test_pb_pa_example_bytes():
    job = make_job(bytes(108), m=2048, n=4096, k=4096, device=Device.HOPPER)
    assert job.p_b().hex() == "00100000" "00100000" "2000" "00" "00" "03" "050e1d030303" "0000"
    assert job.p_a().hex() == "00080000" "03" "0e0303030303"
    assert JobParams.from_wire_bytes(job.to_wire_bytes()) == job


def test_moe_pb_pa_carry_experts_and_hash_ids():
    job = make_job(bytes(108), m=64, n=8 * 128, k=1024, experts=8)
    assert job.p_b()[-2:] == struct.pack("<H", 8) and len(job.p_b()) == 21
    assert job.p_a()[-2:] == b"\x03\x03" and len(job.p_a()) == 13
    assert JobParams.from_wire_bytes(job.to_wire_bytes()) == job


@pytest.mark.parametrize("dims,hexed", [
    ([(4, B)], "0e0303030303"),
    ([(2, F), (4, B), (8, F)], "050e1d030303"),
    ([(2, F), (4, B), (16, F)], "050e3d030303"),
    ([(16, B)], "3e0303030303"),
    ([(32, F)], "7d0303030303"),
])
def test_axis_pattern_encodings(dims, hexed):
    pattern = AxisPattern(dims)
    assert pattern.to_bytes().hex() == hexed
    assert AxisPattern.from_bytes(bytes.fromhex(hexed)) == pattern


def test_axis_pattern_canonical_form_and_rejections():
    assert AxisPattern([(4, N), (2, F), (1, B), (3, F)]) == AxisPattern([(4, N), (6, F)])
    assert AxisPattern([(128, N), (2, F)]).to_bytes().hex() == "fc0405030303"  # 128 -> 64·2
    for bad in ([(0, F)], [(2, F), (4, N)], [(134, N), (2, F)], [(1 << 13, N), (1 << 12, F)],
                [(2, N), (2, F)] * 3 + [(2, B)], [(2, DimType.NONE)]):
        with pytest.raises(ParamsError):
            AxisPattern(bad)
    for encoding in ("000303030303", "0c0303030303", "7d0503030303", "0d0303030303030303",
                     "0d0303", "0d030e030303", "0d0003030303", "0d0703030303"):
        with pytest.raises(ParamsError):
            AxisPattern.from_bytes(bytes.fromhex(encoding))


def _literal_offsets(dims, types):
    """Enumerate every mixed-radix number and keep the digit sums of the selected dims."""
    total = int(np.prod([n for n, _ in dims])) if dims else 1
    out = set()
    for value in range(total):
        rest, stride, acc = value, 1, 0
        for length, t in dims:
            digit = rest % length
            rest //= length
            if t in types:
                acc += digit * stride
            stride *= length
        out.add(acc)
    return sorted(out)


def test_axis_pattern_random_against_literal_enumeration():
    rng = random.Random(7)
    checked = 0
    while checked < 60:
        dims = [(rng.choice([2, 3, 4, 5, 8]), DimType(rng.randrange(3))) for _ in range(rng.randrange(1, 5))]
        try:
            pattern = AxisPattern(dims)
        except ParamsError:
            continue
        checked += 1
        canon = list(pattern.dims)
        assert pattern.tile_offsets() == _literal_offsets(canon, {F, B})
        assert pattern.fold_offsets() == _literal_offsets(canon, {F})
        assert pattern.blake_offsets() == _literal_offsets(canon, {B})
        assert pattern.valid_offsets() == _literal_offsets(canon, {N})
        assert AxisPattern.from_bytes(pattern.to_bytes()) == pattern
        lattice = set(pattern.valid_offsets())
        for offset in range(2 * pattern.total):
            assert pattern.offset_is_valid(offset) == (offset % pattern.total in lattice)


def test_tile_shapes_and_select_tile():
    assert (tile_max_k(4, 64), tile_max_k(4, 128), tile_max_k(16, 32)) == (61440, 31744, 65536)
    assert select_tile("hopper", 4096, 4096) == TileShape(4, 64)
    assert select_tile(Device.HOPPER, 4096 + 64, 61440) == TileShape(4, 64)
    assert select_tile("blackwell", 32 * 3, 1024) == TileShape(16, 32)
    with pytest.raises(ParamsError, match="no hopper lottery tile"):
        select_tile("hopper", 32 * 3, 1024)
    with pytest.raises(ParamsError, match="multiple of 512"):
        select_tile("hopper", 4096, 1024 + 32)
    for tile in (TileShape(4, 64), TileShape(4, 128), TileShape(16, 32)):
        check_lottery_layout(tile.row_pattern, tile.col_pattern)


def test_lottery_layout_limits():
    with pytest.raises(ParamsError, match="exactly 16"):
        check_lottery_layout(AxisPattern([(4, B)]), AxisPattern([(32, F), (2, B)]))
    with pytest.raises(ParamsError, match="h must|rows h"):
        check_lottery_layout(AxisPattern([(2, B)]), AxisPattern([(8, B), (32, F)]))
    with pytest.raises(ParamsError, match="tile area"):
        check_lottery_layout(AxisPattern([(4, B)]), AxisPattern([(4, B), (1024, F)]))


def test_device_parse_and_enums():
    assert Device.parse("h200") is Device.HOPPER and Device.parse(1) is Device.BLACKWELL
    assert Device.HOPPER.model == "hopper"
    assert [h.leaf_size for h in HashId] == [128, 256, 512, 1024]
    with pytest.raises(ParamsError, match="Device"):
        Device.decode(2)


def test_fold_lane0_cells():
    both = AxisPattern([(2, F), (4, B)])
    lanes = lottery.lane_assignment(both, both)
    assert len(lanes) == 16 and lanes[0] == [0, 1, 8, 9]
    assert sorted(c for lane in lanes for c in lane) == list(range(64))


def _fold_reference(tile, lanes):
    words = [struct.unpack("<I", struct.pack("<f", float(v)))[0] for v in np.asarray(tile, np.float32).ravel()]
    out = b""
    for cells in lanes:
        lane = 0
        for c in cells:
            x = (lane * 0x9E3779B1 + words[c]) & 0xFFFFFFFF
            lane = ((x << 13) | (x >> 19)) & 0xFFFFFFFF
        out += struct.pack("<I", lane)
    return out


@pytest.mark.parametrize("tile_shape", [TileShape(4, 64), TileShape(4, 128), TileShape(16, 32)])
def test_fold_message_matches_a_literal_loop(tile_shape):
    rng = np.random.default_rng(tile_shape.cols)
    rows, cols = tile_shape.row_pattern, tile_shape.col_pattern
    tile = (rng.standard_normal((rows.tile_size, cols.tile_size)) * 1e3).astype(np.float32)
    tile[0, 0], tile[0, 1] = 0.0, -0.0
    lanes = lottery.lane_assignment(rows, cols)
    assert lottery.fold_message(tile, rows, cols) == _fold_reference(tile, lanes)
    negated = tile.copy()
    negated[0, 0] = -0.0  # +0 and −0 fold differently
    assert lottery.fold_message(negated, rows, cols) != lottery.fold_message(tile, rows, cols)
    with pytest.raises(ParamsError, match="tile shape"):
        lottery.fold_message(tile[:, :-1], rows, cols)


def test_hopper_lane_columns():
    tile = TileShape(4, 64)
    lanes = lottery.lane_assignment(tile.row_pattern, tile.col_pattern)
    assert lanes[0] == [c for nb in range(8) for c in (8 * nb, 8 * nb + 1)]
    assert lanes[5] == [64 + c for nb in range(8) for c in (8 * nb + 2, 8 * nb + 3)]


def test_ticket_threshold_and_win():
    seed = bytes(range(32))
    msg = bytes(64)
    assert lottery.ticket(seed, msg) == blake3.blake3(msg, key=transcript.jackpot_key(seed)).digest()
    assert lottery.threshold(5, 4, 64, 1024) == 5 * 4 * 64 * 1024
    assert lottery.threshold(1 << 240, 4, 64, 65536) == (1 << 256) - 1
    t = lottery.ticket(seed, msg)
    value = int.from_bytes(t, "little")
    assert lottery.is_winner(t, value) and not lottery.is_winner(t, value - 1)
    assert lottery.threshold_bytes(value) == t


def test_tile_bases_and_parse():
    rows = AxisPattern([(4, B)])
    assert lottery.tile_bases(rows, 10) == [0, 4]
    gapped = AxisPattern([(2, F), (4, N), (2, B)])
    assert lottery.tile_bases(gapped, 30) == [0, 2, 4, 6, 16, 18, 20]
    assert lottery.tile_indices(gapped, 18) == [18, 19, 26, 27]
    assert lottery.parse_tile_base([18, 19, 26, 27], gapped) == 18
    assert [lottery.tile_base(gapped, i) for i in range(7)] == lottery.tile_bases(gapped, 30)
    assert lottery.tile_base(TileShape(4, 64).col_pattern, 3) == 192
    for bad in ([19, 20, 27, 28], [18, 19, 26], [18, 19, 27, 26], []):
        with pytest.raises(ParamsError):
            lottery.parse_tile_base(bad, gapped)


def test_credit():
    assert lottery.credited_work(8, 128, 1024) == 8 * 128 * 1024
    assert lottery.credited_work_moe([5, 8, 3], 128, 1024, 4) == (4 + 8 + 0) * 128 * 1024


def test_ho_offsets_roots():
    key = bytes(range(32))
    offsets = struct.pack("<3I", 3, 7, 9)
    assert keyed_tree_root(key, offsets, 1024).hex() == \
        "53aa5cb0b531c648f26f806b927438ad8790b843cbb07a4f367f73d91d0129dd"
    many = struct.pack("<40I", *range(1, 41))
    assert keyed_tree_root(key, many, 128).hex() == \
        "57b274de6735d0657ffbc0f3cf81016d56e45e6440c017d5a52315c5f676ddcc"
