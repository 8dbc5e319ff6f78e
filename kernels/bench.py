"""`python -m kernels.bench`: the grouped GEMM against its baselines on grouped-gemm-anchors.md
§6 shapes, in one process (CUDA graphs, L2-cold rotation, medians); a table on stdout, JSON out.

Variants (--precisions): bf16, fp8 (scaled, bf16 out), int8 (int32 out) and int8s (int8 with
scales, bf16 out; it runs on the int8 configs and is not swept itself).

Methods per case: ours (the selector's config, or with --autotune the sweep's winner, whose
candidate timings and winners are recorded too), torch.nn.functional.grouped_mm (bf16),
torch._scaled_grouped_mm (fp8, rowwise scales), quack's varlen gemm when importable (default
config; for fp8 it has no scales), a per-expert cuBLAS loop, and a device copy of the weight bytes.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from kernels.grouped_gemm import grouped_gemm, output_dtype
from kernels.grouped_gemm_config import (
    GroupedGemmConfig,
    Precision,
    TunedEntry,
    candidates,
    output_for,
    primary_output,
    regime_for,
    save_tuned,
    schedule_variants,
    select_config,
)
from kernels.routing import Routing, group_sizes, offsets_from_sizes
from kernels.timing import rotation_sets, time_methods

# (model, projection, experts per GPU, K, N) for one EP8 rank (anchors §6).
PROJECTIONS = [
    ("GLM-5", "FC1", 32, 6144, 4096),
    ("GLM-5", "FC2", 32, 2048, 6144),
    ("DeepSeek-V3", "FC1", 32, 7168, 4096),
    ("DeepSeek-V3", "FC2", 32, 2048, 7168),
    ("DeepSeek-V4-Pro", "FC1", 48, 7168, 6144),
    ("DeepSeek-V4-Pro", "FC2", 48, 3072, 7168),
    ("Qwen3-235B", "FC1", 16, 4096, 3072),
    ("Qwen3-235B", "FC2", 16, 1536, 4096),
]
CASES = {"decode": 16, "ridge": 256, "prefill": 2048}
# --precisions names: (operand precision, scaled).
VARIANTS = {"bf16": (Precision.BF16, False), "fp8": (Precision.FP8, True),
            "int8": (Precision.INT8, False), "int8s": (Precision.INT8, True)}
SKEWED = [Routing.PM50, Routing.ZIPF, Routing.HOT]


@dataclass(frozen=True)
class BenchCase:
    model: str
    proj: str
    case: str
    num_experts: int
    tokens_per_expert: int
    k: int
    n: int
    precision: Precision
    scaled: bool
    routing: Routing = Routing.UNIFORM

    @property
    def variant(self) -> str:
        """The --precisions name of (precision, scaled)."""
        return next(name for name, v in VARIANTS.items() if v == (self.precision, self.scaled))

    @property
    def is_primary(self) -> bool:
        """The precision's primary output variant, the one the autotune sweep times."""
        return output_for(self.precision, self.scaled) is primary_output(self.precision)

    @property
    def name(self) -> str:
        tail = "" if self.routing is Routing.UNIFORM else f" {self.routing.value}"
        return (f"{self.model} {self.proj} {self.case} {self.num_experts}x{self.tokens_per_expert}"
                f" {self.k}->{self.n} {self.variant}{tail}")

    @property
    def total_m(self) -> int:
        return self.num_experts * self.tokens_per_expert

    def sizes(self) -> list[int]:
        return group_sizes(self.routing, self.num_experts, self.tokens_per_expert, seed=0)

    def min_bytes(self) -> int:
        """Each input read once, the output written once (scales included when scaled); only
        the experts that received tokens have their weights read."""
        ab = 1 if self.precision is not Precision.BF16 else 2
        out = output_dtype(self.precision, self.scaled).itemsize
        active = sum(1 for s in self.sizes() if s > 0)
        scales = 4 * (self.total_m + active * self.n) if self.scaled else 0
        return (ab * (active * self.n * self.k + self.total_m * self.k)
                + out * self.total_m * self.n + scales)

    def flops(self) -> int:
        return 2 * self.total_m * self.n * self.k


def all_cases(variants: list[str]) -> list[BenchCase]:
    cases = [BenchCase(model, proj, case, e, m, k, n, *VARIANTS[v])
             for v in variants for model, proj, e, k, n in PROJECTIONS
             for case, m in CASES.items()]
    glm_fc1 = PROJECTIONS[0]
    cases += [BenchCase(glm_fc1[0], glm_fc1[1], "decode", glm_fc1[2], 16, glm_fc1[3], glm_fc1[4],
                        *VARIANTS[v], r)
              for v in variants for r in SKEWED]
    return cases


@dataclass
class InputSet:
    x: torch.Tensor
    w: torch.Tensor
    offsets: torch.Tensor
    bounds: list[int]
    out: torch.Tensor
    x_scale: torch.Tensor | None
    w_scale: torch.Tensor | None


