"""Noise factors, transcript, ticket and peel against literal per-element references (§4–§6)."""
import blake3
import numpy as np
import pytest

from proof.int7 import (LABEL_A, LABEL_B, Int7Error, PeriodicPattern, apply_sparse, chunk_dot_products,
                        noise_a_rows, noise_b_cols, noised, peel, sparse_factor, ticket, tile_transcripts,
                        transcript_words, uniform_factor)
from proof.int7.transcript import tile_index_sets


def ref_block(index, label, key, slot):
    message = bytearray(64)
    message[4 * slot:4 * slot + 4] = (index + 1).to_bytes(4, "little", signed=True)
    message[32:] = label
    return blake3.blake3(bytes(message), key=key).digest()


def ref_uniform_row(key, label, row, rank):
    return [(ref_block(f // 32, label, key, 0)[f % 32] & 0x3F) - 32 for f in range(row * rank, (row + 1) * rank)]


def ref_sparse(key, label, k, rank):
    pairs = []
    for l in range(k):
        block = ref_block(l // 8, label, key, 1)
        u = int.from_bytes(block[4 * (l % 8):4 * (l % 8) + 4], "little")
        first = u & (rank - 1)
        pairs.append((first, first ^ (1 + (((rank - 1) * u) >> 32))))
    return pairs


def ref_transcript(a, bt, rank):
    """The literal loop of int-protocol.md §5.2: exact running sums, XOR per chunk, rotl13 fold."""
    h, k = a.shape
    w = bt.shape[0]
    sums = [[0] * w for _ in range(h)]
    words = [0] * 16
    for c in range(k // rank):
        xor = 0
        for i in range(h):
            for j in range(w):
                for l in range(c * rank, (c + 1) * rank):
                    sums[i][j] += int(a[i][l]) * int(bt[j][l])
                xor ^= sums[i][j] & 0xFFFFFFFF
        old = words[c % 16]
        words[c % 16] = (((old << 13) | (old >> 19)) & 0xFFFFFFFF) ^ xor
    return words


@pytest.mark.parametrize("rank", [32, 128])
def test_uniform_factor_matches_literal_reference(rank):
    key = bytes(range(32))
    rows = [0, 3, 17]
    got = uniform_factor(key, LABEL_A, rows, rank)
    assert got.dtype == np.int8 and got.shape == (3, rank)
    assert [list(map(int, r)) for r in got] == [ref_uniform_row(key, LABEL_A, r, rank) for r in rows]
    assert got.min() >= -32 and got.max() <= 31


@pytest.mark.parametrize("rank, k", [(32, 100), (128, 2048), (1024, 64)])
def test_sparse_factor_matches_literal_reference(rank, k):
    key = bytes(range(1, 33))
    first, second = sparse_factor(key, LABEL_B, k, rank)
    assert list(zip(first.tolist(), second.tolist())) == ref_sparse(key, LABEL_B, k, rank)
    assert np.all(first != second) and first.max() < rank and second.max() < rank and second.min() >= 0


def test_noise_rows_and_columns():
    s_a, s_b, k, rank = bytes([7]) * 32, bytes([9]) * 32, 256, 64
    pairs_a = ref_sparse(s_a, LABEL_A, k, rank)
    u = ref_uniform_row(s_a, LABEL_A, 5, rank)
    assert noise_a_rows(s_a, k, rank, [5])[0].tolist() == [u[f] - u[s] for f, s in pairs_a]
    pairs_b = ref_sparse(s_b, LABEL_B, k, rank)
    u = ref_uniform_row(s_b, LABEL_B, 11, rank)
    assert noise_b_cols(s_b, k, rank, [11])[0].tolist() == [u[f] - u[s] for f, s in pairs_b]
    with pytest.raises(Int7Error, match="power of two"):
        uniform_factor(s_a, LABEL_A, [0], 48)


def test_noised_operands_stay_in_int8():
    values = np.array([[-64, 64, 0]], dtype=np.int8)
    assert noised(values, np.array([[-63, 63, -63]], dtype=np.int8)).tolist() == [[-127, 127, -63]]


@pytest.mark.parametrize("seed", range(6))
def test_transcript_matches_literal_reference(seed):
    rng = np.random.default_rng(seed)
    rank = int(rng.choice([32, 64]))
    k = rank * int(rng.integers(3, 20)) + int(rng.integers(0, rank))  # includes an ignored tail
    h, w = int(rng.integers(1, 5)), int(rng.integers(1, 6))
    a = rng.integers(-127, 128, size=(h, k), dtype=np.int8)
    bt = rng.integers(-127, 128, size=(w, k), dtype=np.int8)
    assert transcript_words(a, bt, rank).tolist() == ref_transcript(a, bt, rank)


def test_all_tiles_agree_with_single_tile_transcripts():
    rng = np.random.default_rng(42)
    rows, cols, rank, k = PeriodicPattern.from_list([0, 2]), PeriodicPattern.from_list([0, 1, 4, 5]), 32, 320
    a = rng.integers(-127, 128, size=(8, k), dtype=np.int8)
    bt = rng.integers(-127, 128, size=(16, k), dtype=np.int8)
    row_offsets, row_tiles = tile_index_sets(rows, 8)
    col_offsets, col_tiles = tile_index_sets(cols, 16)
    assert row_offsets == [0, 1, 4, 5] and col_offsets == [0, 2, 8, 10]
    words = tile_transcripts(a, bt, rank, row_tiles, col_tiles)
    for i, r in enumerate(row_tiles):
        for j, c in enumerate(col_tiles):
            assert words[i, j].tolist() == ref_transcript(a[r], bt[c], rank)


def test_chunk_sums_are_exact_at_the_extremes():
    k, rank = 65536, 1024
    a = np.full((1, k), -127, dtype=np.int8)
    bt = np.full((2, k), 127, dtype=np.int8)
    bt[1] = -127
    sums = chunk_dot_products(a, bt, rank)
    assert sums[-1].tolist() == [[-127 * 127 * k, 127 * 127 * k]]


def test_ticket_is_keyed_hash_of_le_words():
    words = np.arange(16, dtype=np.uint32) * 0x01010101
    key = bytes([3]) * 32
    expected = blake3.blake3(b"".join(int(x).to_bytes(4, "little") for x in words), key=key).digest()
    assert ticket(key, words) == expected
    with pytest.raises(Int7Error, match="16 transcript words"):
        ticket(key, words[:15])


@pytest.mark.parametrize("seed", range(3))
def test_peel_recovers_the_product_exactly(seed):
    rng = np.random.default_rng(seed)
    m, n, k, rank = 12, 9, 256, 32
    s_a, s_b = rng.bytes(32), rng.bytes(32)
    a = rng.integers(-64, 65, size=(m, k), dtype=np.int8)
    b = rng.integers(-64, 65, size=(k, n), dtype=np.int8)
    u_a = uniform_factor(s_a, LABEL_A, range(m), rank)
    u_b = uniform_factor(s_b, LABEL_B, range(n), rank)
    p_a, p_b = sparse_factor(s_a, LABEL_A, k, rank), sparse_factor(s_b, LABEL_B, k, rank)
    a_noised = noised(a, apply_sparse(u_a, *p_a))
    b_noised = noised(b.T, apply_sparse(u_b, *p_b)).T
    product = a_noised.astype(np.int64) @ b_noised.astype(np.int64)
    assert not np.array_equal(product, a.astype(np.int64) @ b)
    assert np.array_equal(peel(product, a, b_noised, u_a, p_a, u_b, p_b), a.astype(np.int64) @ b)


def test_moe_peel_gathers_rows_and_expert_columns():
    """C_e = A'_e·W'_e − Gather(A·P_B)·U_B[e]ᵀ − Gather(U_A)·(P_Aᵀ·W'_e): the peel on an expert slice."""
    rng = np.random.default_rng(9)
    m, n_e, experts, k, rank = 10, 6, 3, 128, 32
    s_a, s_b = rng.bytes(32), rng.bytes(32)
    a = rng.integers(-64, 65, size=(m, k), dtype=np.int8)
    b = rng.integers(-64, 65, size=(k, experts * n_e), dtype=np.int8)
    u_a = uniform_factor(s_a, LABEL_A, range(m), rank)
    u_b = uniform_factor(s_b, LABEL_B, range(experts * n_e), rank)
    p_a, p_b = sparse_factor(s_a, LABEL_A, k, rank), sparse_factor(s_b, LABEL_B, k, rank)
    a_noised = noised(a, apply_sparse(u_a, *p_a))
    b_noised = noised(b.T, apply_sparse(u_b, *p_b)).T
    tokens, cols = np.array([1, 4, 5, 9]), np.arange(n_e, 2 * n_e)
    product = a_noised[tokens].astype(np.int64) @ b_noised[:, cols].astype(np.int64)
    recovered = peel(product, a[tokens], b_noised[:, cols], u_a[tokens], p_a, u_b[cols], p_b)
    assert np.array_equal(recovered, a[tokens].astype(np.int64) @ b[:, cols])
