"""Configurations of the grouped GEMM, the candidate sets per regime, and the selector.

Pure Python (no torch, no CUDA): the selector runs on the host before every launch and the
CPU compile checks enumerate `selectable_configs()`.

Regimes (grouped-gemm-anchors.md §5): below ~220 tokens per expert a grouped GEMM on the H200
is memory-bound, so decode configurations use 64-row tiles (one WGMMA row block, little waste at
m=16) and let the kernel fill shared memory with as many TMA stages as fit (8+ at 64x128x64 bf16),
which keeps >= 32 KB per SM in flight. Prefill configurations use 128/256-row tiles and 2-CTA
clusters so B tiles are multicast to both M tiles of a cluster.

Configs are chosen by precision and shape only: the output variants of one precision (int8 ->
s32 or scaled bf16; fp8 -> scaled bf16 or the raw fp32 accumulator) share a mainloop and differ
in the epilogue alone.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

TUNED_CONFIGS_PATH = Path(__file__).with_name("tuned_configs.json")

# Average tokens per expert at or below which a launch counts as decode (memory-bound).
DECODE_MAX_TOKENS_PER_EXPERT = 128

# The FP8 promotion window: a fresh WGMMA accumulator every 128 k, added into the fp32 total.
FP8_PROMOTION_WINDOW_K = 128


class Precision(str, Enum):
    """Operand type of one grouped GEMM; it alone picks the configs (see `Output`)."""

    BF16 = "bf16"  # bf16 x bf16 -> bf16
    FP8 = "fp8"  # e4m3 x e4m3 -> scaled bf16, or the raw fp32 accumulator
    INT8 = "int8"  # s8 x s8 -> exact s32, or scaled bf16


class Output(str, Enum):
    """What the epilogue writes; it follows from the precision and whether scales are given."""

    BF16 = "bf16"  # bf16 in; or 8-bit in times x_scale[row] * w_scale[e, col]
    INT32 = "int32"  # int8 in, no scales: the exact s32 accumulator
    FP32 = "fp32"  # fp8 in, no scales: the raw window-promoted fp32 accumulator (mining)


# (precision, scaled) -> output; bf16 takes no scales.
_OUTPUTS = {
    (Precision.BF16, False): Output.BF16,
    (Precision.FP8, True): Output.BF16,
    (Precision.FP8, False): Output.FP32,
    (Precision.INT8, True): Output.BF16,
    (Precision.INT8, False): Output.INT32,
}


def output_for(precision: Precision, scaled: bool) -> Output:
    """The output of a launch with (scaled) or without per-token x per-channel scales."""
    try:
        return _OUTPUTS[(precision, scaled)]
    except KeyError:
        raise ValueError(f"{precision.value} takes no scales") from None


def is_scaled(precision: Precision, output: Output) -> bool:
    """Whether the (precision, output) variant multiplies by scales in its epilogue."""
    return output is Output.BF16 and precision is not Precision.BF16


def primary_output(precision: Precision) -> Output:
    """Each precision's first variant (bf16 -> bf16, fp8 scaled -> bf16, int8 -> int32): the one
    the autotune sweep times; the other variant of the same precision reuses its configs."""
    return output_for(precision, precision is Precision.FP8)


class Regime(str, Enum):
    DECODE = "decode"
    PREFILL = "prefill"


@dataclass(frozen=True)
class GroupedGemmConfig:
    """One compiled variant: CTA tile, cluster shape, warpgroup schedule and tile order.

    tile_k is the k extent of one pipeline stage; for fp8 and int8 it must be 128 so that a
    stage is exactly one promotion window (the mining transcript replays that accumulation).
    The persistent scheduler walks tiles in groups of `swizzle` clusters along N (along M with
    raster_along_m) in a serpentine, for L2 reuse; swizzle is a launch argument, the raster
    direction a compile-time one.
    """

    tile_m: int
    tile_n: int
    tile_k: int
    cluster_m: int = 1
    cluster_n: int = 1
    pingpong: bool = False
    swizzle: int = 8
    raster_along_m: bool = False

    def __post_init__(self) -> None:
        if self.tile_m not in (64, 128, 192, 256):
            raise ValueError(f"tile_m must be 64/128/192/256, got {self.tile_m}")
        if self.tile_n % 16 or not 16 <= self.tile_n <= 256:
            raise ValueError(f"tile_n must be a multiple of 16 in [16, 256], got {self.tile_n}")
        if self.tile_k not in (64, 128):
            raise ValueError(f"tile_k must be 64 or 128, got {self.tile_k}")
        if self.cluster_m * self.cluster_n not in (1, 2, 4):
            raise ValueError(f"cluster {self.cluster_m}x{self.cluster_n} must hold 1, 2 or 4 CTAs")
        if self.pingpong and self.tile_m not in (64, 128):
            raise ValueError("pingpong needs tile_m 64 or 128 (one warpgroup per tile)")
        if self.swizzle not in (1, 2, 4, 8, 16):
            raise ValueError(f"swizzle must be 1, 2, 4, 8 or 16, got {self.swizzle}")

    @property
    def key(self) -> str:
        """A stable text name, used in the tuned-configs JSON and in benchmark tables."""
        sched = "pp" if self.pingpong else "coop"
        extra = (f"_s{self.swizzle}" if self.swizzle != 8 else "") + ("_rm" if self.raster_along_m else "")
        return (f"{self.tile_m}x{self.tile_n}x{self.tile_k}"
                f"_c{self.cluster_m}x{self.cluster_n}_{sched}{extra}")

    @classmethod
    def from_key(cls, key: str) -> "GroupedGemmConfig":
        try:
            tile, cluster, sched, *extra = key.split("_")
            tm, tn, tk = (int(v) for v in tile.split("x"))
            cm, cn = (int(v) for v in cluster[1:].split("x"))
            swizzle = int(extra.pop(0)[1:]) if extra and extra[0].startswith("s") else 8
        except ValueError as exc:
            raise ValueError(f"malformed grouped GEMM config key {key!r}") from exc
        if sched not in ("pp", "coop") or not cluster.startswith("c") or extra not in ([], ["rm"]):
            raise ValueError(f"malformed grouped GEMM config key {key!r}")
        return cls(tm, tn, tk, cm, cn, sched == "pp", swizzle, extra == ["rm"])


def default_tile_k(precision: Precision) -> int:
    """bf16 stages carry 64 k (128 B rows, the 128B swizzle); 8-bit stages one 128-k window."""
    return 64 if precision is Precision.BF16 else FP8_PROMOTION_WINDOW_K


# (tile_m, tile_n, cluster_m, cluster_n, pingpong)
_SHAPES = {
    (Precision.BF16, Regime.DECODE): [
        (64, 128, 1, 2, False), (64, 128, 1, 1, False), (64, 256, 1, 1, False),
        (64, 192, 1, 1, False), (64, 128, 1, 1, True), (64, 256, 1, 1, True)],
    (Precision.BF16, Regime.PREFILL): [
        (128, 256, 2, 1, False), (128, 256, 1, 1, False), (128, 256, 1, 2, False),
        (128, 224, 2, 1, False), (256, 192, 1, 1, False), (128, 192, 2, 1, True),
        (128, 208, 2, 1, True)],
    # 8-bit promotion keeps two fp32 accumulators (window + total) per warpgroup: a warpgroup
    # tile above 64x192 spills them to local memory (seen in SASS, 4x slower on the H200), so
    # the 8-bit tiles are cooperative 64/128-row tiles or 64-row pingpong tiles.
    (Precision.FP8, Regime.DECODE): [
        (64, 128, 1, 1, True), (64, 128, 1, 1, False), (64, 192, 1, 1, False),
        (64, 128, 1, 2, False), (64, 160, 1, 1, False)],
    (Precision.FP8, Regime.PREFILL): [
        (128, 128, 2, 1, False), (128, 192, 2, 1, False), (128, 128, 1, 1, False),
        (128, 160, 2, 1, False), (128, 128, 1, 2, False), (64, 192, 1, 1, True)],
}
_SHAPES[(Precision.INT8, Regime.DECODE)] = _SHAPES[(Precision.FP8, Regime.DECODE)]
_SHAPES[(Precision.INT8, Regime.PREFILL)] = _SHAPES[(Precision.FP8, Regime.PREFILL)]


# Tile orders tried on the best tile: (swizzle, raster_along_m); the default is (8, False).
_SCHEDULES = [(1, False), (4, False), (16, False), (8, True)]


def candidates(precision: Precision, regime: Regime) -> list[GroupedGemmConfig]:
    """The autotune sweep's tile shapes for one precision and regime; the first is the default."""
    tk = default_tile_k(precision)
    return [GroupedGemmConfig(m, n, tk, cm, cn, pp) for m, n, cm, cn, pp in _SHAPES[(precision, regime)]]


