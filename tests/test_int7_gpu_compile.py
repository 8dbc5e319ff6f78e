"""Every kernels.int7 Triton kernel compiles for sm_90a on a machine without a GPU; the support
kernels keep everything in registers, and the mined GEMM's default tilings keep their local-memory
stack within what was measured fastest on the H200 (docs/kernels-int7.md)."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_kernels_compile_for_sm90a_and_spills_stay_within_the_measured_defaults():
    env = dict(os.environ, PEARL_INT7_INTERPRET="0", PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, "-m", "kernels.int7.compile_check"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    results = {r["kernel"]: r for r in map(json.loads, run.stdout.splitlines())}
    decode, prefill = results["gemm_decode_mined_16x128x128"], results["gemm_prefill_mined_64x128x128"]
    activations = {"activations_quantise_decode", "activations_quantise_k7168",
                   "activations_quantise_prefill_k4096", "activations_quantise_two_pass",
                   "activations_quantise_fp32", "activations_apb_decode", "activations_apb_prefill",
                   "activations_apb_mid"}
    assert activations | {"blake3_chunks", "blake3_parents", "blake3_upper_levels", "seeds_salted1_fold1",
                          "noised", "noise_factors", "a_side_commit_seed", "a_side_noise_apply_m16",
                          "a_side_noise_apply_m64", "retain"} <= set(results)
    assert (decode["num_warps"], decode["num_stages"], prefill["num_warps"], prefill["num_stages"]) == (2, 4, 4, 3)
    # The defaults were measured fastest on the H200 (decode w2s4 vs w4s4 and a register cap,
    # prefill w4s3 vs w8s3) with a small spill: decode 16 bytes, all outside the k loop; prefill
    # 256 bytes, part of it inside the k loop. A larger stack, or a decode spill moving into the
    # loop, is a regression to re-measure.
    assert decode["stack_bytes"] <= 16 and decode["local_accesses_in_loops"] == 0
    assert prefill["stack_bytes"] <= 256 and prefill["local_accesses_in_loops"] <= 64
    # The lagged pass's GEMM starts beside A·P_B (programmatic dependent launch): A·P_B lets it
    # start, the GEMM waits for A·P_B's end once, before its peel, and still does not spill.
    lagged = results["gemm_decode_mined_lagged_16x128x128"]
    assert results["activations_apb_decode"]["pdl_triggers"] >= 1
    assert lagged["pdl_waits"] >= 1 and lagged["stack_bytes"] == 0 and lagged["local_accesses_in_loops"] == 0
    assert decode["pdl_waits"] == 0 and prefill["pdl_waits"] == 0
    assert results["retain_lagged"]["pdl_waits"] >= 1 and results["publish"]["pdl_waits"] >= 1
    assert results["gemm_decode_unmined_16x128x128"]["stack_bytes"] == 0
    assert results["gemm_prefill_unmined_64x128x128"]["stack_bytes"] == 0
    assert all(r["registers"] <= 255 for r in results.values())
    # The prefill pass with the peel on its own: none of its kernels spills (the stacked GEMM's
    # second accumulator is what spilled in the prefill mined GEMM).
    split = [name for name in results if name.startswith(("gemm_prefill_raw", "gemm_noise_product", "split_peel"))]
    assert len(split) == 4 and all(results[name]["stack_bytes"] == 0 for name in split)
    assert results["tile_lottery"]["stack_bytes"] == 0  # the CuTe transcript GEMM's tickets
    # the lagged CuTe pass's operand and served-row peel; the peel fits beside the SM-sharing GEMM
    # (half of an SM's 64 K registers: 128 threads × its registers)
    assert results["lag_operand_stack"]["stack_bytes"] == results["clean_peel"]["stack_bytes"] == 0
    assert results["clean_peel"]["registers"] * 128 <= 32 * 1024
    assert all(results[name]["stack_bytes"] == 0
               for name in ("noised", "noised_mma_64", "noised_mma_64_r256", "noised_mma_64_load_p",
                            "noised_mma_64_r256_load_p"))
    # The bandwidth-bound A-side kernels keep everything in registers: a spill would be traffic.
    assert all(results[name]["stack_bytes"] == 0 for name in activations)
    # The quantiser that hashes its codes: no spill, and at most 128 registers, so that at least
    # four programs share an SM (one's row loads beside another's hashing).
    fused = [results[f"codes_and_leaves_k{k}"] for k in (6144, 4096, 7168)]
    assert all(r["stack_bytes"] == 0 and r["registers"] <= 128 for r in fused)
    # A whole decode row (8192 values) in registers still leaves 4 programs of 8 warps per SM.
    assert results["activations_quantise_decode"]["registers"] <= 64
    assert all(results[f"a_side_noise_apply_m{m}"]["stack_bytes"] == 0 for m in (16, 32, 64))
    assert results["a_side_commit_seed"]["stack_bytes"] == 0
    # The lagged pass's one-kernel side chain: no stack at any width it takes; at the default
    # width a program fits in the registers three decode GEMM programs leave on an SM (64 K, a
    # thread's registers allocated in steps of 8), so it takes no GEMM program's slot.
    from kernels.int7.a_side import SIDE_WARPS, SIDE_WARPS_CHOICES
    assert all(results[f"a_side_side_chain_m{m}_w{w}"]["stack_bytes"] == 0
               for m in (16, 32, 64) for w in SIDE_WARPS_CHOICES)
    gemm_registers = -(-decode["registers"] // 8) * 8 * 32 * decode["num_warps"]
    side = results[f"a_side_side_chain_m16_w{SIDE_WARPS}"]
    assert 3 * gemm_registers + -(-side["registers"] // 8) * 8 * 32 * SIDE_WARPS <= 65536


def test_grid_dependency_counts_the_trigger_and_the_wait():
    from kernels.int7.compile_check import grid_dependency
    sass = ("        /*0000*/                   PREEXIT ;\n"
            "        /*0010*/                   ACQBULK ;\n"
            "        /*0020*/                   ACQBULK ;\n")
    assert grid_dependency(sass) == {"pdl_triggers": 1, "pdl_waits": 2}


def test_local_accesses_counts_only_those_inside_backward_branch_ranges():
    from kernels.int7.compile_check import local_accesses
    sass = ("        /*0000*/                   STL [R1], R2 ;\n"
            "        /*0010*/                   LDL R3, [R1] ;\n"
            "        /*0020*/               @P0 BRA 0x10 ;\n"
            "        /*0030*/                   LDL.LU R4, [R1+0x4] ;\n"
            "        /*0040*/                   BRA 0x40;\n")
    assert local_accesses(sass) == {"local_accesses": 3, "local_accesses_in_loops": 1}
