"""Every kernels.int7 Triton kernel compiles for sm_90a on a machine without a GPU, and the mined
kernels (decode and prefill tilings) and the noised-operand kernel keep everything in registers
(no local-memory spills)."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_kernels_compile_for_sm90a_and_mined_kernels_do_not_spill():
    env = dict(os.environ, PEARL_INT7_INTERPRET="0", PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, "-m", "kernels.int7.compile_check"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    results = {r["kernel"]: r for r in map(json.loads, run.stdout.splitlines())}
    assert {"blake3_chunks", "blake3_parents", "blake3_upper_levels", "seeds_salted1_fold1",
            "activations_quantise", "activations_apb_decode",
            "activations_apb_prefill", "noised", "noise_factors", "a_side_commit_seed",
            "a_side_noise_apply_m16", "a_side_noise_apply_m64",
            "retain", "gemm_decode_mined_16x128x128", "gemm_prefill_mined_64x128x128"} <= set(results)
    assert results["gemm_decode_mined_16x128x128"]["stack_bytes"] == 0
    assert results["gemm_decode_unmined_16x128x128"]["stack_bytes"] == 0
    capped = results["gemm_decode_mined_16x128x128_cap160"]  # the default decode tiling's register cap
    assert capped["stack_bytes"] == 0 and capped["registers"] <= 168  # 3 programs of 4 warps per SM
    assert results["gemm_prefill_mined_64x128x128"]["stack_bytes"] == 0
    assert results["gemm_prefill_mined_qpeel_64x128x128"]["stack_bytes"] == 0  # the prefill default
    assert results["q_peel_operand"]["stack_bytes"] == 0
    assert all(r["registers"] <= 255 for r in results.values())
    assert results["noised"]["stack_bytes"] == 0
    assert all(results[f"a_side_noise_apply_m{m}"]["stack_bytes"] == 0 for m in (16, 32, 64))
    assert results["a_side_commit_seed"]["stack_bytes"] == 0