def schedule_variants(config: GroupedGemmConfig) -> list[GroupedGemmConfig]:
    """The sweep's second stage: other tile orders for the best tile shape."""
    return [dataclasses.replace(config, swizzle=sw, raster_along_m=rm) for sw, rm in _SCHEDULES]


def default_config(precision: Precision, regime: Regime) -> GroupedGemmConfig:
    """What the selector returns when no tuned winner is recorded for a shape."""
    return candidates(precision, regime)[0]


def regime_for(total_m: int, num_experts: int) -> Regime:
    """Decode when the average expert sees few enough tokens to be memory-bound."""
    if num_experts <= 0:
        raise ValueError(f"num_experts must be positive, got {num_experts}")
    return Regime.DECODE if total_m <= DECODE_MAX_TOKENS_PER_EXPERT * num_experts else Regime.PREFILL


@dataclass(frozen=True)
class TunedEntry:
    """One autotune winner: the best config measured for (precision, tokens per expert, n, k)."""

    precision: Precision
    regime: Regime
    tokens_per_expert: int
    n: int
    k: int
    config: GroupedGemmConfig
    time_us: float

    def to_json(self) -> dict:
        return {"precision": self.precision.value, "regime": self.regime.value,
                "tokens_per_expert": self.tokens_per_expert, "n": self.n,
                "k": self.k, "config": self.config.key, "time_us": round(self.time_us, 2)}

    @classmethod
    def from_json(cls, d: dict) -> "TunedEntry":
        return cls(Precision(d["precision"]), Regime(d["regime"]), int(d["tokens_per_expert"]),
                   int(d["n"]), int(d["k"]),
                   GroupedGemmConfig.from_key(d["config"]), float(d["time_us"]))


