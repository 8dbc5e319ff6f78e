"""proof.blake3tree against the blake3 package, a literal pure-Python BLAKE3 and the spec vectors."""
from __future__ import annotations

import os
import random
import struct

import blake3
import pytest

from proof import blake3tree as bt

KEY = bytes(range(32))
PEARL_TEST_KEY = b"0123456789abcdef0123456789abcdef"


# --- literal reference: BLAKE3 as written in the paper, one word at a time -----------------------

def _ref_compress(cv, block, counter, block_len, flags):
    m = list(struct.unpack("<16I", block))
    v = list(cv) + list(bt.IV[:4]) + [counter & 0xFFFFFFFF, counter >> 32, block_len, flags]
    mask = 0xFFFFFFFF

    def rotr(x, n):
        return ((x >> n) | (x << (32 - n))) & mask

    def g(a, b, c, d, x, y):
        v[a] = (v[a] + v[b] + x) & mask
        v[d] = rotr(v[d] ^ v[a], 16)
        v[c] = (v[c] + v[d]) & mask
        v[b] = rotr(v[b] ^ v[c], 12)
        v[a] = (v[a] + v[b] + y) & mask
        v[d] = rotr(v[d] ^ v[a], 8)
        v[c] = (v[c] + v[d]) & mask
        v[b] = rotr(v[b] ^ v[c], 7)

    for r in range(7):
        g(0, 4, 8, 12, m[0], m[1]); g(1, 5, 9, 13, m[2], m[3])
        g(2, 6, 10, 14, m[4], m[5]); g(3, 7, 11, 15, m[6], m[7])
        g(0, 5, 10, 15, m[8], m[9]); g(1, 6, 11, 12, m[10], m[11])
        g(2, 7, 8, 13, m[12], m[13]); g(3, 4, 9, 14, m[14], m[15])
        if r < 6:
            m = [m[p] for p in (2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8)]
    return [v[i] ^ v[i + 8] for i in range(8)] + [v[i + 8] ^ cv[i] for i in range(8)]


def _ref_words_to_bytes(words):
    return struct.pack("<8I", *words[:8])


def _ref_chunk_cv(key, chunk, counter, root):
    kw = list(struct.unpack("<8I", key))
    cv = kw
    blocks = len(chunk) // 64
    for j in range(blocks):
        flags = bt.KEYED_HASH | (bt.CHUNK_START if j == 0 else 0)
        if j == blocks - 1:
            flags |= bt.CHUNK_END | (bt.ROOT if root else 0)
        cv = _ref_compress(cv, chunk[64 * j:64 * j + 64], counter, 64, flags)[:8]
    return cv


def _ref_tree_root(key, data, leaf):
    """Literal pearl-blake3 tree: pad, hash leaves, pair neighbours, promote the odd last node."""
    padded = data + bytes((-len(data)) % leaf) if data else bytes(leaf)
    chunks = [padded[i:i + leaf] for i in range(0, len(padded), leaf)]
    if len(chunks) == 1:
        return _ref_words_to_bytes(_ref_chunk_cv(key, chunks[0], 0, True))
    kw = list(struct.unpack("<8I", key))
    nodes = [_ref_chunk_cv(key, c, i, False) for i, c in enumerate(chunks)]
    while len(nodes) > 1:
        flags = bt.KEYED_HASH | bt.PARENT | (bt.ROOT if len(nodes) == 2 else 0)
        nxt = [_ref_compress(kw, struct.pack("<16I", *(nodes[i] + nodes[i + 1])), 0, 64, flags)[:8]
               for i in range(0, len(nodes) - 1, 2)]
        if len(nodes) % 2:
            nxt.append(nodes[-1])
        nodes = nxt
    return _ref_words_to_bytes(nodes[0])


# --- compression function -------------------------------------------------------------------------

def test_compress_matches_literal_reference_on_random_inputs():
    rng = random.Random(1)
    for _ in range(20):
        cv = [rng.getrandbits(32) for _ in range(8)]
        block = rng.randbytes(64)
        counter = rng.getrandbits(64)
        block_len = rng.randrange(65)
        flags = rng.randrange(32)
        assert bt.compress(cv, block, counter, block_len, flags) == _ref_compress(
            cv, block, counter, block_len, flags)


@pytest.mark.parametrize("length", [0, 1, 31, 63, 64])
def test_single_block_compress_is_blake3(length):
    msg = bytes((7 * i + 3) % 256 for i in range(length))
    flags = bt.CHUNK_START | bt.CHUNK_END | bt.ROOT
    keyed = bt.compress(bt.key_words(KEY), msg, 0, length, flags | bt.KEYED_HASH)
    assert _ref_words_to_bytes(keyed) == blake3.blake3(msg, key=KEY).digest()
    plain = bt.compress(list(bt.IV), msg, 0, length, flags)
    assert _ref_words_to_bytes(plain) == blake3.blake3(msg).digest()


