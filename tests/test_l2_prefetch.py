"""kernels.l2_prefetch: the first-wave arithmetic, the argument checks, the sm_90 compile (one bulk
L2 prefetch a thread, kept although it has no result), and on a GPU: a launch over a strided fp8
view leaves every byte as it was."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from kernels.l2_prefetch import PrefetchError, first_wave_rows, prefetch_rows


def test_first_wave_covers_whole_experts_in_expert_order():
    # GLM-5 FC1 decode: 132 CTAs of 128 columns cover 16896 rows, 4.1 experts of 4096: five whole
    assert first_wave_rows(32, 4096, 132, 128) == 5 * 4096
    assert first_wave_rows(32, 4096, 128, 128) == 4 * 4096  # exactly four
    assert first_wave_rows(3, 4096, 132, 128) == 3 * 4096  # fewer experts than the wave
    with pytest.raises(PrefetchError):
        first_wave_rows(32, 0, 132, 128)


@pytest.mark.parametrize("make, rows, row_bytes", [
    (lambda: torch.zeros(4, 64, dtype=torch.uint8).t(), 4, 16),  # last dimension strided
    (lambda: torch.zeros(4, 64, dtype=torch.uint8), 5, 16),  # more rows than it has
    (lambda: torch.zeros(4, 64, dtype=torch.uint8), 0, 16),
    (lambda: torch.zeros(4, 64, dtype=torch.uint8), 4, 80),  # longer than a row
    (lambda: torch.zeros(4, 64, dtype=torch.uint8), 4, 24),  # not a multiple of 16
    (lambda: torch.zeros(4, 72, dtype=torch.uint8)[:, :64], 4, 16),  # a 72-byte row stride
    (lambda: torch.zeros(2, 4, 64, dtype=torch.uint8)[:, :3], 2, 16),  # rows not one stride apart
])
def test_bad_regions_are_refused(make, rows, row_bytes):
    with pytest.raises(PrefetchError):
        prefetch_rows(make(), rows, row_bytes)


def test_a_strided_view_of_padded_rows_is_accepted_and_left_alone():
    # B′ as the lagged pass reads it: (e, n, k) codes, each row followed by a 128-byte tail
    padded = torch.randint(0, 256, (2 * 8, 256 + 128), dtype=torch.uint8)
    b = padded[:, :256].view(2, 8, 256)
    before = padded.clone()
    prefetch_rows(b, 16, 256)
    assert torch.equal(padded, before)


COMPILE = textwrap.dedent("""
    import os
    os.environ["PEARL_INT7_INTERPRET"] = "0"
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from kernels import l2_prefetch
    kernel = triton.compile(ASTSource(fn=l2_prefetch._prefetch_kernel, signature={
        "b_ptr": "*u8", "row_stride": "i32", "rows": "i32", "row_bytes": "i32", "BLOCK": "constexpr"},
        constexprs={"BLOCK": l2_prefetch._ROWS_PER_PROGRAM}), target=GPUTarget("cuda", 90, 128),
        options={"num_warps": l2_prefetch._WARPS})
    print(kernel.asm["ptx"])
""")


def test_the_kernel_compiles_for_sm90_with_one_prefetch_a_thread():
    ptx = subprocess.run([sys.executable, "-c", COMPILE], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONWARNINGS="ignore")).stdout
    from kernels import l2_prefetch
    per_thread = l2_prefetch._ROWS_PER_PROGRAM // (32 * l2_prefetch._WARPS)
    assert ptx.count("cp.async.bulk.prefetch.L2.global") == per_thread
    assert "st.global" not in ptx  # a hint: nothing written


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_gpu_prefetch_leaves_the_weights_as_they_were():
    padded = torch.randint(0, 256, (32 * 512, 1024 + 128), dtype=torch.uint8, device="cuda")
    b = padded[:, :1024].view(torch.float8_e4m3fn).view(32, 512, 1024)
    before = padded.clone()
    prefetch_rows(b, first_wave_rows(32, 512, 132, 128), 512)
    torch.cuda.synchronize()
    assert torch.equal(padded, before)