def load_tuned(path: Path = TUNED_CONFIGS_PATH) -> list[TunedEntry]:
    """Read recorded winners; a missing file means no tuning has been recorded yet."""
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    return [TunedEntry.from_json(e) for e in data.get("entries", [])]


def save_tuned(entries: list[TunedEntry], path: Path, device: str) -> None:
    data = {"device": device, "entries": [e.to_json() for e in entries]}
    path.write_text(json.dumps(data, indent=1) + "\n")


_TUNED_CACHE: dict[Path, list[TunedEntry]] = {}


def _tuned(path: Path) -> list[TunedEntry]:
    if path not in _TUNED_CACHE:
        _TUNED_CACHE[path] = load_tuned(path)
    return _TUNED_CACHE[path]


def select_config(precision: Precision, total_m: int, num_experts: int, n: int, k: int,
                  tuned: list[TunedEntry] | None = None) -> GroupedGemmConfig:
    """Pick a config by shape: the recorded winner nearest in (tokens per expert, n, k)
    (log-distance) among those of the same precision and regime, else the regime default."""
    regime = regime_for(total_m, num_experts)
    entries = _tuned(TUNED_CONFIGS_PATH) if tuned is None else tuned
    same = [e for e in entries if e.precision is precision and e.regime is regime]
    if not same:
        return default_config(precision, regime)
    m = max(total_m / num_experts, 1.0)
    best = min(same, key=lambda e: abs(math.log(max(e.tokens_per_expert, 1) / m))
               + abs(math.log(e.n / n)) + abs(math.log(e.k / k)))
    return best.config


def selectable_configs() -> dict[Precision, list[GroupedGemmConfig]]:
    """Every config the selector can return (defaults plus recorded winners), per precision;
    the CPU compile checks build each of them once."""
    out: dict[Precision, list[GroupedGemmConfig]] = {}
    for p in Precision:
        found = [default_config(p, r) for r in Regime]
        found += [e.config for e in _tuned(TUNED_CONFIGS_PATH) if e.precision is p]
        out[p] = list(dict.fromkeys(found))
    return out
