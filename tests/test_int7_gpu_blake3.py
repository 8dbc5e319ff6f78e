"""kernels.int7.blake3 (device keyed BLAKE3) against the blake3 package and proof.blake3tree.

Runs the Triton kernels compiled on a GPU machine and in Triton's interpreter elsewhere.
"""
import blake3
import numpy as np
import pytest
import torch

from kernels.int7 import blake3 as device_blake3
from kernels.int7.blake3 import Blake3Error, bytes_from_words, keyed_trees, level_counts, words_from_bytes
from proof.blake3tree import MerkleTree

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KEY = b"0123456789abcdef0123456789abcdef"


def _keys(*keys: bytes) -> torch.Tensor:
    return torch.stack([words_from_bytes(k, DEVICE) for k in keys])


@pytest.mark.parametrize("nbytes", [16, 3 * 1024, 7 * 1024 + 4])
def test_roots_equal_keyed_blake3_per_instance(nbytes):
    rng = np.random.default_rng(nbytes)
    keys = [rng.bytes(32) for _ in range(3)]
    data = torch.from_numpy(rng.integers(-128, 128, (3, nbytes), dtype=np.int8)).to(DEVICE)
    trees = keyed_trees(_keys(*keys), data)
    for i, key in enumerate(keys):
        raw = data[i].cpu().numpy().tobytes()
        expected = blake3.blake3(raw + bytes(-len(raw) % 1024), key=key).digest()
        assert bytes_from_words(trees.roots[i]) == expected
    assert [level.shape[1] for level in trees.levels] == level_counts(nbytes)


def test_kept_levels_give_pearl_siblings():
    rng = np.random.default_rng(7)
    data = rng.integers(-128, 128, 11 * 1024 - 256, dtype=np.int8)
    trees = keyed_trees(_keys(KEY), torch.from_numpy(data).view(1, -1).to(DEVICE))
    reference = MerkleTree(KEY, data.tobytes(), 1024)
    assert trees.num_leaves == reference.num_leaves == 11
    from proof.blake3tree import _sibling_positions
    for opening in ([0], [3, 4], [10], [1, 2, 9]):
        siblings = [bytes_from_words(trees.levels[level][0, i]) for level, i in
                    _sibling_positions(opening, 11)]
        assert siblings == reference.siblings(opening)


def test_level_by_level_path_equals_one_program_path(monkeypatch):
    """Large trees build one level per launch, small ones all levels in one program: same tree."""
    rng = np.random.default_rng(9)
    data = torch.from_numpy(rng.integers(-128, 128, (2, 5 * 1024 + 8), dtype=np.int8)).to(DEVICE)
    keys = _keys(KEY, rng.bytes(32))
    small = keyed_trees(keys, data)
    monkeypatch.setattr(device_blake3, "_ONE_PROGRAM_CHUNKS", 1)
    large = keyed_trees(keys, data)
    assert torch.equal(small.roots, large.roots)
    assert all(torch.equal(a, b) for a, b in zip(small.levels, large.levels, strict=True))


def test_bad_inputs_are_named():
    with pytest.raises(Blake3Error, match="data must be"):
        keyed_trees(_keys(KEY), torch.zeros(8, dtype=torch.int8, device=DEVICE))
    with pytest.raises(Blake3Error, match="keys has 2 rows"):
        keyed_trees(_keys(KEY, KEY), torch.zeros((3, 64), dtype=torch.int8, device=DEVICE))
    with pytest.raises(Blake3Error, match="multiple of 4"):
        words_from_bytes(b"abc")
