"""CPU compile check (no GPU needed: Triton's ptxas): the windowed FP8 GEMM compiles for sm_90 into
the Hopper model's structure — four K = 32 e4m3 WGMMAs per 128-k window, the first zero-initialised,
then one fp32 add per accumulator register; the noisy-quantization kernel has no contracted
multiply-add (and forms the A side's noise dot as one fresh K = 32 WGMMA); the pre-quantization
(+ the fused decode rows kernel), row-scales, row-norms,
noise-line, tile-map, lottery, payload, A-peel (+ split-k combine), peel tails, peel/unscale (decode by expert and
by row tile, the prefill column loop on an fp32 or bf16 accumulator, row-shifted), plane-forest (one launch),
launch-keys (+ E_A), routing (decode one-program table; prefill counts, prefixes, bounds, scatter) and short-hash kernels compile."""
import os
import re
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import os, re
    os.environ["PEARL_INT7_INTERPRET"] = "0"
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from kernels.fp8mine import (hashing, lottery, matmul, noise, noisy_kernel, norms_kernel,
                                 peel, prequant_kernel, routing, transcript)
    target = GPUTarget("cuda", 90, 128)
    # what a launch specialises: 16-byte aligned pointers and integers divisible by 16 (first n args)
    ALIGNED = lambda n: {(i,): [["tt.divisibility", 16]] for i in range(n)}
    gemm = triton.compile(ASTSource(fn=matmul._windowed_kernel, signature={
        "a_ptr": "*u8", "b_ptr": "*u8", "out_ptr": "*fp32", "tile_row_ptr": "*i32", "tile_expert_ptr": "*i32",
        "ends_ptr": "*i32", "n": "i32", "k": "i32", "BM": "constexpr", "BN": "constexpr"},
        constexprs={"BM": 64, "BN": 128}), target=target)
    print("PTX-BEGIN")
    print(gemm.asm["ptx"])
    print("PTX-END")
    triton.compile(ASTSource(fn=matmul._windowed_kernel, signature={
        "a_ptr": "*u8", "b_ptr": "*u8", "out_ptr": "*fp32", "tile_row_ptr": "*i32", "tile_expert_ptr": "*i32",
        "ends_ptr": "*i32", "n": "i32", "k": "i32", "BM": "constexpr", "BN": "constexpr"},
        constexprs={"BM": 128, "BN": 128}), target=target, options={"num_warps": 8})  # the prefill tile
    # the B side (N from memory); the A side (N formed in the launch), in token order and written
    # into expert order, reading opened values or (PLANES) opening them from codes and scales
    # (HW: the device's rounding instructions, every CUDA launch's; the emulation is the CPU
    # interpreter's)
    for dot, rows, cols, top_k, planes, hw in ((False, noisy_kernel._NOISY_ROWS, noisy_kernel._NOISY_COLS, 0, False, False),
                                               (True, noisy_kernel._DOT_ROWS, noisy_kernel._DOT_COLS, 0, False, False),
                                               (True, noisy_kernel._DOT_ROWS, noisy_kernel._DOT_COLS, 8, False, False),
                                               (True, noisy_kernel._DOT_ROWS, noisy_kernel._DOT_COLS, 8, True, False),
                                               (False, noisy_kernel._NOISY_ROWS, noisy_kernel._NOISY_COLS, 0, True, False),
                                               (True, noisy_kernel._DOT_ROWS, noisy_kernel._DOT_COLS, 8, True, True),
                                               (False, noisy_kernel._NOISY_ROWS, noisy_kernel._NOISY_COLS, 0, False, True)):
        noisy = triton.compile(ASTSource(fn=noisy_kernel._noisy_kernel, signature={
            "x_ptr": "*i8" if planes else "*i16", "scales_ptr": "*i16", "noise_ptr": "*fp32", "e_ptr": "*u8",
            "f_ptr": "*u8", "alpha_ptr": "*i16", "beta_ptr": "*i16", "out_ptr": "*u8", "positions_ptr": "*i32",
            "rows": "i32", "k": "i32", "stride": "i32", "BR": "constexpr", "BC": "constexpr", "DOT": "constexpr",
            "TOP_K": "constexpr", "PLANES": "constexpr", "HW": "constexpr"},
            constexprs={"BR": rows, "BC": cols, "DOT": dot, "TOP_K": top_k, "PLANES": planes, "HW": hw},
            attrs=ALIGNED(12)), target=target, options={"enable_fp_fusion": False})
        if top_k == 0 or planes or hw:
            tag = ("NOISYDOT" if dot else "NOISY") + ("PLANES" if planes else "") + ("HW" if hw else "")
            print(tag + "-BEGIN")
            print(noisy.asm["ptx"])
            print(tag + "-END")
    triton.compile(ASTSource(fn=noisy_kernel._row_scales_kernel, signature={
        "l2_ptr": "*i16", "linf_ptr": "*i16", "alpha_ptr": "*i16", "beta_ptr": "*i16", "rows": "i32",
        "delta_r": "fp32", "delta_over_std": "fp32", "BLOCK": "constexpr"}, constexprs={"BLOCK": 1024}),
        target=target, options={"enable_fp_fusion": False})
    for lines_type, first_lines in (("*i64", False), ("*i32", True)):
        triton.compile(ASTSource(fn=noise._noise_kernel, signature={
            "key_ptr": "*i32", "lines_ptr": lines_type, "out_ptr": "*u8", "count": "i32", "address": "i32",
            "target": "fp32", "LANES": "constexpr", "FIRST_LINES": "constexpr"},
            constexprs={"LANES": 32, "FIRST_LINES": first_lines}),
            target=target, options={"enable_fp_fusion": False})
    for x_type, x_bf16 in (("*i16", True), ("*fp32", False)):
        triton.compile(ASTSource(fn=prequant_kernel._prequant_kernel, signature={
            "x_ptr": x_type, "codes_ptr": "*i8", "scales_ptr": "*i16", "values_ptr": "*i16", "num_rows": "i32",
            "k": "i32", "recip_127": "fp32", "magic": "fp32", "X_BF16": "constexpr", "BR": "constexpr",
            "BB": "constexpr"}, constexprs={"X_BF16": x_bf16, "BR": prequant_kernel._ROWS, "BB": prequant_kernel._BLOCKS}),
            target=target, options={"enable_fp_fusion": False, "num_warps": prequant_kernel._WARPS})
    for rows, shifted, right_only, acc in ((64, False, False, "fp32"), (64, True, False, "fp32"),
                                           (64, True, True, "fp32"), (64, False, False, "bf16")):
        shape = peel.peel_shape(1056, 4096, 4 if acc == "fp32" else 2)  # the GLM-5 prefill's 3-stage loop
        peeled = triton.compile(ASTSource(fn=peel._peel_unscale_kernel, signature={
            "acc_ptr": "*" + acc, "shift_ptr": "*i32" if shifted else "*fp32", "rflat_ptr": "*i32",
            "a_peel_ptr": "*i16", "alpha_a_ptr": "*i16", "b_peel_ptr": "*i16", "alpha_b_ptr": "*i16",
            "tile_row_ptr": "*i32", "tile_expert_ptr": "*i32", "bounds_ptr": "*i32", "out_ptr": "*i16",
            "n": "i32", "acc_rows": "i32", "BR": "constexpr", "BN": "constexpr", "STEPS": "constexpr",
            "STAGES": "constexpr", "SHIFTED": "constexpr", "RIGHT_ONLY": "constexpr"},
            constexprs={"BR": rows, "BN": shape.cols, "STEPS": shape.steps, "STAGES": shape.stages,
                        "SHIFTED": shifted, "RIGHT_ONLY": right_only}, attrs=ALIGNED(13)),
            target=target, options={"num_warps": shape.warps})
        if not shifted and acc == "fp32":
            print("PEEL-BEGIN")
            print(peeled.asm["ptx"])
            print("PEEL-END")
    # the lagged pass's peel (clean rows, shifted, a programmatic dependent of the GEMM), a plain
    # one, and the lagged pass's polling peel (compact bf16 accumulator, `LAGGED_PEEL_POLLS`)
    for rows, acc, shifted, right_only, after_gemm, poll, tag in (
            (16, "*fp32", True, True, 1, 0, "EXPERTPEEL"), (32, "*fp32", False, False, 0, 0, "EXPERTPEELPLAIN"),
            (16, "*bf16", False, True, 1, 1, "EXPERTPEELPOLL")):
        by_expert = triton.compile(ASTSource(fn=peel._expert_peel_kernel, signature={
            "acc_ptr": acc, "shift_ptr": "*i32" if shifted else acc, "rflat_ptr": "*i32",
            "a_peel_ptr": "*i16", "alpha_a_ptr": "*i16", "b_peel_ptr": "*i16", "alpha_b_ptr": "*i16",
            "bounds_ptr": "*i32", "out_ptr": "*i16", "n": "i32", "acc_rows": "i32", "experts": "i32",
            "first_src_ptr": "*i32", "first_dst_ptr": "*i32", "first_words": "i32", "second_src_ptr": "*i32",
            "second_dst_ptr": "*i32", "second_words": "i32", "done_ptr": "*i32", "gemm_bounds_ptr": "*i32",
            "tile_m": "i32", "gemm_col_tiles": "i32", "BR": "constexpr", "BN": "constexpr", "SHIFTED": "constexpr",
            "RIGHT_ONLY": "constexpr", "AFTER_GEMM": "constexpr", "POLL": "constexpr"},
            constexprs={"BR": rows, "BN": peel._EXPERT_PEEL_COLS, "SHIFTED": shifted, "RIGHT_ONLY": right_only,
                        "AFTER_GEMM": after_gemm, "POLL": poll},
            attrs={**ALIGNED(10), **{(i,): [["tt.divisibility", 16]] for i in (12, 13, 14, 15, 16, 17, 18, 19)}}),
            target=target, options={"num_warps": peel._EXPERT_PEEL_WARPS, "num_stages": 1})
        print(f"{tag}-BEGIN")
        print(by_expert.asm["ptx"])
        print(f"{tag}-END")
    # 64-row blocks (decode, prefill) and 16-row ones (between), codes in token or expert order
    for rows, top_k in ((64, 0), (16, 0), (64, 8)):
        a_peel_kernel = triton.compile(ASTSource(fn=peel._a_peel_kernel, signature={
            "codes_ptr": "*u8", "positions_ptr": "*i32", "beta_ptr": "*i16", "e_ptr": "*u8",
            "f_t_ptr": "*u8", "out_ptr": "*i16", "partial_ptr": "*fp32",
            "counter_ptr": "*i32", "rows": "i32", "k": "i32", "stride": "i32", "k_per_split": "i32",
            "splits": "i32", "BR": "constexpr", "BK": "constexpr", "TOP_K": "constexpr"},
            constexprs={"BR": rows, "BK": 128, "TOP_K": top_k},
            attrs={**ALIGNED(8), **{(i,): [["tt.divisibility", 16]] for i in (9, 10, 11)}}), target=target,
            options={"num_warps": 4, "num_stages": 4})
        if top_k:
            print("APEELFP8-BEGIN")
            print(a_peel_kernel.asm["ptx"])
            print("APEELFP8-END")
    # the peel tails: token rows (1/α beside them, or per Rflat row for a gathering GEMM) and expert order
    for top_k, scale_top_k in ((0, 0), (0, 8), (8, 0)):
        triton.compile(ASTSource(fn=peel._tails_kernel, signature={
            "peel_ptr": "*i16", "alpha_ptr": "*i16", "positions_ptr": "*i32", "scale_positions_ptr": "*i32",
            "padded_ptr": "*i16", "inv_ptr": "*fp32", "rows": "i32", "tail_at": "i32", "stride": "i32",
            "BR": "constexpr", "TOP_K": "constexpr", "SCALE_TOP_K": "constexpr"},
            constexprs={"BR": peel._TAIL_ROWS, "TOP_K": top_k, "SCALE_TOP_K": scale_top_k}, attrs=ALIGNED(6)),
            target=target)
    triton.compile(ASTSource(fn=transcript._forest_kernel, signature={
        "key_ptr": "*i32", **{f"p{i}": "*i32" for i in range(4)}, **{f"w{i}": "i32" for i in range(4)},
        **{f"n{i}": "i32" for i in range(4)}, "g1": "i32", "g2": "i32", "g3": "i32", "b1": "i32", "b2": "i32",
        "b3": "i32", "nodes_ptr": "*i32", "blocks_ptr": "*i32", "roots_ptr": "*i32", "counter_ptr": "*i32",
        "block_counter_ptr": "*i32", "LANES": "constexpr", "LEVELS": "constexpr"},
        constexprs={"LANES": transcript._FOREST_LANES, "LEVELS": transcript._FOREST_LEVELS}),
        target=target, options={"num_warps": transcript._FOREST_LANES // 32})
    for routed in (False, True):
        triton.compile(ASTSource(fn=transcript._launch_keys_kernel, signature={
            "roots_codes_ptr": "*i32", "roots_scales_ptr": "*i32", "hr_ptr": "*i32", "ho_ptr": "*i32",
            "msg_ptr": "*i32", "key_a_offset": "i32", "seed_key_ptr": "*i32", "labels_ptr": "*i32",
            "label_len0": "i32", "label_len1": "i32", "seed_bytes": "i32",
            "out_ptr": "*i32", "lines_ptr": "*u8", "lines": "i32", "address": "i32", "target": "fp32",
            "ROUTED": "constexpr", "LANES": "constexpr"},
            constexprs={"ROUTED": routed, "LANES": transcript._LINE_LANES}),
            target=target, options={"enable_fp_fusion": False, "num_warps": transcript._LINE_LANES // 32})
    # as launched: the folded form at FOLDED_TILES_PER_PROGRAM tiles a program, the accumulator
    # form at TILES_PER_PROGRAM; the PTX kept is the accumulator form's mining one (stored last)
    for folded, store in ((True, True), (True, False), (False, True), (False, False)):
        mined = triton.compile(ASTSource(fn=lottery._lottery_kernel, signature={
            "src_ptr": "*i32" if folded else "*i64", "n": "i32", "tile_row_ptr": "*i32", "tile_expert_ptr": "*i32",
            "tile_local_ptr": "*i32", "num_tiles": "i32", "key_ptr": "*i32", "thr_ptr": "*i32",
            "seed_b_ptr": "*i32", "lock_ptr": "*i32", "record_ptr": "*i32", "fresh_ptr": "*i32",
            "header_ptr": "*i32", "tickets_ptr": "*i32", "BT": "constexpr", "STORE_TICKETS": "constexpr",
            "FOLDED": "constexpr"},
            constexprs={"BT": lottery.FOLDED_TILES_PER_PROGRAM if folded else lottery.TILES_PER_PROGRAM,
                        "STORE_TICKETS": store, "FOLDED": folded}), target=target)
        if folded and not store:
            assert ".local" not in mined.asm["ptx"], "the folded lottery keeps a stack frame"
    print("LOTTERY-BEGIN")
    print(mined.asm["ptx"])
    print("LOTTERY-END")
    triton.compile(ASTSource(fn=lottery._payload_kernel, signature={
        "fresh_ptr": "*i32", "done_ptr": "*i32", **{f"{name}{i}": kind for i in range(4) for name, kind in
                                                    (("src", "*i32"), ("dst", "*i32"), ("n", "i32"))},
        "clear": "i32", "BLOCK": "constexpr"}, constexprs={"BLOCK": lottery._PAYLOAD_BLOCK}), target=target)
    for ids, eb, chunk in (("*i32", 32, 512), ("*i64", 256, 64), ("*i64", 1024, 16)):
        triton.compile(ASTSource(fn=routing._ranked_kernel, signature={
            "ids_ptr": ids, "total": "i32", "experts": "i32", "top_k": "i32", "rflat_ptr": "*i32",
            "bounds_ptr": "*i32", "positions_ptr": "*i32", "EB": "constexpr", "CHUNK": "constexpr",
            "SLICE": "constexpr"},
            constexprs={"EB": eb, "CHUNK": chunk, "SLICE": routing.RANK_SLICE}), target=target,
            options={"num_warps": routing.RANK_WARPS})
    for ids in ("*i32", "*i64"):
        for eb in (32, 1024):
            triton.compile(ASTSource(fn=routing._chunk_counts_kernel, signature={
                "ids_ptr": ids, "total": "i32", "experts": "i32", "counts_ptr": "*i32", "EB": "constexpr",
                "CHUNK": "constexpr", "WB": "constexpr"}, constexprs={"EB": eb, "CHUNK": 128, "WB": 32}),
                target=target)
        triton.compile(ASTSource(fn=routing._chunk_scatter_kernel, signature={
            "ids_ptr": ids, "total": "i32", "experts": "i32", "top_k": "i32", "prefix_ptr": "*i32",
            "bounds_ptr": "*i32", "rflat_ptr": "*i32", "positions_ptr": "*i32", "EB": "constexpr",
            "CHUNK": "constexpr"},
            constexprs={"EB": 32, "CHUNK": 128}), target=target)
    for eb in (2, 32, 1024):
        wb = min(eb, routing._COUNT_EXPERTS)
        triton.compile(ASTSource(fn=routing._chunk_prefix_kernel, signature={
            "counts_ptr": "*i32", "chunks": "i32", "totals_ptr": "*i32", "EB": "constexpr", "WB": "constexpr",
            "TC": "constexpr"}, constexprs={"EB": eb, "WB": wb, "TC": routing._SCAN_CELLS // wb}), target=target)
        triton.compile(ASTSource(fn=routing._bounds_kernel, signature={
            "totals_ptr": "*i32", "experts": "i32", "total": "i32", "bounds_ptr": "*i32", "EB": "constexpr"},
            constexprs={"EB": eb}), target=target)
    for experts in (32, 1024):
        block, eb = routing.map_block(experts)
        triton.compile(ASTSource(fn=routing._tile_map_kernel, signature={
            "ends_ptr": "*i32", "experts": "i32", "tile_rows": "i32", "partial": "i32", "row_start_ptr": "*i32",
            "expert_ptr": "*i32", "local_ptr": "*i32", "slots": "i32", "BLOCK": "constexpr", "EB": "constexpr"},
            constexprs={"BLOCK": block, "EB": eb}), target=target)
    for rows, blocks in (norms_kernel.block_shape(768), (16, 64)):  # k = 6144: one step; k > 8192: passes
        triton.compile(ASTSource(fn=norms_kernel._norms_kernel, signature={
            "codes_ptr": "*i8", "scales_ptr": "*i16", "l2_ptr": "*i16", "linf_ptr": "*i16", "num_rows": "i32",
            "k": "i32", "wl2": "i32", "BR": "constexpr", "BB": "constexpr", "ONE_STEP": "constexpr"},
            constexprs={"BR": rows, "BB": blocks, "ONE_STEP": blocks >= 768}),
            target=target, options={"enable_fp_fusion": False, "num_warps": norms_kernel._warps(rows * blocks)})
    for rows in (64, 8192):  # decode's warps and prefill's
        triton.compile(ASTSource(fn=prequant_kernel._rows_kernel, signature={
            "x_ptr": "*i16", "codes_ptr": "*i8", "scales_ptr": "*i16", "l2_ptr": "*i16", "linf_ptr": "*i16",
            "alpha_ptr": "*i16", "beta_ptr": "*i16", "num_rows": "i32", "k": "i32", "wl2": "i32", "recip_127": "fp32",
            "magic": "fp32", "delta_r": "fp32", "delta_over_std": "fp32", "BB": "constexpr", "STEPS": "constexpr",
            "SP": "constexpr"},
            constexprs={"BB": prequant_kernel.ROW_STEP_BLOCKS, "STEPS": 3, "SP": 4}, attrs=ALIGNED(7)),  # k = 6144
            target=target, options={"enable_fp_fusion": False, "num_warps": prequant_kernel.row_warps(rows)})
    triton.compile(ASTSource(fn=hashing._short_kernel, signature={
        "key_ptr": "*i32", "key_stride": "i32", "msg_ptr": "*i32", "out_ptr": "*i32", "total": "i32",
        "nbytes": "i32", "blocks": "i32", "keyed": "i32", "LANES": "constexpr"}, constexprs={"LANES": 16}),
        target=target)
""")


@pytest.fixture(scope="module")
def compiled() -> str:
    env = dict(os.environ, PEARL_INT7_INTERPRET="0")
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), timeout=600)
    if done.returncode != 0 and "ptxas" in done.stderr and "not found" in done.stderr:
        pytest.skip("Triton's ptxas is not available")
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_window_is_four_zero_initialised_k32_wgmmas_then_an_fp32_add(compiled):
    gemm_ptx = compiled.split("PTX-BEGIN")[1].split("PTX-END")[0]
    wgmma = [line for line in gemm_ptx.splitlines() if "wgmma.mma_async" in line]
    assert len(wgmma) == 4
    assert all("m64n128k32.f32.e4m3.e4m3" in line for line in wgmma)
    scale_d = [line.rsplit(",", 3)[-3].strip() for line in wgmma]
    assert scale_d[0] == "0" and all(s != "0" for s in scale_d[1:])  # a fresh window each 128 k
    adds = re.findall(r"^\s*add(?:\.rn)?\.f32\s", gemm_ptx, flags=re.M)
    assert len(adds) == 64 * 128 // 128  # one promotion add per accumulator register per thread
    assert not re.search(r"^\s*add\.r[zmp]\.f32", gemm_ptx, flags=re.M)


def test_lottery_fold_reads_the_accumulator_in_8_byte_loads(compiled):
    """The fold's pair loads stay 64-bit (or wider) in the PTX: no 32-bit accumulator loads."""
    ptx = compiled.split("LOTTERY-BEGIN")[1].split("LOTTERY-END")[0]
    wide = re.findall(r"ld\.global(?:\.\w+)*\.(?:v[24]\.)?b64", ptx)
    assert len(wide) >= 8  # the 8 (nb) pair loads per lane


def test_noisy_kernel_has_no_contracted_multiply_add(compiled):
    """The FMA emulations (f32 TwoSum, and the f64 one for tiles with inexact f32 products) need
    every product and sum rounded separately; the tile's loads and the code store are 16 bytes."""
    ptx = compiled.split("NOISY-BEGIN")[1].split("NOISY-END")[0]
    assert "mul.rn.f64" in ptx or "mul.f64" in ptx
    assert "add.rn.f32" in ptx or "add.f32" in ptx
    assert not re.search(r"\bfma\.rn\.f(32|64)", ptx)
    loads = re.findall(r"ld\.global[\w.]*", ptx)
    assert not [op for op in loads if op.endswith(".b32") and ".v" not in op]  # noise and X: vectors
    assert re.findall(r"st\.global[\w.]*", ptx) == ["st.global.v4.b32"]


def test_noisy_kernel_forms_the_noise_dot_as_one_fresh_k32_wgmma(compiled):
    """The A side's codes launch: one m64n64k32 e4m3 WGMMA from +0 (scale-d 0, the model's one
    group) then one RNE add to +0 per accumulator register, and no contracted multiply-add."""
    ptx = compiled.split("NOISYDOT-BEGIN")[1].split("NOISYDOT-END")[0]
    wgmma = [line for line in ptx.splitlines() if "wgmma.mma_async" in line]
    assert len(wgmma) == 1 and "m64n64k32.f32.e4m3.e4m3" in wgmma[0]
    assert wgmma[0].rsplit(",", 3)[-3].strip() == "0"
    assert len(re.findall(r"^\s*add\.rn\.f32\s+%r\d+, %r\d+, 0f00000000;", ptx, flags=re.M)) == 64 * 64 // 128
    assert not re.search(r"\bfma\.rn\.f(32|64)", ptx)


def test_codes_launch_opening_the_planes_stays_uncontracted(compiled):
    """The codes launch that opens X from the planes keeps the same fresh noise WGMMA, contracts
    no multiply-add (q · s must round once, as the rows launch's product) and reads the codes as
    bytes, not bf16 values."""
    ptx = compiled.split("NOISYDOTPLANES-BEGIN")[1].split("NOISYDOTPLANES-END")[0]
    wgmma = [line for line in ptx.splitlines() if "wgmma.mma_async" in line]
    assert len(wgmma) == 1 and "m64n64k32.f32.e4m3.e4m3" in wgmma[0]
    assert not re.search(r"\bfma\.rn\.f(32|64)", ptx)
    assert re.search(r"ld\.global[\w.]*\.(?:v\d\.)?b(8|32)", ptx)
    plain = compiled.split("NOISYPLANES-BEGIN")[1].split("NOISYPLANES-END")[0]
    assert not re.search(r"\bfma\.rn\.f(32|64)", plain)


def test_a_peel_fp8_sums_e4m3_windows_on_the_tensor_cores(compiled):
    """The A peel: each 128-k step is four K = 32 e4m3 WGMMAs from zero, then one fp32 add per
    accumulator register (the promotion kept apart from the dot); no TF32 MMA is left, and the
    codes stream into shared memory by cp.async (k, the stride and the split specialised as
    multiples of 16, as a launch at GLM-5's k = 6144 is)."""
    ptx = compiled.split("APEELFP8-BEGIN")[1].split("APEELFP8-END")[0]
    assert re.search(r"cp\.async\.c[ag]\.shared\.global", ptx)
    wgmma = [line for line in ptx.splitlines() if "wgmma.mma_async" in line]
    assert len(wgmma) == 4 and all("k32.f32.e4m3.e4m3" in line for line in wgmma)
    assert wgmma[0].rsplit(",", 3)[-3].strip() == "0"
    assert "tf32" not in ptx


def test_codes_launch_by_the_device_rounds_with_its_instructions(compiled):
    """On CUDA the element op is cvt.rn.bf16.f32 (N, β·N), one fma.rn.bf16 and
    cvt.rn.satfinite.e4m3x2.f32 — no f64 path, no f32 TwoSum — for the A side's launch (noise dot
    inside, planes opened, expert order) and the B side's (N from memory)."""
    for tag in ("NOISYDOTPLANESHW", "NOISYHW"):
        ptx = compiled.split(tag + "-BEGIN")[1].split(tag + "-END")[0]
        assert "fma.rn.bf16" in ptx and "cvt.rn.satfinite.e4m3x2.f32" in ptx and "cvt.rn.bf16.f32" in ptx, tag
        assert not re.search(r"\.f64\b", ptx), tag
        assert not re.search(r"\bfma\.rn\.f32", ptx), tag
    dot = compiled.split("NOISYDOTPLANESHW-BEGIN")[1].split("NOISYDOTPLANESHW-END")[0]
    assert len([line for line in dot.splitlines() if "wgmma.mma_async" in line]) == 1


def test_codes_launch_reads_one_scale_a_block(compiled):
    """Opening X from the planes loads each 8-block's bf16 scale once (a 64 × 64 tile on 128
    threads: 32 values, 4 blocks a thread), not once per value (32 16-bit loads a thread kept the
    L1 at 78 % busy), and the codes as vectors."""
    ptx = compiled.split("NOISYDOTPLANESHW-BEGIN")[1].split("NOISYDOTPLANESHW-END")[0]
    assert len(re.findall(r"ld\.global\.b16\b", ptx)) <= 8
    assert re.search(r"ld\.global\.v[24]\.b32", ptx)


def test_prefill_peel_prefetches_accumulator_tiles(compiled):
    """The prefill peel's step loop copies its 16-byte accumulator and B-peel blocks with
    cp.async (the pipeline), and stores bf16 in 16-byte vectors."""
    ptx = compiled.split("PEEL-BEGIN")[1].split("PEEL-END")[0]
    assert len(re.findall(r"cp\.async\.cg\.shared\.global(?:\.\w+)*\s+\[[^]]+\], \[[^]]+\], 0x10", ptx)) >= 8
    assert re.findall(r"st\.global[\w.]*", ptx) and set(re.findall(r"st\.global[\w.]*", ptx)) == {"st.global.v4.b32"}


def test_decode_peel_dot_chains_from_the_accumulator(compiled):
    """The decode peel (by expert; clean rows, right halves) forms the correction as a chain of
    m16n8k8 TF32 MMAs whose first addend is the accumulator tile (Triton folds `acc + dot` into the
    dot: no separate fp32 add), and stores bf16 in 16-byte vectors."""
    ptx = compiled.split("EXPERTPEEL-BEGIN")[1].split("EXPERTPEEL-END")[0]
    mma = re.findall(r"mma\.sync\.aligned\.m16n8k8\.row\.col\.f32\.tf32\.tf32\.f32", ptx)
    assert mma and len(mma) % 4 == 0 and "wgmma" not in ptx
    assert not re.search(r"\badd(\.rn)?\.f32", ptx) and not re.search(r"\bfma\.rn\.f32", ptx)
    assert set(re.findall(r"st\.global[\w.]*", ptx)) == {"st.global.v4.b32"}


def test_polling_peel_reads_an_expert_after_acquiring_its_tile_count(compiled):
    """The polling peel (`LAGGED_PEEL_POLLS`): an expert's program issues its bounds, Rflat and
    B-peel loads, then acquire-loads its expert's finished-tile count (gpu scope; one thread,
    shared with the rest through shared memory) in a loop, and only then its first accumulator
    (evict-first) load; the copy programs wait for the whole GEMM first, and the grid's last
    program (when it is no copy program) waits for it before it lets the next kernel launch, so
    one program of the grid always holds it open until the GEMM ends."""
    ptx = compiled.split("EXPERTPEELPOLL-BEGIN")[1].split("EXPERTPEELPOLL-END")[0]
    acquire = [m.start() for m in re.finditer(r"ld\.global\.gpu\.acquire\.b32", ptx)]  # Triton's atomic add of 0
    first_acc = ptx.index("evict_first")
    assert len(acquire) == 2 and acquire[-1] < first_acc  # before and inside the spin loop
    before_poll = ptx[:acquire[0]]
    assert len(re.findall(r"ld\.global", before_poll)) >= 4 and "griddepcontrol.wait" not in before_poll
    assert ptx.count("griddepcontrol.wait") == 3  # the count never arrived; the copy programs; the last program
    assert "%nctaid.y" in ptx  # the last program is found by the grid's size
    assert ptx.count("griddepcontrol.launch_dependents") == 1
    assert ptx.rindex("griddepcontrol.wait") < ptx.index("griddepcontrol.launch_dependents")
    assert ptx.rindex("st.global") < ptx.index("griddepcontrol.launch_dependents")


def test_lagged_decode_peel_waits_for_the_gemm_only_before_reading_its_output(compiled):
    """The lagged pass's peel, a programmatic dependent of the GEMM: a peel program issues its
    bounds, Rflat and B-peel loads, then waits for the GEMM, before its first accumulator
    (evict-first) load; a copy program (MINED's take) waits before it loads anything; the plain
    decode peel has no wait. Every program then lets the stream's next kernel launch, once,
    after its last store."""
    ptx = compiled.split("EXPERTPEEL-BEGIN")[1].split("EXPERTPEEL-END")[0]
    plain = compiled.split("EXPERTPEELPLAIN-BEGIN")[1].split("EXPERTPEELPLAIN-END")[0]
    assert ptx.count("griddepcontrol.wait") == 2 and "griddepcontrol" not in plain
    first_acc = ptx.index("evict_first")
    wait = ptx.rindex("griddepcontrol.wait", 0, first_acc)
    peel_wait_block = ptx[ptx.rindex("$L__BB", 0, wait):wait]  # the peel program's block up to its wait
    assert len(re.findall(r"ld\.global", peel_wait_block)) >= 4  # bounds, shift, Rflat, B peel, alpha_B
    copy_wait = [i for i in (ptx.index("griddepcontrol.wait"), ptx.rindex("griddepcontrol.wait")) if i != wait][0]
    copy_block = ptx[ptx.rindex("$L__BB", 0, copy_wait):copy_wait]
    assert "ld.global" not in copy_block
    assert ptx.count("griddepcontrol.launch_dependents") == 1
    assert ptx.rindex("st.global") < ptx.index("griddepcontrol.launch_dependents")