def test_key_words_little_endian():
    assert bt.key_words(KEY)[0] == 0x03020100
    assert bt.key_words(KEY)[7] == 0x1F1E1D1C


def test_compress_rejects_bad_arguments():
    with pytest.raises(ValueError, match="cv must have 8 words"):
        bt.compress([0] * 7, b"", 0, 0, 0)
    with pytest.raises(ValueError, match="block must be at most 64"):
        bt.compress([0] * 8, bytes(65), 0, 64, 0)
    with pytest.raises(ValueError, match="block_len"):
        bt.compress([0] * 8, b"", 0, 65, 0)
    with pytest.raises(ValueError, match="counter"):
        bt.compress([0] * 8, b"", 1 << 64, 0, 0)
    with pytest.raises(ValueError, match="key must be 32 bytes"):
        bt.key_words(bytes(31))


# --- roots ----------------------------------------------------------------------------------------

def test_root_equals_blake3_for_leaf_1024_on_random_sizes_up_to_8mb():
    rng = random.Random(2)
    sizes = [rng.randrange(1, 1 << 16) for _ in range(6)] + [rng.randrange(1 << 20, 8 << 20), 8 << 20]
    for size in sizes:
        data = os.urandom(size)
        expected = blake3.blake3(bt.pad_to_leaves(data, 1024), key=KEY).digest()
        assert bt.MerkleTree(KEY, data, 1024).root == expected, size
        assert bt.keyed_tree_root(KEY, data, 1024) == expected, size


@pytest.mark.parametrize("chunks", [1, 2, 3, 5, 7, 10])
def test_pearl_merkle_rs_chunk_counts(chunks):
    data = bytes(i % 256 for i in range(chunks * 1024))
    assert bt.MerkleTree(PEARL_TEST_KEY, data, 1024).root == blake3.blake3(data, key=PEARL_TEST_KEY).digest()


@pytest.mark.parametrize("size", [1, 100, 1023, 1025, 2000, 3000, 7777])
def test_pearl_merkle_rs_sizes(size):
    data = bytes(i % 256 for i in range(size))
    padded = bt.pad_to_leaves(data, 1024)
    expected = blake3.blake3(padded, key=PEARL_TEST_KEY).digest()
    assert bt.MerkleTree(PEARL_TEST_KEY, data, 1024).root == expected


@pytest.mark.parametrize("leaf", bt.LEAF_SIZES)
def test_small_leaf_roots_match_literal_reference(leaf):
    rng = random.Random(leaf)
    for size in [1, leaf, leaf + 1, 3 * leaf, 5 * leaf - 7, 11 * leaf + 5]:
        data = rng.randbytes(size)
        expected = _ref_tree_root(KEY, data, leaf)
        assert bt.keyed_tree_root(KEY, data, leaf) == expected, (leaf, size)
        assert bt.MerkleTree(KEY, data, leaf).root == expected, (leaf, size)


def test_ho_root_vectors():
    key = bytes(range(32))
    offsets = struct.pack("<3I", 3, 7, 9)
    assert bt.keyed_tree_root(key, offsets, 1024).hex() == (
        "53aa5cb0b531c648f26f806b927438ad8790b843cbb07a4f367f73d91d0129dd")
    assert bt.MerkleTree(key, offsets, 1024).root.hex() == (
        "53aa5cb0b531c648f26f806b927438ad8790b843cbb07a4f367f73d91d0129dd")
    one_to_forty = struct.pack("<40I", *range(1, 41))
    tree = bt.MerkleTree(key, one_to_forty, 128)
    assert tree.num_leaves == 2
    assert tree.root.hex() == "57b274de6735d0657ffbc0f3cf81016d56e45e6440c017d5a52315c5f676ddcc"


def test_empty_data_is_one_zero_leaf():
    for leaf in bt.LEAF_SIZES:
        tree = bt.MerkleTree(KEY, b"", leaf)
        assert tree.num_leaves == 1
        assert tree.leaf(0) == bytes(leaf)
        assert tree.root == bt.keyed_tree_root(KEY, bytes(leaf), leaf)
    assert bt.keyed_tree_root(KEY, b"", 1024) == blake3.blake3(bytes(1024), key=KEY).digest()


def test_bad_key_and_leaf_size_are_rejected():
    with pytest.raises(ValueError, match="leaf_size must be one of"):
        bt.keyed_tree_root(KEY, b"x", 64)
    with pytest.raises(ValueError, match="key must be 32 bytes"):
        bt.MerkleTree(b"short", b"x", 1024)
    with pytest.raises(TypeError, match="data must be bytes"):
        bt.keyed_tree_root(KEY, "text", 1024)


