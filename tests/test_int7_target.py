"""Jackpot bounds: int-protocol.md §9.2–9.3 and node-consensus.md §6.6 values."""
import pytest

from proof.int7 import Int7Error, MiningConfig, meets_bound, penalized_bound, ticket_value, unpenalized_bound

ROWS = [0, 8, 64, 72]
COLS = [0, 1, 8, 9, 32, 33, 40, 41]


def config(k, rank):
    return MiningConfig(k, rank, ROWS, COLS)


@pytest.mark.parametrize("bits, target", [  # int-protocol.md §9.2
    (0x1D00FFFF, 0xFFFF << 208), (0x1B0404CB, 0x0404CB << 192), (0x03123456, 0x123456),
    (0x1D000000, 0), (0x2077FFFF, 0x77FFFF << 232), (0x1D800000, 0),
])
def test_bound_is_target_times_tile_work(bits, target):
    cfg = config(4096, 128)
    factor = 32 * 4096
    assert unpenalized_bound(bits, cfg) == min(target * factor, (1 << 256) - 1)


def test_penalty_is_neutral_at_base_rank():
    assert penalized_bound(0x1D00FFFF, config(4096, 128)) == unpenalized_bound(0x1D00FFFF, config(4096, 128))


@pytest.mark.parametrize("multiple", [2, 4, 8])
def test_penalty_divides_bound_by_rank_multiple(multiple):
    cfg = config(65536, 128 * multiple)
    assert penalized_bound(0x1D00FFFF, cfg) == unpenalized_bound(0x1D00FFFF, cfg) // multiple


def test_go_rank_penalty_vector():  # node-consensus.md §6.6: DefaultNBits, k = 8192, tile 32
    bound = penalized_bound(0x1E01FFFF, config(8192, 128))
    assert bound == 0x1FFFF << 234 == 0x7FFFC << 232
    assert bound.to_bytes(32, "little")[-4:] == bytes.fromhex("00fcff07")


def test_penalty_rejects_low_rank_and_degenerate_configs():
    for rank in (32, 64):
        with pytest.raises(Int7Error, match="rank must be >= 128"):
            penalized_bound(0x1D00FFFF, config(4096, rank))
    with pytest.raises(Int7Error, match="degenerate"):
        penalized_bound(0x1D00FFFF, config(64, 128))


def test_bounds_saturate():
    assert unpenalized_bound(0x207FFFFF, config(2048, 128)) == (1 << 256) - 1
    assert penalized_bound(0x207FFFFF, config(2048, 128)) == (1 << 256) - 1


def test_ticket_is_read_little_endian():
    assert ticket_value(bytes([1]) + bytes(31)) == 1
    assert ticket_value(bytes(31) + bytes([1])) == 1 << 248
    with pytest.raises(Int7Error, match="32 bytes"):
        ticket_value(bytes(31))


@pytest.mark.parametrize("rank", [128, 256])
def test_bound_is_inclusive(rank):  # accepted at the bound, rejected at bound + 1
    bound = penalized_bound(0x1D00FFFF, config(65536, rank))
    assert meets_bound(bound.to_bytes(32, "little"), bound)
    assert not meets_bound((bound + 1).to_bytes(32, "little"), bound)
