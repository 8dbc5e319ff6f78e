"""PeriodicPattern and MiningConfig: int-protocol.md §1, §1.1 and node-consensus.md §6.8 values."""
import pytest

from proof.int7 import Int7Error, MiningConfig, PeriodicPattern, list_to_pattern

ROWS = [0, 8, 64, 72]
COLS = [0, 1, 8, 9, 32, 33, 40, 41]

ENCODINGS = [  # int-protocol.md §1.1
    ([0, 8, 64, 72], ((8, 2), (64, 2), (128, 1)), "070103010000"),
    ([0, 1, 8, 9, 32, 33, 40, 41], ((1, 2), (8, 2), (32, 2)), "000103010101"),
    ([0, 1, 8, 9, 32, 33, 40, 41, 64, 65, 72, 73, 96, 97, 104, 105], ((1, 2), (8, 2), (32, 4)),
     "000103010103"),
    ([0, 1, 8, 9, 64, 65, 72, 73], ((1, 2), (8, 2), (64, 2)), "000103010301"),
    (list(range(16)), ((1, 16), (16, 1), (16, 1)), "000f00000000"),
    ([0, 32], ((32, 2), (64, 1), (64, 1)), "1f0100000000"),
]


@pytest.mark.parametrize("indices, shape, hexbytes", ENCODINGS)
def test_pattern_encodings(indices, shape, hexbytes):
    pattern = PeriodicPattern.from_list(indices)
    assert pattern.shape == shape
    assert pattern.to_bytes().hex() == hexbytes
    assert PeriodicPattern.from_bytes(bytes.fromhex(hexbytes)) == pattern
    assert pattern.to_list() == indices
    assert pattern.size == len(indices) and pattern.max == indices[-1]


def test_pattern_period_and_single_index():
    assert PeriodicPattern.from_list([0, 1, 2, 3]).period == 4
    assert PeriodicPattern.from_list([0, 1, 8, 9]).period == 16
    assert PeriodicPattern.from_list([0]).to_bytes() == bytes(6)


@pytest.mark.parametrize("indices, message", [
    ([], "empty"), ([0, 1, 3], "not periodic"), ([1, 2, 3, 4], "start at 0"),
    ([0, 2, 1], "strictly increasing"),
    ([0, 1, 4, 5, 16, 17, 20, 21, 64, 65, 68, 69, 80, 81, 84, 85], "at most 3"),
])
def test_pattern_from_list_rejects(indices, message):
    with pytest.raises(Int7Error, match=message):
        PeriodicPattern.from_list(indices)


@pytest.mark.parametrize("hexbytes, message", [
    ("0001000100", "expected 6 bytes"),
    ("000100000001", "non-canonical"),  # a dimension after a length-1 one
    ("070000000000", "non-canonical"),  # length 1 with a factor
    ("000100010000", "single stride"),  # factor 1 after the first dimension
    ("ffffffff0000", "2\\^24"),
])
def test_pattern_from_bytes_rejects(hexbytes, message):
    with pytest.raises(Int7Error, match=message):
        PeriodicPattern.from_bytes(bytes.fromhex(hexbytes))


def test_offsets_tile_the_axis_exactly_once():
    for indices in ([0, 8, 64, 72], COLS, [0, 1, 8, 9, 64, 65, 72, 73]):
        pattern = PeriodicPattern.from_list(indices)
        covered = [0] * (2 * pattern.period)
        for t in range(2 * pattern.period):
            if pattern.offset_is_valid(t):
                for p in indices:
                    if t + p < len(covered):
                        covered[t + p] += 1
        assert covered == [1] * len(covered)


def test_list_to_pattern_splits_offset_and_checks_it():
    assert list_to_pattern([4, 5, 12, 13, 36, 37, 44, 45]) == (PeriodicPattern.from_list(COLS), 4)
    with pytest.raises(Int7Error, match="offset 8 is not a valid"):
        list_to_pattern([8, 9, 16, 17, 40, 41, 48, 49])


def test_default_config_bytes():  # int-protocol.md §1.1 [D]
    config = MiningConfig(2048, 128, ROWS, COLS)
    assert config.to_bytes().hex() == "0008000080000000070103010000000103010101" + "00" * 32
    assert (config.h, config.w, config.dot_product_length) == (4, 8, 2048)
    assert MiningConfig.from_bytes(config.to_bytes()) == config
    config.check_limits()


def test_v1_era_config_bytes():  # node-consensus.md §6.8
    config = MiningConfig(1024, 32, ROWS, COLS)
    assert config.to_bytes().hex() == "00040000" "2000" "0000" "070103010000" "000103010101" + "00" * 32


def test_moe_trailer():
    config = MiningConfig(2048, 128, ROWS, COLS, experts=4, top_k=2)
    assert config.to_bytes()[20:24] == bytes([4, 0, 2, 0])
    assert MiningConfig.from_bytes(config.to_bytes()) == config and config.is_moe


@pytest.mark.parametrize("patch, message", [
    ({6: 1}, "mma_type"), ({40: 1}, "reserved"), ({22: 1}, "top_k must be 0"),
    ({8: 0, 9: 3, 10: 0, 11: 0, 12: 0, 13: 1}, "non-canonical"),
])
def test_config_from_bytes_rejects(patch, message):
    data = bytearray(MiningConfig(2048, 128, ROWS, COLS).to_bytes())
    for offset, value in patch.items():
        data[offset] = value
    with pytest.raises(Int7Error, match=message):
        MiningConfig.from_bytes(bytes(data))


def test_config_from_bytes_rejects_wrong_length():
    with pytest.raises(Int7Error, match="expected 52 bytes"):
        MiningConfig.from_bytes(bytes(51))


@pytest.mark.parametrize("k, rank, rows, cols, experts, top_k, message", [
    (2048, 96, ROWS, COLS, 0, 0, "power of two"),
    (2048, 2048, ROWS, COLS, 0, 0, "power of two"),
    (2048 + 32, 128, ROWS, COLS, 0, 0, "multiple of 64"),
    (1024, 128, ROWS, COLS, 0, 0, "16·r"),
    (1 << 17, 1024, ROWS, COLS, 0, 0, "multiple of 64 in"),
    (8192, 32, ROWS, COLS, 0, 0, "4·r²"),
    (2048, 128, [0, 1, 2], list(range(16)), 0, 0, "even"),
    (2048, 128, [0, 1], list(range(8)), 0, 0, "\\[32, 256\\]"),
    (2048, 128, list(range(32)), list(range(16)), 0, 0, "\\[32, 256\\]"),
    (2048, 128, ROWS, COLS, 1025, 2, "maximum"),
    (2048, 128, ROWS, COLS, 4, 4, "top_k"),
    (2048, 128, ROWS, COLS, 4, 0, "top_k"),
])
def test_config_limits(k, rank, rows, cols, experts, top_k, message):
    with pytest.raises(Int7Error, match=message):
        MiningConfig(k, rank, rows, cols, experts, top_k).check_limits()


def test_config_rejects_top_k_without_experts():
    with pytest.raises(Int7Error, match="top_k must be 0"):
        MiningConfig(2048, 128, ROWS, COLS, 0, 2)
