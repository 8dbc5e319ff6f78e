"""kernels.fp8mine stages on the CPU backend, bit-exact against proof.fp8 (small shapes)."""
import dataclasses

import numpy as np
import pytest
import torch

from kernels.fp8mine import lottery as dev_lottery
from kernels.fp8mine import noise as dev_noise
from kernels.fp8mine import prequant as dev_prequant
from kernels.fp8mine import quant as dev_quant
from kernels.fp8mine import routing as dev_routing
from kernels.fp8mine import transcript as dev_transcript
from kernels.fp8mine.hashing import as_bytes, constant_bytes, hash_short
from kernels.fp8mine.matmul import MatmulError, grouped_matmul, matmul
from kernels.fp8mine.numerics import bf16_fma, from_bits16
from kernels.stream_counters import stream_counters
from proof.fp8 import bf16 as ref_bf16
from proof.fp8 import lottery as ref_lottery
from proof.fp8 import noise as ref_noise
from proof.fp8 import prequant as ref_prequant
from proof.fp8 import quantization as ref_quant
from proof.fp8 import transcript as ref_transcript
from proof.fp8.miner import routing_from_topk
from proof.fp8.mma import fp8_matmul
from proof.fp8.params import TILE_4X64
from test_fp8_numerics_prequant import xorshift_row

PARENT = bytes(range(32))


def words(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.int32).view(1, -1).clone()


def digest(t: torch.Tensor) -> bytes:
    return bytes(as_bytes(t)[0].tolist())