def make_inputs(case: BenchCase, sets: int, seed: int = 0) -> list[InputSet]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    offs = offsets_from_sizes(case.sizes())
    result = []
    for _ in range(sets):
        xf = torch.randn(case.total_m, case.k, device="cuda", generator=gen)
        wf = torch.randn(case.num_experts, case.n, case.k, device="cuda", generator=gen)
        if case.precision is Precision.BF16:
            x, w = xf.bfloat16(), wf.bfloat16()
        elif case.precision is Precision.FP8:
            x, w = xf.to(torch.float8_e4m3fn), wf.to(torch.float8_e4m3fn)
        else:
            x = torch.randint(-127, 128, xf.shape, device="cuda", generator=gen, dtype=torch.int8)
            w = torch.randint(-127, 128, wf.shape, device="cuda", generator=gen, dtype=torch.int8)
        xs = ws = None
        if case.scaled:
            xs = torch.rand(case.total_m, device="cuda", generator=gen) + 0.5
            ws = torch.rand(case.num_experts, case.n, device="cuda", generator=gen) * 0.01 + 0.005
        del xf, wf
        out = torch.empty(case.total_m, case.n, device="cuda",
                          dtype=output_dtype(case.precision, case.scaled))
        result.append(InputSet(x, w, torch.from_numpy(offs).cuda(), [int(v) for v in offs], out, xs, ws))
    return result


def _ours(s: InputSet, config: GroupedGemmConfig) -> Callable[[], None]:
    return lambda: grouped_gemm(s.x, s.w, s.offsets, x_scale=s.x_scale, w_scale=s.w_scale,
                                out=s.out, config=config)


def _torch_grouped(s: InputSet) -> Callable[[], None]:
    wt = s.w.transpose(-2, -1)
    ends = s.offsets[1:]  # torch takes the E end offsets, without the leading 0
    if s.x.dtype == torch.bfloat16:
        return lambda: torch.nn.functional.grouped_mm(s.x, wt, offs=ends, out_dtype=torch.bfloat16)
    return lambda: torch._scaled_grouped_mm(s.x, wt, s.x_scale, s.w_scale, offs=ends,
                                            out_dtype=torch.bfloat16)


def _quack(s: InputSet) -> Callable[[], None]:
    from quack.gemm_interface import gemm
    wt = s.w.transpose(-2, -1)
    return lambda: gemm(s.x, wt, out=s.out, cu_seqlens_m=s.offsets, tuned=False)


def _cublas_loop(s: InputSet) -> Callable[[], None]:
    spans = [(e, lo, hi) for e, (lo, hi) in enumerate(zip(s.bounds[:-1], s.bounds[1:])) if hi > lo]
    if s.x.dtype == torch.bfloat16:
        def run() -> None:
            for e, lo, hi in spans:
                torch.matmul(s.x[lo:hi], s.w[e].T, out=s.out[lo:hi])
    else:
        def run() -> None:
            for e, lo, hi in spans:
                torch._scaled_mm(s.x[lo:hi], s.w[e].T, s.x_scale[lo:hi, None],
                                 s.w_scale[e][None, :], out_dtype=torch.bfloat16)
    return run


