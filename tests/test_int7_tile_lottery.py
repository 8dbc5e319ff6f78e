"""The INT7 lottery over stored tile transcripts (kernels.int7.tile_lottery) against proof.int7:
every tile's ticket, the first-winner record of a planted bound, tile eligibility, bad shapes."""
import numpy as np
import pytest
import torch

from kernels.int7.blake3 import bytes_from_words
from kernels.int7.mined_gemm import DUMP_WORDS, RECORD_WORDS, MinedGemmError
from kernels.int7.pipeline import bound_words
from kernels.int7.tile_lottery import tile_lottery
from proof.int7 import ticket, ticket_value, tile_transcripts

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
E, M, N, K, RANK, H, W = 2, 24, 256, 384, 128, 2, 128  # 12 tile rows: a program's tail is masked


@pytest.fixture(scope="module")
def instances():
    gen = np.random.default_rng(7)
    a = gen.integers(-127, 128, size=(E, M, K), dtype=np.int8)
    bt = gen.integers(-127, 128, size=(E, N, K), dtype=np.int8)
    s_a = torch.from_numpy(gen.integers(-2**31, 2**31 - 1, size=(E, 8)).astype(np.int32))
    words = np.stack([tile_transcripts(a[e], bt[e], RANK, np.arange(M).reshape(-1, H),
                                       np.arange(N).reshape(-1, W)) for e in range(E)])
    return s_a, words  # words (E, M/H, N/W, 16) uint32


def _draw(s_a, words, bound, rows_valid=M):
    record = torch.zeros(RECORD_WORDS, dtype=torch.int32, device=DEVICE)
    dump = torch.zeros((E, M // H, N // W, DUMP_WORDS), dtype=torch.int32, device=DEVICE)
    stored = torch.from_numpy(words.view(np.int32).reshape(E * M // H, N // W, 16).copy()).to(DEVICE)
    tile_lottery(stored, s_a.to(DEVICE), bound_words(bound, DEVICE),
                 torch.full((E,), rows_valid, dtype=torch.int32, device=DEVICE), record,
                 rows=M, tile_h=H, tile_w=W, dump=dump)
    return record.cpu(), dump.cpu()


def test_every_tile_ticket_matches_the_reference(instances):
    s_a, words = instances
    record, dump = _draw(s_a, words, bound=0)
    assert np.array_equal(dump[..., :16].numpy().view(np.uint32), words)
    for e in range(E):
        key = bytes_from_words(s_a[e])
        for i in range(M // H):
            for j in range(N // W):
                assert bytes_from_words(dump[e, i, j, 16:]) == ticket(key, words[e, i, j])
    assert record[0] == 0  # bound 0: nobody wins


def test_planted_winner_is_recorded_and_ineligible_rows_never_win(instances):
    s_a, words = instances
    half = M // 2
    best = min((ticket_value(ticket(bytes_from_words(s_a[e]), words[e, i, j])), e, i, j)
               for e in range(E) for i in range(half // H) for j in range(N // W))
    record, _ = _draw(s_a, words, bound=best[0], rows_valid=half)
    assert record[0] == 1
    assert record[1:4].tolist() == [best[1], best[2] * H, best[3] * W]
    assert ticket_value(bytes_from_words(record[4:12])) == best[0]


def test_bad_shapes_are_named(instances):
    s_a, words = instances
    stored = torch.zeros((E * M // H, N // W, 16), dtype=torch.int32, device=DEVICE)
    args = (s_a.to(DEVICE), bound_words(0, DEVICE), torch.full((E,), M, dtype=torch.int32, device=DEVICE),
            torch.zeros(RECORD_WORDS, dtype=torch.int32, device=DEVICE))
    with pytest.raises(MinedGemmError, match="words must be"):
        tile_lottery(stored[:-1], *args, rows=M, tile_h=H, tile_w=W)
    with pytest.raises(MinedGemmError, match="whole 2-row tiles"):
        tile_lottery(stored, *args, rows=M + 1, tile_h=H, tile_w=W)
