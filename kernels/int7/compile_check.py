"""Compile every kernels.int7 Triton kernel for sm_90a without a GPU and report its resources.

    PEARL_INT7_INTERPRET=0 python -m kernels.int7.compile_check

Prints one JSON line per kernel variant: registers, local-memory stack (spills), shared memory,
and how many local loads/stores the SASS has, and how many of them inside loops.
Run in its own process with PEARL_INT7_INTERPRET=0 (kernels.int7 picks the interpreter at import
when there is no CUDA device). tests/test_int7_gpu_compile.py runs it in CI.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from . import (a_side, activations, blake3, clean_peel, codes_and_leaves, lag_operand, mined_gemm, noise, seeds,
               split_peel, tile_lottery, winner)
from kernels.triton_jit import INTERPRETING

TARGET = GPUTarget("cuda", 90, 32)
_GEMM_SIGNATURE = {
    "an_ptr": "*i8", "ac_ptr": "*i8", "bt_ptr": "*i8", "apb_ptr": "*i32", "ub_ptr": "*i8",
    "key_ptr": "*i32", "bound_ptr": "*i32", "mvalid_ptr": "*i32", "record_ptr": "*i32",
    "sa_ptr": "*fp32", "sb_ptr": "*fp32", "out_ptr": "*bf16", "out32_ptr": "*i32", "dump_ptr": "*i32",
    "phase_ptr": "*i32", "phase_words": "i32", "M": "i32", "N": "i32", "K": "i32", "NC": "i32",
    **{name: "constexpr" for name in ("R", "BM", "BN", "BK", "H", "MINE", "PEEL", "WRITE_I32", "DUMP",
                                       "PHASED", "WRITE_BF16", "WAIT_APB", "DEPENDENTS")},
}


# Integer arguments that are multiples of 16 on the bench shapes (the JIT specialises them so).
_ALIGNED_INTS = ("M", "N", "K", "pb_stride", "rows_per_instance", "factor_stride", "phase_words",
                 "words_per_instance")


def _variants() -> list[tuple[str, object, dict, dict, int, int]]:
    """(name, kernel, signature, constexprs, num_warps, num_stages) of the variants the miner uses."""
    lanes = {"LANES": 128}
    out = [
        ("blake3_chunks", blake3._chunk_kernel,
         {"data_ptr": "*i32", "key_ptr": "*i32", "key_stride": "i32", "out_ptr": "*i32",
          "words_per_instance": "i32", "chunks_per_instance": "i32", "total_chunks": "i32",
          "last_flags": "i32", "LANES": "constexpr"}, lanes, 4, 1),
        ("blake3_parents", blake3._parent_kernel,
         {"level_ptr": "*i32", "key_ptr": "*i32", "key_stride": "i32", "out_ptr": "*i32", "count": "i32",
          "parents": "i32", "total": "i32", "flags": "i32", "LANES": "constexpr"}, lanes, 4, 1),
        ("blake3_upper_levels", blake3._upper_levels_kernel,
         {"level_ptr": "*i32", "key_ptr": "*i32", "key_stride": "i32", "flat_ptr": "*i32", "chunks": "i32",
          "flat_nodes": "i32", "LANES": "constexpr"}, lanes, 4, 1),
    ]
    for salted, fold in ((1, 0), (1, 1)):
        out.append((f"seeds_salted{salted}_fold{fold}", seeds._seed_kernel,
                    {"parent_ptr": "*i32", "parent_stride": "i32", "root_ptr": "*i32", "salt_ptr": "*i32",
                     "dim": "i32", "routing_ptr": "*i32", "offsets_ptr": "*i32", "out_ptr": "*i32",
                     "total": "i32", "SALTED": "constexpr", "FOLD": "constexpr", "LANES": "constexpr"},
                    {"SALTED": salted, "FOLD": fold, "LANES": 32}, 4, 1))
    quantise = {"x_ptr": "*i16", "q_ptr": "*i8", "scale_ptr": "*fp32", "zero_ptr": "*i32", "rows": "i32",
                "K": "i32", "R": "i32", "BR": "constexpr", "BK": "constexpr", "ONE_PASS": "constexpr",
                "TAIL": "constexpr", "RECIPROCAL": "constexpr", "BF16_BITS": "constexpr",
                "ZERO_WIDTH": "constexpr"}  # bf16 rows as their 16-bit patterns
    for label, rows, width, tail, one_pass, reciprocal, zero, warps in (
            ("decode", 1, 4096, 2048, 1, 1, 128, 8),  # K 6144: 4096 + 2048, zeroes A·P_B's row
            ("k7168", 1, 4096, 4096, 1, 1, 0, 8),  # DeepSeek-V3's K: 4096 + 4096 (3072 live)
            ("prefill_k4096", 2, 4096, 0, 1, 1, 0, 8),  # two rows per program
            ("two_pass", 1, activations._TWO_PASS_BLOCK, 0, 0, 1, 0, 8),  # rows longer than 32768
            ("fp32", 1, 4096, 2048, 1, 0, 0, 8)):  # fp32 rows divide
        signature = dict(quantise, x_ptr="*fp32") if not reciprocal else quantise
        out.append((f"activations_quantise_{label}", activations._quantise_kernel, signature,
                    {"BR": rows, "BK": width, "TAIL": tail, "ONE_PASS": one_pass, "RECIPROCAL": reciprocal,
                     "BF16_BITS": reciprocal, "ZERO_WIDTH": zero}, warps, 1))
    fused = {"x_ptr": "*i16", "q_ptr": "*i8", "q_words_ptr": "*i32", "scale_ptr": "*fp32", "key_ptr": "*i32",
             "key_stride": "i32", "cv_ptr": "*i32", "rows": "i32", "rows_per_instance": "i32", "K": "i32",
             **{name: "constexpr" for name in ("ROWS", "CHUNKS_PER_ROW", "BK", "TAIL", "RECIPROCAL", "BF16_BITS",
                                               "LANES")}}
    chunk_lanes = codes_and_leaves.LANES
    for k in (6144, 4096, 7168):  # GLM-5 (4096 + 2048), Qwen3 (one block), DeepSeek-V3 (4096 + 4096)
        block_k, tail = activations.one_pass_blocks(k)
        out.append((f"codes_and_leaves_k{k}", codes_and_leaves._codes_and_leaves_kernel, fused,
                    {"ROWS": chunk_lanes // (k // 1024), "CHUNKS_PER_ROW": k // 1024, "BK": block_k, "TAIL": tail,
                     "RECIPROCAL": activations.PRODUCT_CODES.value, "BF16_BITS": 1, "LANES": chunk_lanes},
                    chunk_lanes // 32, 1))
    for regime, rows, warps, atomic in (("decode", 16, 4, 1), ("prefill", 128, 8, 0), ("mid", 64, 4, 0)):
        out.append((f"activations_apb_{regime}", activations._apb_kernel,
                    {"q_ptr": "*i8", "pb_ptr": "*i8", "pb_stride": "i32", "apb_ptr": "*i32",
                     "rows_per_instance": "i32", "K": "i32", "steps_per_split": "i32", "R": "constexpr",
                     "BR": "constexpr", "BK": "constexpr", "RB": "constexpr", "ATOMIC": "constexpr",
                     "PB_KMAJOR": "constexpr", "DEPENDENTS": "constexpr"},
                    {"R": 128, "BR": rows, "BK": 128, "RB": 128, "ATOMIC": atomic, "PB_KMAJOR": 1,
                     "DEPENDENTS": 1}, warps, 3))  # as sm_90 launches it: the next kernel may start
    out.append(("noised", noise._noised_kernel,
                {"x_ptr": "*i8", "u_ptr": "*i8", "first_ptr": "*i32", "second_ptr": "*i32", "out_ptr": "*i8",
                 "rows_per_instance": "i32", "factor_stride": "i32", "K": "i32", "R": "constexpr",
                 "BR": "constexpr", "BK": "constexpr"}, {"R": 128, "BR": noise._ROWS, "BK": noise._COLS},
                noise._NOISED_WARPS, 1))
    for rows, warps, max_rank in noise._MMA_ROWS:  # rank 128 and the largest each takes; P built or loaded
        for rank in sorted({128, max_rank}):
            for load_p in (0, 1):
                out.append((f"noised_mma_{rows}" + ("" if rank == 128 else f"_r{rank}") + ("_load_p" if load_p else ""),
                            noise._noised_mma_kernel,
                            {"x_ptr": "*i8", "u_ptr": "*i8", "first_ptr": "*i32", "second_ptr": "*i32", "p_ptr": "*i8",
                             "out_ptr": "*i8", "rows_per_instance": "i32", "factor_stride": "i32", "K": "i32",
                             "R": "constexpr", "BR": "constexpr", "BC": "constexpr", "STAGES": "constexpr",
                             "LOAD_P": "constexpr"},
                            {"R": rank, "BR": rows, "BC": noise._MMA_COLS, "STAGES": noise._MMA_STAGES,
                             "LOAD_P": load_p}, warps, 1))
    out.append(("noise_factors", noise._prng_kernel,
                {"key_ptr": "*i32", "label_ptr": "*i32", "u_ptr": "*i32", "first_ptr": "*i32",
                 "second_ptr": "*i32", "u_blocks": "i32", "u_total": "i32", "u_limit": "i32",
                 "s_blocks": "i32", "s_total": "i32", "s_limit": "i32", "rank": "i32", "u_programs": "i32",
                 "LANES": "constexpr"}, lanes, 4, 1))
    out.append(("a_side_commit_seed", a_side._commit_seed_kernel,
                {"q_ptr": "*i32", "key_ptr": "*i32", "sb_ptr": "*i32", "salt_ptr": "*i32", "nodes_ptr": "*i32",
                 "sa_ptr": "*i32", "apb_ptr": "*i32", "words_per_instance": "i32", "chunks": "i32",
                 "nodes_per_instance": "i32", "dim": "i32", "apb_per_instance": "i32",
                 "SALTED": "constexpr", "LANES": "constexpr", "ZERO_BLOCK": "constexpr"},
                {"SALTED": 1, "LANES": a_side._LANES, "ZERO_BLOCK": a_side._ZERO_BLOCK}, 4, 1))
    for rows in a_side.FUSED_ROWS:
        out.append((f"a_side_noise_apply_m{rows}", a_side._noise_apply_kernel,
                    {"q_ptr": "*i8", "sa_ptr": "*i32", "label_ptr": "*i32", "u_ptr": "*i8",
                     "first_ptr": "*i32", "second_ptr": "*i32", "out_ptr": "*i8", "pb_ptr": "*i8",
                     "apb_ptr": "*i32", "K": "i32", "u_blocks": "i32", "column_blocks": "i32",
                     "R": "constexpr", "BR": "constexpr", "BC": "constexpr", "BK": "constexpr",
                     "LANES": "constexpr"},
                    {"R": 128, "BR": rows, "BC": a_side._BLOCK_BYTES // rows, "BK": 128,
                     "LANES": a_side._LANES}, a_side._APPLY_WARPS, a_side._APPLY_STAGES))
    side_chain = {"q_words_ptr": "*i32", "q_ptr": "*i8", "key_ptr": "*i32", "sb_ptr": "*i32",
                  "salt_ptr": "*i32", "nodes_ptr": "*i32", "sa_ptr": "*i32", "label_ptr": "*i32",
                  "u_ptr": "*i8", "first_ptr": "*i32", "second_ptr": "*i32", "out_ptr": "*i8", "copy_ptr": "*i8",
                  "valid_ptr": "*i32", "valid_rows": "i32", "words_per_instance": "i32", "chunks": "i32",
                  "nodes_per_instance": "i32", "K": "i32", "u_blocks": "i32", "phase_ptr": "*i32",
                  "phase_words": "i32", "sync_ptr": "*i32", "experts": "i32", "part_steps": "i32",
                  "SALTED": "constexpr", "R": "constexpr", "BR": "constexpr",
                  "BC": "constexpr", "LANES": "constexpr", "COPY": "constexpr", "MARK": "constexpr",
                  "PHASED": "constexpr", "SPLIT": "constexpr"}
    for rows in a_side.FUSED_ROWS:  # the lagged pass's side chain: one kernel, a program per instance
        for warps in a_side.SIDE_WARPS_CHOICES:  # as the lagged pass launches it (q copy, row count, phase)
            for split in (1, 4):  # one program an instance, or four sharing it (the in-kernel hand-off)
                out.append((f"a_side_side_chain_m{rows}_w{warps}" + (f"_s{split}" if split > 1 else ""),
                            a_side._side_chain_kernel, side_chain,
                            {"SALTED": 1, "R": 128, "BR": rows, "BC": a_side.side_columns(rows, warps),
                             "LANES": 32 * warps, "COPY": 1, "MARK": 1, "PHASED": 1, "SPLIT": split}, warps, 1))
    for label, phased in (("", 0), ("_lagged", 1)):
        out.append((f"retain{label}", winner._retain_kernel,
                    {"record_ptr": "*i32", "src_ptr": "*i32", "dst_ptr": "*i32", "per_instance": "i32",
                     "phase_ptr": "*i32", "phase_words": "i32", "USE_INDEX": "constexpr",
                     "PHASED": "constexpr", "BLOCK": "constexpr", "WAIT_PRIOR": "constexpr"},
                    {"USE_INDEX": 1, "PHASED": phased, "BLOCK": 1024, "WAIT_PRIOR": 1}, 4, 1))
    out.append(("publish", winner._publish_kernel,
                {"record_ptr": "*i32", "body_ptr": "*i32", "doorbell_ptr": "*i32", "WORDS": "constexpr",
                 "FIRST": "constexpr", "MARK": "constexpr", "WAIT_PRIOR": "constexpr"},
                {"WORDS": mined_gemm.RECORD_WORDS, "FIRST": 0, "MARK": 12, "WAIT_PRIOR": 1}, 1, 1))
    for regime, rows in (("decode", 16), ("prefill", 2048)):  # the default tilings, GLM-5's shape
        t = mined_gemm.default_tiling(rows, 4096, 6144, 128)
        kinds = [("mined", 1, 0), ("unmined", 0, 0)] + ([("mined_lagged", 1, 1)] if regime == "decode" else [])
        for label, mine, phased in kinds:  # decode also as the lagged pass launches it (phase word, after A·P_B)
            constexprs = {"R": 128, "BM": t.block_m, "BN": t.block_n, "BK": t.block_k, "H": mined_gemm.TILE_H,
                          "MINE": mine, "PEEL": mine, "WRITE_I32": 0, "DUMP": 0, "PHASED": phased, "WRITE_BF16": 1,
                          "WAIT_APB": phased, "DEPENDENTS": mine}
            out.append((f"gemm_{regime}_{label}_{t.block_m}x{t.block_n}x{t.block_k}",
                        mined_gemm._mined_gemm_kernel, _GEMM_SIGNATURE, constexprs, t.num_warps, t.num_stages))
    out.extend(_split_peel_variants())
    return out


def _split_peel_variants() -> list[tuple[str, object, dict, dict, int, int]]:
    """The prefill pass with the peel on its own (GLM-5's shape): the mined GEMM writing A'·B' as
    int32, Qᵀ = B'·P_A through the plain kernel, and the peel kernel."""
    gemm = {"R": 128, "H": mined_gemm.TILE_H, "DUMP": 0, "PHASED": 0, "WRITE_I32": 1, "WRITE_BF16": 0,
            "WAIT_APB": 0}  # DEPENDENTS: the mined GEMM as `mined_gemm` launches it, the plain one as `plain_gemm`
    t = mined_gemm.default_tiling(2048, 4096, 6144, 128)
    q = mined_gemm.default_tiling(4096, 128, 6144, 128)
    p = split_peel.default_peel_tiling(2048, 4096, 128)
    peel_signature = {"raw_ptr": "*i32", "left_ptr": "*i8", "right_ptr": "*i8", "sa_ptr": "*fp32",
                      "sb_ptr": "*fp32", "out_ptr": "*bf16", "out32_ptr": "*i32", "M": "i32", "N": "i32",
                      **{name: "constexpr" for name in ("DEPTH", "SEGMENT", "BM", "BN", "BK", "WRITE_I32")}}
    digits = split_peel.q_limbs(6144)
    return [
        (f"gemm_prefill_raw_{t.block_m}x{t.block_n}x{t.block_k}", mined_gemm._mined_gemm_kernel, _GEMM_SIGNATURE,
         dict(gemm, BM=t.block_m, BN=t.block_n, BK=t.block_k, MINE=1, PEEL=0, DEPENDENTS=1), t.num_warps,
         t.num_stages),
        (f"gemm_noise_product_{q.block_m}x{q.block_n}x{q.block_k}", mined_gemm._mined_gemm_kernel,
         _GEMM_SIGNATURE, dict(gemm, R=q.block_k, BM=q.block_m, BN=q.block_n, BK=q.block_k, MINE=0, PEEL=0,
                               DEPENDENTS=0),
         q.num_warps, q.num_stages),
        (f"split_peel_{p.block_m}x{p.block_n}x{p.block_k}", split_peel._split_peel_kernel, peel_signature,
         {"DEPTH": digits * 256, "SEGMENT": 256, "BM": p.block_m, "BN": p.block_n, "BK": p.block_k,
          "WRITE_I32": 0}, p.num_warps, p.num_stages),
        ("split_peel_digit_operand", split_peel._digit_operand_kernel,
         {"small_ptr": "*i8", "wide_ptr": "*i32", "out_ptr": "*i8", "rows": "i32", "R": "constexpr",
          "DIGITS": "constexpr", "WIDE_FIRST": "constexpr", "BR": "constexpr"},
         {"R": 128, "DIGITS": digits, "WIDE_FIRST": 1, "BR": split_peel._DIGIT_ROWS}, 4, 1),
        ("lag_operand_stack", lag_operand._stack_kernel,  # the lagged CuTe pass's [READY A' ; q] rows
         {"an_ptr": "*i8", "q_ptr": "*i8", "sa_ptr": "*i32", "valid_ptr": "*i32", "phase_ptr": "*i32",
          "phase_words": "i32", "out_ptr": "*i8", "sa_out_ptr": "*i32", "valid_out_ptr": "*i32",
          "counter_ptr": "*i32", "experts": "i32", "M": "i32", "K": "i32", "BR": "constexpr", "BK": "constexpr",
          "SMALL": "constexpr", "ZERO_COUNTER": "constexpr"},
         {"BR": lag_operand.ROW_BLOCK, "BK": lag_operand._COLS, "SMALL": 256, "ZERO_COUNTER": 1},
         lag_operand._WARPS, 1),
        ("clean_peel", clean_peel._clean_peel_kernel,  # the lagged CuTe pass's served rows (M = 16)
         {"raw_ptr": "*i32", "apb_ptr": "*i32", "ub_ptr": "*i8", "sa_ptr": "*fp32", "sb_ptr": "*fp32",
          "out_ptr": "*bf16", "out32_ptr": "*i32", "M": "i32", "N": "i32", "raw_rows": "i32", "raw_first": "i32",
          "R": "constexpr", "BM": "constexpr", "BN": "constexpr", "WRITE_I32": "constexpr"},
         {"R": 128, "BM": 16, "BN": clean_peel._COLS, "WRITE_I32": 0}, clean_peel._WARPS, 1),
        ("tile_lottery", tile_lottery._tile_lottery_kernel,  # tickets of the CuTe transcript GEMM's words
         {"words_ptr": "*i32", "key_ptr": "*i32", "bound_ptr": "*i32", "mvalid_ptr": "*i32", "record_ptr": "*i32",
          "dump_ptr": "*i32", "tile_rows": "i32", "tiles_n": "i32", **{name: "constexpr" for name in ("H", "BN", "BT", "DUMP")}},
         {"H": mined_gemm.TILE_H, "BN": 128, "BT": tile_lottery.TILES_PER_PROGRAM, "DUMP": 0},
         tile_lottery.TILES_PER_PROGRAM // tile_lottery.LANES_PER_WARP, 1),
    ]


def _cuobjdump(cubin: bytes, flag: str) -> str:
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        return subprocess.run([str(tool), flag, handle.name], capture_output=True, text=True,
                              check=True).stdout


def local_accesses(sass: str) -> dict[str, int]:
    """Local-memory (stack) loads and stores in SASS, and how many of them sit inside a loop (an
    instruction range closed by a branch back to a lower address): a spill in the k loop costs
    every step, one outside it once per program."""
    loops: list[tuple[int, int]] = []
    local: list[int] = []
    for line in sass.splitlines():
        found = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*)", line)
        if found is None:
            continue
        address, instruction = int(found[1], 16), found[2]
        branch = re.search(r"\bBRA\s+0x([0-9a-f]+)", instruction)
        if branch and int(branch[1], 16) < address:
            loops.append((int(branch[1], 16), address))
        if re.search(r"\b(STL|LDL)\b", instruction):
            local.append(address)
    in_loop = [a for a in local if any(start <= a <= end for start, end in loops)]
    return {"local_accesses": len(local), "local_accesses_in_loops": len(in_loop)}


def _resources(cubin: bytes) -> dict[str, int]:
    text = _cuobjdump(cubin, "--dump-resource-usage")
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", text)
    if found is None:
        raise RuntimeError(f"cuobjdump printed no resource usage: {text[:300]}")
    sass = _cuobjdump(cubin, "-sass")
    return {"registers": int(found[1]), "stack_bytes": int(found[2]), "local_bytes": int(found[4]),
            **local_accesses(sass), **grid_dependency(sass)}


def grid_dependency(sass: str) -> dict[str, int]:
    """Programmatic-dependent-launch instructions in SASS: PREEXIT (griddepcontrol.launch_dependents:
    the next kernel may start) and ACQBULK (griddepcontrol.wait: the kernel before has ended)."""
    return {"pdl_triggers": len(re.findall(r"\bPREEXIT\b", sass)),
            "pdl_waits": len(re.findall(r"\bACQBULK\b", sass))}


def compile_all() -> list[dict]:
    """Compile each variant for sm_90a (pointers and _ALIGNED_INTS 16-aligned, as the JIT
    specialises them at launch for the bench shapes) and measure it."""
    if INTERPRETING:
        raise RuntimeError("set PEARL_INT7_INTERPRET=0 before importing kernels.int7 to compile")
    results = []
    for name, kernel, signature, constexprs, warps, stages in _variants():
        aligned = [i for i, (arg, kind) in enumerate(signature.items())
                   if kind.startswith("*") or arg in _ALIGNED_INTS]
        attrs = {(i,): [["tt.divisibility", 16]] for i in aligned}
        compiled = triton.compile(ASTSource(fn=kernel, signature=dict(signature), constexprs=constexprs,
                                            attrs=attrs), target=TARGET,
                                  options={"num_warps": warps, "num_stages": stages})
        results.append({"kernel": name, "num_warps": warps, "num_stages": stages,
                        "shared_bytes": compiled.metadata.shared, **_resources(compiled.asm["cubin"])})
    return results


def main() -> int:
    for result in compile_all():
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    if os.environ.get("PEARL_INT7_INTERPRET") != "0":
        print("run with PEARL_INT7_INTERPRET=0", file=sys.stderr)
        sys.exit(2)
    sys.exit(main())