def _copies(case: BenchCase) -> tuple[dict[str, list[Callable[[], None]]], int]:
    """Device copies of the case's byte count: torch's copy_ (a memcpy node inside a graph) and
    an SM kernel (elementwise negate of int64 words). The faster sets the copy bandwidth."""
    words = -(-case.min_bytes() // 8)
    src = torch.randint(-2**62, 2**62, (words,), dtype=torch.int64, device="cuda")
    dst = torch.empty_like(src)
    return ({"copy": [lambda: dst.copy_(src)], "copy_kernel": [lambda: torch.neg(src, out=dst)]},
            2 * 8 * words)


def _rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    ref64, got64 = ref.double(), got.double()
    return float((got64 - ref64).norm() / ref64.norm().clamp_min(1e-30))


def _sweep(case: BenchCase, sets: list[InputSet], configs: list[GroupedGemmConfig],
           record: dict) -> dict[str, float]:
    """Time configs round-robin; a config that fails to build or run drops out (noted)."""
    timings = time_methods({c.key: [_ours(s, c) for s in sets] for c in configs})
    sweep = {}
    for key, t in timings.items():
        if isinstance(t, Exception):
            record["errors"][f"sweep {key}"] = f"{type(t).__name__}: {t}"[:300]
        else:
            sweep[key] = t.median_us
    return sweep


def run_case(case: BenchCase, autotune: bool, tuned: list[TunedEntry]) -> dict:
    sets = make_inputs(case, rotation_sets(case.min_bytes()))
    record: dict = {**{k: (v.value if hasattr(v, "value") else v) for k, v in asdict(case).items()},
                    "name": case.name, "min_bytes": case.min_bytes(), "flops": case.flops(),
                    "sets": len(sets), "times_us": {}, "errors": {}}
    regime = regime_for(case.total_m, case.num_experts)
    # The sweep runs on each precision's primary variant; int8s reuses the int8 winners.
    if autotune and case.routing is Routing.UNIFORM and case.is_primary:
        sweep = _sweep(case, sets, candidates(case.precision, regime), record)
        if sweep:
            best = GroupedGemmConfig.from_key(min(sweep, key=sweep.get))
            sweep.update(_sweep(case, sets, [best] + schedule_variants(best), record))
            record["sweep_us"] = {k: round(v, 2) for k, v in sweep.items()}
            winner = min(sweep, key=sweep.get)
            tuned.append(TunedEntry(case.precision, regime, case.tokens_per_expert, case.n, case.k,
                                    GroupedGemmConfig.from_key(winner), sweep[winner]))
    config = select_config(case.precision, case.total_m, case.num_experts, case.n, case.k,
                           tuned=tuned or None)
    record["config"] = config.key
    methods: dict[str, list[Callable[[], None]]] = {"ours": [_ours(s, config) for s in sets]}
    if case.precision is not Precision.INT8:
        methods["torch"] = [_torch_grouped(s) for s in sets]
        methods["quack"] = [_quack(s) for s in sets]
        methods["cublas_loop"] = [_cublas_loop(s) for s in sets]
    copy_calls, copy_bytes = _copies(case)
    methods.update(copy_calls)
    for name, t in time_methods(methods).items():
        if isinstance(t, Exception):
            record["errors"][name] = f"{type(t).__name__}: {t}"[:300]
        else:
            record["times_us"][name] = round(t.median_us, 2)
            record.setdefault("graph", {})[name] = t.graph
    times = record["times_us"]
    copy_us = min((times[c] for c in copy_calls if c in times), default=None)
    if copy_us:
        record["copy_gbps"] = round(copy_bytes / copy_us / 1e3, 1)
    if "ours" in times:
        record["ours_gbps"] = round(case.min_bytes() / times["ours"] / 1e3, 1)
        record["ours_tflops"] = round(case.flops() / times["ours"] / 1e6, 1)
        s = sets[0]
        ours = grouped_gemm(s.x, s.w, s.offsets, x_scale=s.x_scale, w_scale=s.w_scale, config=config)
        if "torch" in times:
            record["rel_err_vs_torch"] = _rel_err(ours, _torch_grouped(s)())
    return record


def _fmt(v: float | None) -> str:
    return f"{v:9.1f}" if v is not None else "        -"


def print_table(records: list[dict]) -> None:
    cols = ["ours", "torch", "quack", "cublas_loop", "copy", "copy_kernel"]
    print(f"{'case':58s} {'config':22s}" + "".join(f"{c:>10s}" for c in cols)
          + "  ours%copy  x torch  x quack")
    for r in records:
        t = r["times_us"]
        bw = (r["ours_gbps"] / r["copy_gbps"] * 100) if "ours_gbps" in r and "copy_gbps" in r else None
        vs = {c: (t[c] / t["ours"]) if c in t and "ours" in t else None for c in ("torch", "quack")}
        print(f"{r['name']:58s} {r.get('config', '-'):22s}" + "".join(f" {_fmt(t.get(c))}" for c in cols)
              + f"  {_fmt(bw)} {_fmt(vs['torch'])} {_fmt(vs['quack'])}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precisions", default="bf16,fp8,int8",
                    help=f"comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--only", default="", help="substring filter on case names")
    ap.add_argument("--autotune", action="store_true", help="sweep candidates, record winners")
    ap.add_argument("--tuned-out", type=Path, help="where to write the winners (JSON)")
    ap.add_argument("--json", type=Path, help="where to write all results (JSON)")
    args = ap.parse_args(argv)
    variants = [v for v in args.precisions.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        ap.error(f"unknown --precisions {unknown}; choose from {', '.join(VARIANTS)}")
    if not torch.cuda.is_available():
        print("kernels.bench needs a CUDA GPU", file=sys.stderr)
        return 2
    cases = [c for c in all_cases(variants) if args.only in c.name]
    # int8 (both outputs) is timed on decode and prefill shapes, ours only
    cases = [c for c in cases if c.precision is not Precision.INT8 or c.case != "ridge"]
    tuned: list[TunedEntry] = []
    records = []
    for case in cases:
        rec = run_case(case, args.autotune, tuned)
        records.append(rec)
        print_table([rec])
        if args.json:
            args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                             "torch": torch.__version__, "records": records},
                                            indent=1))
    print()
    print_table(records)
    if args.tuned_out and tuned:
        save_tuned(tuned, args.tuned_out, torch.cuda.get_device_name())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