# --- openings -------------------------------------------------------------------------------------

def _open(tree, indices):
    return [tree.leaf(i) for i in indices], tree.siblings(indices)


def test_four_leaf_sibling_counts():
    tree = bt.MerkleTree(PEARL_TEST_KEY, bytes(i % 256 for i in range(4096)), 1024)
    assert len(tree.siblings([0, 1])) == 1
    assert len(tree.siblings([0, 2])) == 2
    assert len(tree.siblings([0, 1, 2, 3])) == 0
    for indices in ([0, 1], [0, 2], [0, 1, 2, 3], [3]):
        leaves, siblings = _open(tree, indices)
        assert bt.verify_opening(PEARL_TEST_KEY, 1024, 4, indices, leaves, siblings, tree.root)


def test_sibling_order_is_pearls_level_walk():
    """8 leaves, opening {1, 4}: level 0 gives 0 (left of 1) then 5 (right of 4);
    level 1 (nodes 0, 2) gives 1 then 3; level 2 (nodes 0, 1) needs nothing."""
    data = os.urandom(8 * 128)
    chunks = [data[i * 128:(i + 1) * 128] for i in range(8)]
    kw = list(struct.unpack("<8I", KEY))

    def leaf_cv(i):
        return _ref_chunk_cv(KEY, chunks[i], i, False)

    def parent_cv(i):
        block = struct.pack("<16I", *(leaf_cv(2 * i) + leaf_cv(2 * i + 1)))
        return _ref_compress(kw, block, 0, 64, bt.KEYED_HASH | bt.PARENT)[:8]

    expected = [leaf_cv(0), leaf_cv(5), parent_cv(1), parent_cv(3)]
    tree = bt.MerkleTree(KEY, data, 128)
    assert tree.siblings([1, 4]) == [_ref_words_to_bytes(cv) for cv in expected]


def test_random_openings_verify_and_any_flipped_bit_fails():
    rng = random.Random(3)
    for leaf in bt.LEAF_SIZES:
        total = rng.randrange(2, 40)
        data = rng.randbytes(total * leaf - rng.randrange(leaf))
        tree = bt.MerkleTree(KEY, data, leaf)
        indices = sorted(rng.sample(range(total), rng.randrange(1, min(total, 6) + 1)))
        leaves, siblings = _open(tree, indices)
        assert bt.verify_opening(KEY, leaf, total, indices, leaves, siblings, tree.root)
        for _ in range(4):
            n = rng.randrange(len(leaves))
            bit = rng.randrange(leaf * 8)
            bad = list(leaves)
            bad[n] = _flip(bad[n], bit)
            assert not bt.verify_opening(KEY, leaf, total, indices, bad, siblings, tree.root)
        for n in range(len(siblings)):
            bad = list(siblings)
            bad[n] = _flip(bad[n], rng.randrange(256))
            assert not bt.verify_opening(KEY, leaf, total, indices, leaves, bad, tree.root)
        for n in range(len(indices)):
            for bit in range(total.bit_length() + 1):
                bad = list(indices)
                bad[n] ^= 1 << bit
                assert not bt.verify_opening(KEY, leaf, total, bad, leaves, siblings, tree.root)
        assert not bt.verify_opening(KEY, leaf, total, indices, leaves, siblings,
                                     _flip(tree.root, rng.randrange(256)))


def _flip(value: bytes, bit: int) -> bytes:
    out = bytearray(value)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


def test_single_leaf_opening():
    tree = bt.MerkleTree(KEY, b"abc", 256)
    assert tree.siblings([0]) == []
    assert bt.verify_opening(KEY, 256, 1, [0], [tree.leaf(0)], [], tree.root)
    assert not bt.verify_opening(KEY, 256, 1, [0], [_flip(tree.leaf(0), 3)], [], tree.root)