def u16(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


def bf16_tensor(bits: np.ndarray) -> torch.Tensor:
    return from_bits16(torch.from_numpy(np.asarray(bits, dtype=np.int64)))


def same_bf16(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal bit patterns, with any NaN equal to any NaN (torch does not keep NaN payloads)."""
    nan_got, nan_want = ref_bf16.bf16_is_nan(got), ref_bf16.bf16_is_nan(want)
    return bool(np.array_equal(nan_got, nan_want) and np.array_equal(got[~nan_got], want[~nan_want]))


def same_e4m3(got: np.ndarray, want: np.ndarray) -> bool:
    nan_got, nan_want = (got & 0x7F) == 0x7F, (want & 0x7F) == 0x7F
    return bool(np.array_equal(nan_got, nan_want) and np.array_equal(got[~nan_got], want[~nan_want]))


# ----------------------------------------------------------------------------------------- numerics

EDGE_BF16 = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x0080, 0x3F80, 0xBF80, 0x7F7F, 0xFF7F,
                      0x7F80, 0xFF80, 0x7FC0, 0x40B5, 0x38B5, 0x2F80, 0x43E0, 0x3F81, 0x0100, 0x4B00],
                     dtype=np.uint16)


def test_bf16_fma_matches_reference_on_edges_and_random():
    rng = np.random.default_rng(0)
    grid = np.array(np.meshgrid(EDGE_BF16, EDGE_BF16, EDGE_BF16)).reshape(3, -1)
    random = rng.integers(0, 0x10000, (3, 200_000)).astype(np.uint16)
    near = (0x3F00 + rng.integers(0, 0x200, (3, 50_000))).astype(np.uint16)  # heavy cancellation
    near[2] ^= 0x8000
    for a, b, c in (grid, random, near):
        got = u16(bf16_fma(bf16_tensor(a), bf16_tensor(b), bf16_tensor(c)))
        assert same_bf16(got, ref_bf16.bf16_fma(a, b, c))


# ----------------------------------------------------------------------------------------- prequant

def test_prequantize_and_norms_match_reference():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((16, 256)) * np.exp2(rng.integers(-40, 40, (16, 1)))).astype(np.float32)
    x[0, :8] = 0
    x[1, :8] = [0.5, -0.5, 1.5, 2.5, -2.5, 127.0, 3.5, 1.0]  # RNE ties of q
    for source in (torch.from_numpy(x), torch.from_numpy(x).to(torch.bfloat16)):
        codes, scales, values = dev_prequant.prequantize_and_open(source)
        want_codes, want_scales = ref_prequant.prequantize(source.float().numpy())
        assert np.array_equal(codes.numpy(), want_codes) and np.array_equal(u16(scales), want_scales)
        assert np.array_equal(u16(values), ref_prequant.open_values(want_codes, want_scales))


@pytest.mark.parametrize("rows, k", [(40, 256), (3, 6144), (2, 7168), (2, 16), (131, 64)])
def test_prepare_rows_matches_reference(rows, k):
    """The fused row kernel (planes, norms, α/β in one launch, no opened values: the codes launch
    opens X from the planes; 32 programs walk up to 2 rows at decode, beyond 64 rows a program per
    2 rows with a partial last one; rows in steps of 256 blocks: k = 6144 is three whole steps and
    a dead fourth in the terms tile, k = 7168 ends in a half step, k ≤ 2048 is one partial step)
    against the reference."""
    rng = np.random.default_rng(k + rows)
    x = (rng.standard_normal((rows, k)) * np.exp2(rng.integers(-30, 30, (rows, 1)))).astype(np.float32)
    x[0] = 0  # an all-zero row: l2 = 0
    x[-1, :8] = [0.5, -0.5, 1.5, 2.5, -2.5, 127.0, 3.5, 1.0]
    source = torch.from_numpy(x).to(torch.bfloat16)
    got = dev_quant.prepare_rows(source)
    codes, scales = ref_prequant.prequantize(source.float().numpy())
    l2, linf = ref_prequant.row_norms(codes, scales)
    assert np.array_equal(got.codes.numpy(), codes) and np.array_equal(u16(got.scales), scales)
    assert got.values is None
    assert np.array_equal(u16(got.l2), l2) and np.array_equal(u16(got.linf), linf)
    want = [ref_quant.row_scales("hopper", int(a), int(b)) for a, b in zip(l2, linf)]
    assert same_bf16(u16(got.alpha), np.array([w[0] for w in want], dtype=np.uint16))
    assert same_bf16(u16(got.beta), np.array([w[1] for w in want], dtype=np.uint16))


def test_row_programs_grow_with_the_rows():
    """≤ 32 programs of decode's 8 warps at decode; beyond 64 rows one per 2 rows on 4 warps
    (prefill's 8192 rows: 4096, not the 32 programs of 256 rows each that made the prefill A side
    2.6× its stages)."""
    from kernels.fp8mine.prequant_kernel import row_programs, row_warps
    assert [row_programs(r) for r in (1, 16, 32, 64)] == [1, 16, 32, 32]
    assert row_programs(65) == 33 and row_programs(8192) == 4096
    assert [row_warps(r) for r in (1, 64, 65, 8192)] == [8, 8, 4, 4]


@pytest.mark.parametrize("k, shape", [(16, None), (1024, None), (64, (16, 4)), (1024, (4, 32))])
def test_row_norms_match_reference_on_random_planes(k, shape, monkeypatch):
    """Default block shape (one row, one step) and multi-row, multi-step programs."""
    from kernels.fp8mine import norms_kernel
    if shape is not None:
        monkeypatch.setattr(norms_kernel, "block_shape", lambda nblocks: shape)
    rng = np.random.default_rng(k)
    q = rng.integers(-127, 128, (32, k)).astype(np.int8)
    q[rng.random(q.shape) < 0.4] = 0
    q[5] = 0
    scales = (rng.integers(0, 0x7000, (32, 1)) + rng.integers(0, 0x800, (32, k // 8))).clip(0, 0x7700)
    scales[:8] = rng.integers(0, 0x200, (8, k // 8))  # subnormal and tiny scales
    scales = scales.astype(np.uint16)
    l2, linf = dev_prequant.row_norms(torch.from_numpy(q), bf16_tensor(scales))
    want_l2, want_linf = ref_prequant.row_norms(q, scales)
    assert np.array_equal(u16(l2), want_l2) and np.array_equal(u16(linf), want_linf)


@pytest.mark.parametrize("seed,k,expected", [(877130, 1024, 0x4224), (110113, 2048, 0x422C)])
def test_l2_pins(seed, k, expected):
    ints, scales = xorshift_row(seed, k)
    l2, _ = dev_prequant.row_norms(torch.from_numpy(np.asarray(ints, dtype=np.int8).reshape(1, -1)),
                                   bf16_tensor(np.asarray(scales, dtype=np.uint16).reshape(1, -1)))
    assert int(u16(l2)[0]) == expected


def test_prequant_rejects_bad_shapes():
    with pytest.raises(dev_prequant.PrequantError, match="multiple of 8"):
        dev_prequant.prequantize_and_open(torch.zeros(2, 12))
    with pytest.raises(dev_prequant.PrequantError, match="scales"):
        dev_prequant.row_norms(torch.zeros(2, 16, dtype=torch.int8), torch.zeros(2, 3, dtype=torch.bfloat16))


# --------------------------------------------------------------------------------------- transcript

def test_label_subkeys_match_spec_pins():
    assert ref_transcript.jackpot_key(PARENT).hex() == \
        "1abccbdca824c1fa9707f6456144fcd48a2567a143ac8dc85c7b6ff11f3dc28f"  # launch_keys' test below
    assert digest(dev_transcript.noise_key(words(PARENT))).hex() == \
        "3f5176a01068c0b9e3c364a8670767a1b909dc5e2762ff99110edbcfe424c198"
    seed_a_key = words(ref_transcript.subkey("seed-A"))
    assert digest(hash_short(seed_a_key, constant_bytes(bytes(range(64)), "cpu"))).hex() == \
        "8cd0fb004b120832471a26ce8958f469c55cb19684b6dee0687bbc6dbf890bbb"


def test_short_hash_lengths_match_blake3():
    import blake3
    rng = np.random.default_rng(2)
    for n in (1, 23, 64, 65, 107, 128, 173):
        msg = rng.integers(0, 256, (3, n)).astype(np.uint8)
        got = as_bytes(hash_short(words(PARENT), torch.from_numpy(msg)))
        for row in range(3):
            assert bytes(got[row].tolist()) == blake3.blake3(msg[row].tobytes(), key=PARENT).digest()


def test_keys_and_seeds_match_reference():
    rng = np.random.default_rng(3)
    header76, header108 = rng.bytes(76), rng.bytes(108)
    ha, hr, ho, sb, p_a, p_b = rng.bytes(32), rng.bytes(32), rng.bytes(32), rng.bytes(32), rng.bytes(13), rng.bytes(21)
    key_a = dev_transcript.key_a(constant_bytes(header76, "cpu"))
    key_b = dev_transcript.key_b(constant_bytes(header108, "cpu"))
    assert digest(key_a) == ref_transcript.key_a(header76)
    assert digest(key_b) == ref_transcript.key_b(header108)
    assert digest(dev_transcript.seed_b(words(ha), key_b, p_b)) == \
        ref_transcript.seed_b(ha, ref_transcript.key_b(header108), p_b)
    root_codes, root_scales = rng.bytes(32), rng.bytes(32)
    for routing in (None, (hr, ho)):
        p = p_a[:11] if routing is None else p_a
        message = dev_transcript.seed_a_message(words(sb), key_a, p, routing is not None)
        assert digest(dev_transcript.key_a_of(message)) == ref_transcript.key_a(header76)
        for _ in range(2):  # a second launch overwrites the head it wrote in the first
            keys = dev_transcript.launch_keys(message, len(p), (words(root_codes), words(root_scales)),
                                              tuple(map(words, routing)) if routing else None)
        hash_a = ref_transcript.operand_digest(root_codes, root_scales, ref_transcript.key_a(header76))
        seed = ref_transcript.seed_a(hash_a, sb, ref_transcript.key_a(header76), p, routing)
        assert [digest(keys[i:i + 1]) for i in range(4)] == [
            hash_a, seed, ref_transcript.noise_line_key(seed), ref_transcript.jackpot_key(seed)]
        # E_A drawn in the keys' launch (more lines than one 64-lane step, and fewer) and, past
        # two steps, by a launch of its own
        for lines in ((70, 129) if routing else (3,)):
            fused, e_a = dev_transcript.launch_keys_and_noise(
                message, len(p), (words(root_codes), words(root_scales)),
                tuple(map(words, routing)) if routing else None, lines)
            assert torch.equal(fused, keys)
            assert np.array_equal(e_a.view(torch.uint8).numpy(),
                                  ref_noise.noise_lines(seed, "A", "E", np.arange(lines)))
    with pytest.raises(ValueError, match="seedA message"):
        dev_transcript.launch_keys(message, 13, (words(root_codes), words(root_scales)), None)


def test_offsets_root_pin():
    """One tree (the interpreter runs a tree program in seconds); operand digests of real planes
    are covered by the end-to-end tests, whose proofs only verify if HA and HB are right."""
    offsets = torch.tensor([3, 7, 9], dtype=torch.int32)
    assert digest(dev_transcript.tree_root(words(PARENT), offsets)).hex() == \
        "53aa5cb0b531c648f26f806b927438ad8790b843cbb07a4f367f73d91d0129dd"
    with pytest.raises(ValueError, match="1024-byte leaves"):
        dev_transcript.check_hash_id(0)


def test_plane_roots_match_the_reference_tree():
    """The launch's trees in one shared launch (a program per 128-chunk group of a tree) against
    proof.blake3tree: one-chunk trees (ROOT on the chunk), ragged and odd leaf counts, mixed
    dtypes, and the pinned offsets root in any slot."""
    from proof.blake3tree import keyed_tree_root
    rng = np.random.default_rng(21)
    key = rng.bytes(32)
    planes = [torch.from_numpy(rng.integers(-128, 128, (5, 1024), dtype=np.int8)),  # 5 leaves
              torch.from_numpy(rng.integers(-2**15, 2**15, (12, 160), dtype=np.int16)).view(torch.bfloat16),
              torch.from_numpy(rng.integers(0, 64, 513, dtype=np.int32)),  # 2 leaves, the last ragged
              torch.tensor([3, 7, 9], dtype=torch.int32)]
    for plane, root in zip(planes, dev_transcript.plane_roots(words(key), planes)):
        assert root.shape == (1, 8)
        assert digest(root) == keyed_tree_root(key, plane.contiguous().view(torch.uint8).numpy().tobytes(), 1024)
    assert digest(dev_transcript.plane_roots(words(PARENT), planes[3:])[0]).hex() == \
        "53aa5cb0b531c648f26f806b927438ad8790b843cbb07a4f367f73d91d0129dd"
    with pytest.raises(ValueError, match="1..4 planes"):
        dev_transcript.plane_roots(words(key), planes + planes[:1])


def test_plane_roots_of_many_groups(monkeypatch):
    """Trees of several lane groups (4-lane programs here, 128 on the device; full and partial
    last groups, a ragged last chunk): the last program of a block of groups folds their nodes
    (the root when the tree is one block); with more groups than lanes the last block of the tree
    folds the block nodes to the root. Every completion counter (one a tree, one a block) is back
    at zero for the next launch (a graph replay)."""
    from proof.blake3tree import keyed_tree_root
    monkeypatch.setattr(dev_transcript, "_FOREST_LANES", 4)
    monkeypatch.setattr(dev_transcript, "_FOREST_LEVELS", 2)
    leaves = (10, 5, 1)
    rng = np.random.default_rng(8)
    key = rng.bytes(32)
    planes = [torch.from_numpy(rng.integers(-128, 128, (n, 1024 - 4 * (i == 1)), dtype=np.int8)).view(-1)
              for i, n in enumerate(leaves)]
    for plane, root in zip(planes, dev_transcript.plane_roots(words(key), planes)):
        assert digest(root) == keyed_tree_root(key, plane.numpy().tobytes(), 1024)
    # 4 trees' counters, then a block's for the 10- and 5-leaf trees (3 and 2 groups: one block each)
    assert not stream_counters(torch.device("cpu"), 4 + 2).any()
    # more groups than lanes (prefill planes), here with 2-lane programs: blocks of 2 group nodes
    # first, then the block nodes (5 leaves: 3 groups, a full block and a block of one); 9 leaves
    # are past 2³ chunks and go through int7's trees
    monkeypatch.setattr(dev_transcript, "_FOREST_LANES", 2)
    monkeypatch.setattr(dev_transcript, "_FOREST_LEVELS", 1)
    many = [torch.from_numpy(rng.integers(-128, 128, (n, 1024), dtype=np.int8)).view(-1) for n in (5, 9)]
    for plane, root in zip(many, dev_transcript.plane_roots(words(key), many)):
        assert digest(root) == keyed_tree_root(key, plane.numpy().tobytes(), 1024)
    assert not stream_counters(torch.device("cpu"), 4 + 2).any()  # the 5-leaf tree's two blocks
    with pytest.raises(ValueError, match="multiple of 4 bytes"):
        dev_transcript.plane_roots(words(key), [torch.zeros(3, dtype=torch.int8)])


# -------------------------------------------------------------------------------------------- noise

def test_noise_line_pins():
    e_a = dev_noise.noise_lines(dev_transcript.noise_key(words(b"\x22" * 32)), "A", "E", torch.arange(8))
    f_a = dev_noise.noise_lines(dev_transcript.noise_key(words(b"\x11" * 32)), "A", "F", torch.arange(1))
    assert bytes(e_a[7].view(torch.uint8).tolist()).hex() == \
        "be3adfead867e55be469dd50e9e85c50dfdc64e2dfe4eae2e8d6596a6746dd65"
    assert bytes(f_a[0].view(torch.uint8).tolist()).hex() == \
        "c65268603369d96362e16a5f6ae6615fe6db43eae463e2d3eae55ae3bb5f54e3"


@pytest.mark.parametrize("side,factor", [("A", "E"), ("A", "F"), ("B", "E"), ("B", "F")])
def test_noise_lines_match_reference(side, factor):
    seed = bytes(range(7, 39))
    lines = np.array([0, 1, 65535, 65536, 1 << 31, (1 << 32) - 1] + list(range(100, 140)))
    got = dev_noise.noise_lines(dev_transcript.noise_key(words(seed)), side, factor, torch.from_numpy(lines))
    assert np.array_equal(got.view(torch.uint8).numpy(), ref_noise.noise_lines(seed, side, factor, lines))


def test_noise_rejects_bad_side():
    with pytest.raises(dev_noise.NoiseError, match="side"):
        dev_noise.noise_lines(words(PARENT), "C", "E", torch.arange(2))


# ----------------------------------------------------------------------------------------- quantize

def test_row_scales_match_reference():
    rng = np.random.default_rng(5)
    l2 = np.concatenate([EDGE_BF16, rng.integers(0, 0x7F00, 2000)]).astype(np.uint16)
    linf = np.concatenate([EDGE_BF16[::-1], rng.integers(0, 0x7F00, 2000)]).astype(np.uint16)
    alpha, beta = dev_quant.row_scales(bf16_tensor(l2), bf16_tensor(linf))
    want = [ref_quant.row_scales("hopper", int(a), int(b)) for a, b in zip(l2, linf)]
    assert same_bf16(u16(alpha), np.array([w[0] for w in want], dtype=np.uint16))
    assert same_bf16(u16(beta), np.array([w[1] for w in want], dtype=np.uint16))


def test_noisy_codes_cover_every_e4m3_code_and_match_reference():
    """The elementwise rule on every BF16 input X: with α = 1, β = 0 every e4m3 code (and NaN)
    comes out; with drawn α, β and noise the codes still match the reference."""
    rng = np.random.default_rng(6)
    x = np.arange(0x10000, dtype=np.uint16).reshape(64, 1024)
    noise_f32 = rng.standard_normal((64, 1024)).astype(np.float32) * 3000
    noise_f32[0, :5] = [np.nan, np.inf, -np.inf, 0.0, -0.0]
    noise32, noise = torch.from_numpy(noise_f32), ref_bf16.f32_to_bf16(noise_f32)
    unit = (np.full(64, 0x3F80, dtype=np.uint16), np.zeros(64, dtype=np.uint16))
    drawn = (rng.choice([0x3F80, 0x4000, 0x3E00, 0x4315, 0x0001, 0x7F00], 64).astype(np.uint16),
             rng.choice([0x0000, 0x3B95, 0x3000, 0x8001, 0x6000], 64).astype(np.uint16))
    for alpha, beta in (unit, drawn):
        got = dev_quant.noisy_codes(bf16_tensor(alpha), bf16_tensor(beta), bf16_tensor(x), noise32)
        got = got.view(torch.uint8).numpy()
        assert same_e4m3(got, ref_quant._noisy_codes(alpha[:, None], beta[:, None], x, noise))
        if alpha is unit[0]:
            seen = set(np.unique(got).tolist())
            assert seen >= set(range(256)) - {0x7F, 0xFF} and seen & {0x7F, 0xFF}


def test_noisy_quantize_matches_reference():
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((8, 256)) * np.exp2(rng.integers(-8, 8, (8, 1)))).astype(np.float32)
    codes, scales = ref_prequant.prequantize(x)
    values = ref_prequant.open_values(codes, scales)
    l2, linf = ref_prequant.row_norms(codes, scales)
    e = ref_noise.noise_lines(b"\x05" * 32, "A", "E", np.arange(8))
    f = ref_noise.noise_lines(b"\x06" * 32, "A", "F", np.arange(256))
    got, noise = dev_quant.noisy_quantize(bf16_tensor(values), bf16_tensor(l2), bf16_tensor(linf),
                                          torch.from_numpy(e).view(torch.float8_e4m3fn),
                                          torch.from_numpy(f).view(torch.float8_e4m3fn))
    assert np.array_equal(noise.numpy().view(np.uint32), fp8_matmul("hopper", e, f).view(np.uint32))
    want = ref_quant.noisy_quantize("hopper", values, l2, linf, e, f)
    assert np.array_equal(got.codes.view(torch.uint8).numpy(), want.codes)
    assert np.array_equal(u16(got.alpha), want.alpha) and np.array_equal(u16(got.beta), want.beta)
    with pytest.raises(dev_quant.QuantError):
        dev_quant.noisy_quantize(bf16_tensor(values), bf16_tensor(l2), bf16_tensor(linf),
                                 torch.from_numpy(e[:4]).view(torch.float8_e4m3fn),
                                 torch.from_numpy(f).view(torch.float8_e4m3fn))


_SMALL_CODES = np.array([0x00, 0x38, 0x40, 0x44, 0xB8, 0xC0, 0xC4, 0x48], dtype=np.uint8)  # 0, ±1, ±2, ±3, 4


def _noisy_case(seed: int, rows: int, k: int, spread: int):
    """Rows of magnitudes 2^±spread, their pre-quantization as device Rows, small-integer E and F
    lines (the interpreter's dot is then exact) and the reference noisy quantization."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, k)) * np.exp2(rng.integers(-spread, spread, (rows, 1)))).astype(np.float32)
    codes, scales = ref_prequant.prequantize(x)
    values = ref_prequant.open_values(codes, scales)
    l2, linf = ref_prequant.row_norms(codes, scales)
    e, f = rng.choice(_SMALL_CODES, (rows, 32)), rng.choice(_SMALL_CODES, (k, 32))
    want = ref_quant.noisy_quantize("hopper", values, l2, linf, e, f)
    rows_in = dev_quant.Rows(torch.from_numpy(codes), bf16_tensor(scales), bf16_tensor(values), bf16_tensor(l2),
                             bf16_tensor(linf), bf16_tensor(want.alpha), bf16_tensor(want.beta))
    lines = (torch.from_numpy(e).view(torch.float8_e4m3fn), torch.from_numpy(f).view(torch.float8_e4m3fn))
    return rng, rows_in, lines, want


def test_noisy_codes_forming_the_noise_dot_in_the_launch():
    """The A side's codes launch forms N = E·Fᵀ itself (one K = 32 e4m3 dot per tile; 64 × 128
    tiles, ragged rows and columns). The interpreter's dot is exact where the model's 14-bit
    window is (small-integer lines: |Σ| < 2^11), so this checks the tile's data flow; the
    device's rounding of larger sums is the GEMM's, checked on the H200. noisy_side (the CPU
    path through the model's N) gives the same codes as noisy_quantize."""
    from kernels.fp8mine import noisy_kernel
    _, rows_in, lines, want = _noisy_case(9, 70, 160, 8)
    side = dev_quant.noisy_side(rows_in, *lines)
    assert side.positions is None and np.array_equal(side.codes.view(torch.uint8).numpy(), want.codes)
    got = noisy_kernel.noisy_codes_of_lines(rows_in.alpha, rows_in.beta, rows_in.values, *lines)
    assert np.array_equal(got.view(torch.uint8).numpy(), want.codes)


def test_noisy_codes_opened_from_the_planes_equal_those_from_the_values():
    """`Planes` in place of X: every launch form (N from memory, N formed in the launch; token
    order, expert order, peel tails) opens RNE_bf16(q · s) itself and writes the codes it writes
    from the opened values; rows with scales at the extremes (2^-100's block floor, the largest
    bf16 scales) and zero blocks included. noisy_side on rows without values (as `prepare_rows` gives them)
    gives the side it gives with them; malformed planes are refused."""
    from kernels.fp8mine import noisy_kernel
    from kernels.fp8mine.peel import TAIL_BYTES
    rows, k, top_k, experts = 70, 160, 3, 5
    rng, rows_in, (e_t, f_t), want = _noisy_case(23, rows, k, 60)
    codes, scales = rows_in.codes.clone(), rows_in.scales.view(torch.int16).clone()
    codes[0, :8], scales[0, 0] = 0, 0x0D80  # an all-zero block at the 2^-100 floor's scale
    codes[1, 8:16], scales[1, 1] = 127, 0x7B7F  # the largest codes at a huge scale (127·s still finite)
    codes[2, :8] = torch.tensor([-127, 1, -1, 0, 64, -64, 3, 5], dtype=torch.int8)
    planes = noisy_kernel.Planes(codes, scales.view(torch.bfloat16))
    values = bf16_tensor(ref_prequant.open_values(codes.numpy(), scales.numpy().view(np.uint16)))
    topk = np.stack([rng.permutation(experts)[:top_k] for _ in range(rows)])
    positions = dev_routing.routing_table(torch.from_numpy(topk), experts).positions
    noise = matmul(e_t, f_t)
    for where, tail in ((None, 0), (positions, 0), (positions, TAIL_BYTES), (None, TAIL_BYTES)):
        for form in (lambda x: noisy_kernel.noisy_codes(rows_in.alpha, rows_in.beta, x, noise, where, tail),
                     lambda x: noisy_kernel.noisy_codes_of_lines(rows_in.alpha, rows_in.beta, x, e_t, f_t, where, tail)):
            from_values, from_planes = form(values), form(planes)
            assert from_planes.stride() == from_values.stride()
            assert torch.equal(from_planes.view(torch.uint8), from_values.view(torch.uint8))
    bare = dataclasses.replace(rows_in, values=None)
    for where in (None, positions):
        got, base = dev_quant.noisy_side(bare, e_t, f_t, where), dev_quant.noisy_side(rows_in, e_t, f_t, where)
        assert torch.equal(got.codes.view(torch.uint8), base.codes.view(torch.uint8))
    assert np.array_equal(dev_quant.noisy_side(bare, e_t, f_t).codes.view(torch.uint8).numpy(), want.codes)
    with pytest.raises(ValueError, match="planes must be int8 codes"):
        noisy_kernel.noisy_codes(rows_in.alpha, rows_in.beta, noisy_kernel.Planes(codes, scales.view(torch.bfloat16)[:, 1:]),
                                 noise)


def test_noisy_codes_written_straight_into_expert_order():
    """With a routing table's positions, the codes launch stores each token's row at its top_k
    expert-order rows: the result is the token-order codes gathered through Rflat, for both
    launch forms (the noise dot read from memory, and formed in the launch); the A peel reads
    each token's first copy and equals the peel of the token-order codes."""
    from kernels.fp8mine import noisy_kernel
    from kernels.fp8mine.peel import a_peel
    rows, k, top_k, experts = 70, 160, 3, 5
    rng, rows_in, (e_t, f_t), want = _noisy_case(21, rows, k, 40)
    topk = np.stack([rng.permutation(experts)[:top_k] for _ in range(rows)])
    table = dev_routing.routing_table(torch.from_numpy(topk), experts)
    in_order = want.codes[table.rflat.numpy()]
    args = (rows_in.alpha, rows_in.beta, rows_in.values)
    for got in (noisy_kernel.noisy_codes_of_lines(*args, e_t, f_t, table.positions),
                noisy_kernel.noisy_codes(*args, matmul(e_t, f_t), table.positions)):
        assert got.shape == (rows * top_k, k)
        assert np.array_equal(got.view(torch.uint8).numpy(), in_order)
    side = dev_quant.noisy_side(rows_in, e_t, f_t, table.positions)
    assert side.top_k == top_k and np.array_equal(side.token_codes().view(torch.uint8).numpy(), want.codes)
    plain = dev_quant.noisy_side(rows_in, e_t, f_t)
    f_b = torch.from_numpy(rng.choice(_SMALL_CODES, (k, 32))).view(torch.float8_e4m3fn)
    assert torch.equal(a_peel(side, f_b).view(torch.int16), a_peel(plain, f_b).view(torch.int16))
    with pytest.raises(ValueError, match="positions must be int32"):
        noisy_kernel.noisy_codes_of_lines(*args, e_t, f_t, table.positions[:-1])


def test_codes_written_with_peel_tails():
    """Codes written with a tail (the peel GEMM's operand rows): the same codes, rows k + 128
    bytes apart, for every launch form; the A peel reads them in place; `write_tails` puts each
    token's peel row after each of its expert-order copies (and after dense rows), leaving the
    codes untouched, and gives each codes row's 1/α (RNE, as torch divides), or each Rflat row's
    for a GEMM gathering the token rows; rows without a tail are refused."""
    from kernels.fp8mine import noisy_kernel
    from kernels.fp8mine.peel import TAIL_BYTES, a_peel, has_tail, padded_rows, write_tails
    rows, k, top_k, experts = 70, 160, 3, 5
    rng, rows_in, (e_t, f_t), want = _noisy_case(22, rows, k, 8)
    topk = np.stack([rng.permutation(experts)[:top_k] for _ in range(rows)])
    table = dev_routing.routing_table(torch.from_numpy(topk), experts)
    args = (rows_in.alpha, rows_in.beta, rows_in.values)
    f_b = torch.from_numpy(rng.choice(_SMALL_CODES, (k, 32))).view(torch.float8_e4m3fn)
    for positions, want_codes in ((None, want.codes), (table.positions, want.codes[table.rflat.numpy()])):
        forms = (noisy_kernel.noisy_codes_of_lines(*args, e_t, f_t, positions, TAIL_BYTES),
                 noisy_kernel.noisy_codes(*args, matmul(e_t, f_t), positions, TAIL_BYTES))
        for got in forms:
            assert has_tail(got) and got.stride() == (k + TAIL_BYTES, 1)
            assert np.array_equal(got.view(torch.uint8).numpy(), want_codes)
        side = dev_quant.NoisySide(forms[0], args[0], args[1], e_t, positions)
        plain = dev_quant.NoisySide(torch.from_numpy(want.codes).view(torch.float8_e4m3fn), args[0], args[1], e_t)
        peel = a_peel(side, f_b)
        assert torch.equal(peel.view(torch.int16), a_peel(plain, f_b).view(torch.int16))
        padded, inv = write_tails(side, peel)
        assert padded.shape == (want_codes.shape[0], k + TAIL_BYTES)
        assert np.array_equal(padded[:, :k].numpy(), want_codes)
        token = np.arange(rows) if positions is None else table.rflat.numpy()
        assert torch.equal(padded[:, k:].contiguous().view(torch.bfloat16).view(torch.int16),
                           peel.view(torch.int16)[torch.from_numpy(token).long()])
        assert torch.equal(inv, 1.0 / args[0].float()[torch.from_numpy(token).long()])
        assert padded.data_ptr() == side.codes.data_ptr()  # in place: no copy of the codes
        if positions is None:  # a GEMM gathering these token rows through Rflat: 1/α per Rflat row
            _, gathered_inv = write_tails(side, peel, table)
            assert torch.equal(gathered_inv, 1.0 / args[0].float()[table.rflat.long()])
        else:
            with pytest.raises(ValueError, match="token-order codes"):
                write_tails(side, peel, table)
    assert not has_tail(torch.from_numpy(want.codes).view(torch.float8_e4m3fn))
    with pytest.raises(ValueError, match="carry no peel tail"):
        padded_rows(torch.from_numpy(want.codes).view(torch.float8_e4m3fn))


# ---------------------------------------------------------------------------------- routing, matmul

def test_routing_table_matches_reference_and_tiles():
    rng = np.random.default_rng(8)
    topk = np.stack([rng.permutation(5)[:2] for _ in range(23)])
    table = dev_routing.routing_table(torch.from_numpy(topk), 5)
    tokens, offsets = routing_from_topk(topk, 5)
    assert table.rflat.tolist() == tokens and table.offsets.tolist() == offsets
    tiles = dev_routing.row_tiles(table)
    starts = [0] + offsets[:-1]
    want = [(starts[w] + 4 * t, w, t) for w in range(5) for t in range((offsets[w] - starts[w]) // 4)]
    live = tiles.row_start >= 0
    got = list(zip(tiles.row_start[live].tolist(), tiles.expert[live].tolist(), tiles.local[live].tolist()))
    assert got == want
    gemm_tiles = dev_routing.row_tiles(table, 8, partial=True)  # every row, short tails included
    want = [(starts[w] + 8 * t, w, t) for w in range(5) for t in range(-(-(offsets[w] - starts[w]) // 8))]
    live = gemm_tiles.row_start >= 0
    assert gemm_tiles.row_start.shape[0] == 46 // 8 + 5
    assert list(zip(gemm_tiles.row_start[live].tolist(), gemm_tiles.expert[live].tolist(),
                    gemm_tiles.local[live].tolist())) == want


@pytest.mark.parametrize("small_limit", [4096, 0])  # the one-kernel ranking, torch's sort
def test_routing_table_paths_match_reference(small_limit, monkeypatch):
    monkeypatch.setattr(dev_routing, "SMALL_ROUTING", small_limit)
    rng = np.random.default_rng(12)
    for tokens, top_k, experts in ((64, 8, 32), (37, 3, 5), (300, 2, 256), (16, 1, 1)):
        topk = np.stack([rng.permutation(experts)[:top_k] for _ in range(tokens)])
        table = dev_routing.routing_table(torch.from_numpy(topk).to(torch.int32 if tokens % 2 else torch.int64),
                                          experts)
        rflat, offsets = routing_from_topk(topk, experts)
        assert table.rflat.tolist() == rflat and table.bounds.tolist() == [0] + offsets
        # positions: entry t·top_k + j's row in Rflat (the stable sort's inverse)
        order = np.argsort(topk.reshape(-1), kind="stable")
        assert table.positions.tolist() == np.argsort(order).tolist()
    wild = rng.integers(-3, 9, (40, 4))  # out-of-range ids are clamped (then repeats are possible)
    clipped = np.clip(wild, 0, 5).reshape(-1)
    table = dev_routing.routing_table(torch.from_numpy(wild), 6)
    assert table.rflat.tolist() == (np.argsort(clipped, kind="stable") // 4).tolist()
    assert table.positions.tolist() == np.argsort(np.argsort(clipped, kind="stable")).tolist()
    assert table.bounds.tolist() == [0] + np.cumsum(np.bincount(clipped, minlength=6)).tolist()


def test_grouped_matmul_is_the_model_per_expert():
    rng = np.random.default_rng(9)
    a = rng.integers(0, 256, (10, 64)).astype(np.uint8)
    a[(a & 0x7F) == 0x7F] = 0
    b = rng.integers(0, 256, (2, 16, 64)).astype(np.uint8)
    b[(b & 0x7F) == 0x7F] = 0
    table = dev_routing.RoutingTable(torch.arange(10, dtype=torch.int32), torch.tensor([0, 4, 10], dtype=torch.int32))
    got = grouped_matmul(torch.from_numpy(a).view(torch.float8_e4m3fn),
                         torch.from_numpy(b).view(torch.float8_e4m3fn), table).numpy()
    assert np.array_equal(got[:4].view(np.uint32), fp8_matmul("hopper", a[:4], b[0]).view(np.uint32))
    assert np.array_equal(got[4:].view(np.uint32), fp8_matmul("hopper", a[4:], b[1]).view(np.uint32))
    with pytest.raises(MatmulError, match="multiple of 32"):
        grouped_matmul(torch.zeros(2, 48, dtype=torch.float8_e4m3fn),
                       torch.zeros(1, 2, 48, dtype=torch.float8_e4m3fn), table)
    a_codes, b_codes = torch.from_numpy(a).view(torch.float8_e4m3fn), torch.from_numpy(b).view(torch.float8_e4m3fn)
    with pytest.raises(MatmulError, match="pass fold_into and fold_bounds"):  # a compact store keeps unfolded rows
        grouped_matmul(a_codes, b_codes, table, compact=table)
    with pytest.raises(MatmulError, match="CUDA"):
        grouped_matmul(a_codes, b_codes, table, fold_into=torch.zeros(2, 1, 16, dtype=torch.int32),
                       fold_bounds=table.bounds, compact=table)


def test_gemm_implementation_is_chosen_once_and_can_be_forced(monkeypatch, caplog):
    import importlib.util
    from kernels.fp8mine import matmul
    try:
        matmul.gemm_impl.cache_clear()
        monkeypatch.setenv("PEARL_FP8MINE_GEMM", "triton")
        with caplog.at_level("INFO", logger="kernels.fp8mine.matmul"):
            assert matmul.gemm_impl() == "triton" and matmul.gemm_impl() == "triton"
        assert [r.getMessage() for r in caplog.records] == ["fp8mine GEMM: triton (forced by PEARL_FP8MINE_GEMM)"]
        matmul.gemm_impl.cache_clear()
        monkeypatch.setenv("PEARL_FP8MINE_GEMM", "cublas")
        with pytest.raises(MatmulError, match="PEARL_FP8MINE_GEMM"):
            matmul.gemm_impl()
        matmul.gemm_impl.cache_clear()
        monkeypatch.delenv("PEARL_FP8MINE_GEMM")
        cute = importlib.util.find_spec("cutlass") is not None and importlib.util.find_spec("quack") is not None
        assert matmul.gemm_impl() == ("cute" if cute else "triton")
    finally:
        matmul.gemm_impl.cache_clear()


# ---------------------------------------------------------------------------------------- lottery

def _reference_tickets(acc: np.ndarray, tiles: dev_routing.RowTiles, key: bytes) -> dict:
    out = {}
    for start, expert, local in zip(tiles.row_start.tolist(), tiles.expert.tolist(), tiles.local.tolist()):
        if start < 0:
            continue
        for col in range(acc.shape[1] // 64):
            cell = acc[start:start + 4, 64 * col:64 * col + 64]
            message = ref_lottery.fold_message(cell, TILE_4X64.row_pattern, TILE_4X64.col_pattern)
            out[(expert, local, col)] = ref_lottery.ticket_with_key(key, message)
    return out


def test_lottery_latches_the_planted_winner_and_matches_reference_tickets():
    rng = np.random.default_rng(10)
    topk = np.stack([rng.permutation(3)[:2] for _ in range(22)])
    table = dev_routing.routing_table(torch.from_numpy(topk), 3)
    tiles = dev_routing.row_tiles(table)
    acc = rng.standard_normal((44, 128)).astype(np.float32)
    acc[0, 0], acc[5, 9] = -0.0, np.nan
    key = rng.bytes(32)
    tickets = _reference_tickets(acc, tiles, key)
    (expert, local, col), ticket = min(tickets.items(), key=lambda kv: int.from_bytes(kv[1], "little"))
    latch = dev_lottery.LotteryLatch("cpu", {"codes": ((6,), torch.int32)})
    latch.set_header(22, 192, 1024, 5, 24, 6)
    seed_b = words(rng.bytes(32))
    source = {"codes": torch.arange(6, dtype=torch.int32)}
    thr = int.from_bytes(ticket, "little")
    all_tickets = torch.zeros((tiles.row_start.shape[0], 2, 8), dtype=torch.int32)
    latch.run(torch.from_numpy(acc), tiles, words(key), words(thr.to_bytes(32, "little")), seed_b, source,
              tickets=all_tickets)
    for (w, t, c), want in tickets.items():
        slot = next(i for i, (e, l) in enumerate(zip(tiles.expert.tolist(), tiles.local.tolist())) if (e, l) == (w, t))
        assert bytes(all_tickets[slot, c].view(torch.uint8).tolist()) == want
    assert latch.poll() is None  # not published yet
    latch.publish()
    record = latch.poll()
    assert (record.group_id, record.tile_row, record.tile_column) == (expert, local, col)
    assert record.ticket == ticket and record.threshold == thr and record.pow_key == key
    assert (record.m, record.n, record.k, record.layer_id, record.payload_bytes) == (22, 192, 1024, 5, (24, 6))
    assert latch.payload["codes"].tolist() == list(range(6))
    # the latch holds: a later launch neither overwrites the record nor copies its payload
    latch.run(torch.from_numpy(acc), tiles, words(key), words(bytes([0xFF] * 32)), seed_b,
              {"codes": torch.full((6,), 9, dtype=torch.int32)})
    latch.publish()
    assert latch.poll() == record and latch.payload["codes"].tolist() == list(range(6))
    latch.reset()
    assert latch.poll() is None


def test_lottery_on_folded_lanes_draws_the_reference_tickets():
    """`run_folded` (the lanes the GEMM epilogue folds, tile (row r, c) at [r // 4, c], loaded as
    16 word vectors): the same tickets and planted winner as proof.fp8 on the accumulator;
    entries of no whole tile are never read (filled with garbage here)."""
    rng = np.random.default_rng(12)
    topk = np.stack([rng.permutation(3)[:2] for _ in range(23)])
    table = dev_routing.routing_table(torch.from_numpy(topk), 3)
    tiles = dev_routing.row_tiles(table)
    acc = rng.standard_normal((46, 128)).astype(np.float32)
    key = rng.bytes(32)
    lanes = torch.from_numpy(rng.integers(-2**31, 2**31, size=(46 // 4, 2, 16)).astype(np.int32))
    for start in tiles.row_start.tolist():
        for col in range(2) if start >= 0 else ():
            message = ref_lottery.fold_message(acc[start:start + 4, 64 * col:64 * col + 64],
                                               TILE_4X64.row_pattern, TILE_4X64.col_pattern)
            lanes[start // 4, col] = torch.from_numpy(np.frombuffer(message, dtype="<i4").copy())
    tickets = _reference_tickets(acc, tiles, key)
    (expert, local, col), ticket = min(tickets.items(), key=lambda kv: int.from_bytes(kv[1], "little"))
    latch = dev_lottery.LotteryLatch("cpu", {})
    latch.set_header(23, 384, 1024, 5, 24, 6)
    got = torch.zeros((tiles.row_start.shape[0], 2, 8), dtype=torch.int32)
    latch.run_folded(lanes, tiles, words(key), words(ticket), words(PARENT), {}, tickets=got)
    for slot, (w, t) in enumerate(zip(tiles.expert.tolist(), tiles.local.tolist())):
        for c in range(2) if tiles.row_start[slot] >= 0 else ():
            assert bytes(got[slot, c].view(torch.uint8).tolist()) == tickets[(w, t, c)]
    latch.publish()
    record = latch.poll()
    assert (record.group_id, record.tile_row, record.tile_column, record.ticket) == (expert, local, col, ticket)
    with pytest.raises(dev_lottery.LotteryError, match="lanes must be int32"):
        latch.run_folded(lanes[..., :8], tiles, words(key), words(ticket), words(PARENT), {})


def test_payload_copies_only_on_a_win_and_lowers_the_flag(monkeypatch):
    """Five sources (two payload launches), programs striding over more words than one step: no
    copy without a winner; on a win every word is copied, and the last program of the last
    launch lowers `fresh` and resets its counter."""
    monkeypatch.setattr(dev_lottery, "_PAYLOAD_BLOCK", 4)
    monkeypatch.setattr(dev_lottery, "_PAYLOAD_PROGRAMS", 2)
    sizes = {"a": 11, "b": 3, "c": 17, "d": 1, "e": 9}
    latch = dev_lottery.LotteryLatch("cpu", {name: ((n,), torch.int32) for name, n in sizes.items()})
    sources = {name: torch.arange(n, dtype=torch.int32) + 100 * i for i, (name, n) in enumerate(sizes.items())}
    latch.capture(sources)
    assert all(not latch.payload[name].any() for name in sizes)
    latch.fresh.fill_(1)
    latch.capture(sources)
    assert all(torch.equal(latch.payload[name], sources[name]) for name in sizes)
    assert int(latch.fresh) == 0 and int(latch._done) == 0


def test_lottery_threshold_below_every_ticket_publishes_nothing():
    acc = torch.randn(8, 64)
    tiles = dev_routing.row_tiles(dev_routing.dense_table(8, "cpu"))
    latch = dev_lottery.LotteryLatch("cpu", {})
    latch.run(acc, tiles, words(PARENT), torch.zeros(8, dtype=torch.int32), words(PARENT), {})
    latch.host[1:].fill_(7)  # an unclaimed record writes nothing to the host: no PCIe stores
    latch.publish()
    assert latch.poll() is None and latch.host[1:].eq(7).all()
    with pytest.raises(dev_lottery.LotteryError, match="n_e % 64"):
        latch.run(torch.zeros(8, 32), tiles, words(PARENT), torch.zeros(8, dtype=torch.int32), words(PARENT), {})


# -------------------------------------------------------------------------------------------- peel

def test_peel_recovers_the_denoised_product():
    """acc + A_peel·B_peelᵀ ≈ (A′ − β_A N_A)(B′ − β_B N_B)ᵀ, then unscaled by α_A α_B."""
    from kernels.fp8mine.peel import a_peel, b_peel, peel_and_unscale
    from kernels.fp8mine.quant import NoisySide
    torch.manual_seed(0)
    m, n, k = 8, 64, 128

    def side(rows, seed):
        g = torch.Generator().manual_seed(seed)
        codes = (torch.randn(rows, k, generator=g) * 40).to(torch.float8_e4m3fn)
        e = (torch.randn(rows, 32, generator=g) * 40).to(torch.float8_e4m3fn)
        beta = (torch.rand(rows, generator=g) * 1e-3 + 1e-4).to(torch.bfloat16)
        alpha = (torch.rand(rows, generator=g) + 0.5).to(torch.bfloat16)
        return codes, e, beta, alpha

    f_a = (torch.randn(k, 32) * 40).to(torch.float8_e4m3fn)
    f_b = (torch.randn(k, 32) * 40).to(torch.float8_e4m3fn)
    a_codes, e_a, beta_a, alpha_a = side(m, 1)
    b_codes, e_b, beta_b, alpha_b = side(n, 2)
    n_a = e_a.float() @ f_a.float().T
    n_b = e_b.float() @ f_b.float().T
    a = NoisySide(a_codes, alpha_a, beta_a, e_a)
    b = NoisySide(b_codes, alpha_b, beta_b, e_b)
    acc = a_codes.float() @ b_codes.float().T
    table = dev_routing.dense_table(m, "cpu")
    out = peel_and_unscale(acc, a_peel(a, f_b), alpha_a, b_peel(b, n_b, f_a).view(1, n, 64), alpha_b.view(1, n), table)
    clean_a = a_codes.float() - beta_a.float()[:, None] * n_a
    clean_b = b_codes.float() - beta_b.float()[:, None] * n_b
    want = (clean_a @ clean_b.T) / alpha_a.float()[:, None] / alpha_b.float()[None, :]
    assert float((out.float() - want).norm() / want.norm()) < 2e-2


@pytest.mark.parametrize("split_k, rows, wide", [(True, 64, False), (True, 16, False), (False, 64, False),
                                                 (False, 64, True)])
def test_a_peel_and_routed_peel_match_the_formula(split_k, rows, wide, monkeypatch):
    """The A peel kernel (e4m3 windows against F_Bᵀ's codes; split over k, the last program of
    each row block adding the partials — run twice, so the counters are back at zero — or one
    pass; 16- or 64-row blocks) and the peel pass with rows in expert order (tiles never
    straddle an expert; A peel rows and α_A gathered through Rflat) against the formula in torch."""
    from kernels.fp8mine import peel
    from kernels.fp8mine.peel import a_peel, peel_and_unscale
    from kernels.fp8mine.quant import NoisySide
    if not split_k:
        monkeypatch.setattr(peel, "_A_PEEL_DECODE_PROGRAMS", 1)
    if rows == 16:  # the middle sizes' row blocks
        monkeypatch.setattr(peel, "_A_PEEL_DECODE_ROWS", 4)
    if wide:
        monkeypatch.setattr(peel, "_A_PEEL_WIDE_FROM", 1)
    assert (peel.a_peel_splits(12, 256, 128)[0] > 1) == split_k
    assert peel.a_peel_rows(12) == rows
    g = torch.Generator().manual_seed(4)
    tokens, top_k, experts, n_e, k = 12, 2, 3, 64, 256
    codes = (torch.randn(tokens, k, generator=g) * 40).to(torch.float8_e4m3fn)
    e_a = (torch.randn(tokens, 32, generator=g) * 40).to(torch.float8_e4m3fn)
    beta = (torch.rand(tokens, generator=g) * 1e-3).to(torch.bfloat16)
    alpha = (torch.rand(tokens, generator=g) + 0.5).to(torch.bfloat16)
    f_b = (torch.randn(k, 32, generator=g) * 40).to(torch.float8_e4m3fn)
    peel_rows = a_peel(NoisySide(codes, alpha, beta, e_a), f_b)
    assert torch.equal(a_peel(NoisySide(codes, alpha, beta, e_a), f_b), peel_rows)
    assert torch.equal(peel_rows[:, :32], (beta.float()[:, None] * e_a.float()).to(torch.bfloat16))
    right = (codes.float() @ f_b.float()).to(torch.bfloat16)
    assert torch.equal(peel_rows[:, 32:], right)  # exact products, fp32 sums of ≤ 2^24-scale terms
    topk = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)])
    table = dev_routing.routing_table(topk, experts)
    rows = table.rflat.long()
    acc = torch.randn(rows.shape[0], n_e, generator=g) * 100
    b_peel = torch.randn(experts, n_e, 64, generator=g).to(torch.bfloat16)
    alpha_b = (torch.rand(experts, n_e, generator=g) + 0.5).to(torch.bfloat16)
    out = peel_and_unscale(acc, peel_rows, alpha, b_peel, alpha_b, table)
    expert = torch.searchsorted(table.offsets.long(), torch.arange(rows.shape[0]), right=True)
    correction = torch.einsum("rj,rcj->rc", peel_rows[rows].float(), b_peel[expert].float())
    want = (acc + correction) / alpha[rows].float()[:, None] / alpha_b[expert].float()
    assert torch.allclose(out.float(), want, rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("rows_per_expert", [8, 70])
def test_peel_reads_a_bf16_accumulator_as_its_fp32_values(rows_per_expert):
    """The fold GEMM's bf16 accumulator (matmul.BF16_FOLDED_ACC): the peel pass (decode: by
    expert; prefill: 64-row tiles) gives bit for bit what it gives on the same values in fp32,
    and refuses an accumulator of another type."""
    from kernels.fp8mine.peel import peel_and_unscale, reads_tiles
    g = torch.Generator().manual_seed(6)
    experts, n_e, tokens = 2, 64, 2 * rows_per_expert
    topk = (torch.arange(tokens) % experts)[:, None]
    table = dev_routing.routing_table(topk, experts)
    assert reads_tiles(table) == (rows_per_expert >= 64)
    acc = (torch.randn(tokens, n_e, generator=g) * 1e4).to(torch.bfloat16)
    operands = ((torch.randn(tokens, 64, generator=g) * 10).to(torch.bfloat16),
                (torch.rand(tokens, generator=g) + 0.5).to(torch.bfloat16),
                (torch.randn(experts, n_e, 64, generator=g) * 10).to(torch.bfloat16),
                (torch.rand(experts, n_e, generator=g) + 0.5).to(torch.bfloat16), table)
    got = peel_and_unscale(acc, *operands)
    want = peel_and_unscale(acc.float(), *operands)
    assert got.dtype == torch.bfloat16 and torch.equal(got.view(torch.int16), want.view(torch.int16))
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        peel_and_unscale(acc.float().to(torch.float16), *operands)