def test_malformed_openings_are_rejected():
    total = 9
    tree = bt.MerkleTree(KEY, os.urandom(total * 512), 512)
    indices = [2, 5, 8]
    leaves, siblings = _open(tree, indices)
    root = tree.root
    assert bt.verify_opening(KEY, 512, total, indices, leaves, siblings, root)
    swapped = [leaves[1], leaves[0], leaves[2]]
    assert not bt.verify_opening(KEY, 512, total, [5, 2, 8], swapped, siblings, root)
    assert not bt.verify_opening(KEY, 512, total, [2, 2, 8], leaves, siblings, root)
    assert not bt.verify_opening(KEY, 512, total, [2, 5, 9], leaves, siblings, root)
    assert not bt.verify_opening(KEY, 512, total, [-1, 5, 8], leaves, siblings, root)
    assert not bt.verify_opening(KEY, 512, total, [], [], siblings, root)
    assert not bt.verify_opening(KEY, 512, total, indices, leaves[:2], siblings, root)
    assert not bt.verify_opening(KEY, 512, total, indices, [leaves[0][:-1]] + leaves[1:], siblings, root)
    assert not bt.verify_opening(KEY, 512, total, indices, leaves, siblings[:-1], root)
    assert not bt.verify_opening(KEY, 512, total, indices, leaves, siblings + [siblings[0]], root)
    assert not bt.verify_opening(KEY, 512, total, indices, leaves, [s[:31] for s in siblings], root)
    assert not bt.verify_opening(KEY, 512, total + 1, indices, leaves, siblings, root)
    assert not bt.verify_opening(KEY, 512, 0, indices, leaves, siblings, root)
    assert not bt.verify_opening(KEY, 512, 1 << 64, indices, leaves, siblings, root)
    with pytest.raises(ValueError, match="strictly ascending"):
        tree.siblings([5, 2])
    with pytest.raises(ValueError, match=r"\[0, 9\)"):
        tree.siblings([9])
    with pytest.raises(IndexError, match="out of range"):
        tree.leaf(9)


# --- rows to leaves -------------------------------------------------------------------------------

def test_leaves_for_rows_matches_brute_force():
    rng = random.Random(4)
    for _ in range(50):
        leaf = rng.choice(bt.LEAF_SIZES)
        row_bytes = rng.randrange(1, 3000)
        rows = rng.sample(range(40), rng.randrange(1, 6))
        expected = sorted({b // leaf for r in rows for b in range(r * row_bytes, (r + 1) * row_bytes)})
        assert bt.leaves_for_rows(rows, row_bytes, leaf) == expected


def test_leaves_for_rows_examples_and_errors():
    assert bt.leaves_for_rows([0], 1024, 1024) == [0]
    assert bt.leaves_for_rows([1, 0], 1000, 1024) == [0, 1]
    assert bt.leaves_for_rows([3], 2048, 1024) == [6, 7]
    with pytest.raises(ValueError, match="row_bytes"):
        bt.leaves_for_rows([0], 0, 1024)
    with pytest.raises(ValueError, match="non-negative"):
        bt.leaves_for_rows([-1], 8, 1024)


def test_opened_leaves_match_pearls_compiled_schedule_examples():
    """The cases Pearl's `BlakeProgram::compile` decides (docs/protocol-fp8.md, "Opened leaves"):
    whole rows, rows shorter than a leaf, rows across a leaf boundary, and a routing slice whose
    64-byte blocks Pearl rounds outwards without changing the leaves."""
    assert bt.leaves_for_rows([4, 5, 6, 7], 1024, 1024) == [4, 5, 6, 7]
    assert bt.leaves_for_rows([4, 5, 6, 7], 256, 1024) == [1]  # blk8 scales of k = 1024
    assert bt.leaves_for_rows([3], 264, 1024) == [0, 1]  # blk8 scales of k = 1056: bytes [792, 1056)
    assert bt.leaves_for_span(4 * 100, 4 * 300, 256) == [1, 2, 3, 4]
    assert bt.leaves_for_span(384, 1216, 256) == bt.leaves_for_span(400, 1200, 256)  # Pearl's blocks 6..18
    with pytest.raises(ValueError, match="start < end"):
        bt.leaves_for_span(64, 64, 256)
    with pytest.raises(ValueError, match="leaf_size must be one of"):
        bt.leaves_for_rows([], 1024, 1000)  # the leaf size is checked even with no rows


def test_every_byte_of_leaves_and_siblings_is_bound():
    """One flipped bit (random within the byte) at every byte position of each opened leaf and
    sibling of a 13-leaf, 128-byte-leaf tree makes the opening fail."""
    rng = random.Random(11)
    tree = bt.MerkleTree(KEY, rng.randbytes(13 * 128), 128)
    indices = [2, 7]
    leaves, siblings = _open(tree, indices)
    assert len(siblings) == 5
    for n in range(len(leaves)):
        for byte in range(128):
            bad = list(leaves)
            bad[n] = _flip(bad[n], 8 * byte + rng.randrange(8))
            assert not bt.verify_opening(KEY, 128, 13, indices, bad, siblings, tree.root)
    for n in range(len(siblings)):
        for byte in range(32):
            bad = list(siblings)
            bad[n] = _flip(bad[n], 8 * byte + rng.randrange(8))
            assert not bt.verify_opening(KEY, 128, 13, indices, leaves, bad, tree.root)
