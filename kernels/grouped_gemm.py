"""`grouped_gemm`: the MoE expert GEMM, out[rows of expert e] = x[rows of e] @ w[e]^T.

Host side: argument checks, config selection, and the launch of the sm_90a kernel from
`kernels.grouped_gemm_sm90` (imported on first launch, so `import kernels` stays CUDA-free).

No host synchronisation: the per-expert row offsets stay on the device and are read by the
kernel's persistent tile scheduler, so a launch can be captured in a CUDA graph and replayed with
new routings written into the same offsets tensor.
"""
from __future__ import annotations

import dataclasses
import functools

import torch

from kernels.grouped_gemm_config import (
    GroupedGemmConfig,
    Output,
    Precision,
    output_for,
    select_config,
)

# TMA needs 16-byte aligned row strides: K and N elements per row.
_ALIGN_BYTES = 16
# Most shared memory a shared-SM launch leaves to other kernels: the GEMM keeps >= 2 stages.
_MAX_SIDE_SMEM = 128 * 1024


class GroupedGemmError(ValueError):
    """Bad arguments to grouped_gemm (names the argument and what is wrong)."""


def precision_of(x: torch.Tensor) -> Precision:
    if x.dtype == torch.bfloat16:
        return Precision.BF16
    if x.dtype == torch.float8_e4m3fn:
        return Precision.FP8
    if x.dtype == torch.int8:
        return Precision.INT8
    raise GroupedGemmError(f"x.dtype must be bfloat16, float8_e4m3fn or int8, got {x.dtype}")


_TORCH_DTYPES = {Output.BF16: torch.bfloat16, Output.INT32: torch.int32, Output.FP32: torch.float32}


def output_dtype(precision: Precision, scaled: bool) -> torch.dtype:
    """The output dtype of a launch of this precision with or without scales."""
    return _TORCH_DTYPES[output_for(precision, scaled)]


def _output(precision: Precision, x_scale: torch.Tensor | None,
            w_scale: torch.Tensor | None) -> Output:
    """The variant the scales select (both: scaled bf16; neither: the precision's plain output)."""
    if (x_scale is None) != (w_scale is None):
        given = "x_scale" if x_scale is not None else "w_scale"
        raise GroupedGemmError(f"{given} given alone: x_scale (total_M,) and w_scale (E, N) go "
                               "together (scaled bf16 out) or are both left out")
    try:
        return output_for(precision, scaled=x_scale is not None)
    except ValueError as exc:
        raise GroupedGemmError(f"scales apply to fp8 and int8 only: {exc}") from None


def tma_rows(t: torch.Tensor) -> bool:
    """Whether TMA can read t's rows in place: K innermost and every other stride a multiple of
    16 bytes (a contiguous tensor, or rows with room after them, as the FP8 mining operands)."""
    return t.stride(-1) == 1 and all(stride * t.element_size() % 16 == 0 for stride in t.stride()[:-1])


def tma_operand(t: torch.Tensor) -> torch.Tensor:
    """t itself where `tma_rows`, else a contiguous copy."""
    return t if tma_rows(t) else t.contiguous()


def _check(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, x_scale: torch.Tensor | None,
           w_scale: torch.Tensor | None, out: torch.Tensor | None) -> tuple[Precision, Output]:
    precision = precision_of(x)
    if w.dtype != x.dtype:
        raise GroupedGemmError(f"w.dtype {w.dtype} must equal x.dtype {x.dtype}")
    if x.dim() != 2 or w.dim() != 3:
        raise GroupedGemmError(f"x must be (total_M, K) and w (E, N, K); got {tuple(x.shape)}, "
                               f"{tuple(w.shape)}")
    num_experts, n, k = w.shape
    if x.shape[1] != k:
        raise GroupedGemmError(f"x has K={x.shape[1]} but w has K={k}")
    if k == 0:
        raise GroupedGemmError("K must be positive")
    output = _output(precision, x_scale, w_scale)
    out_dtype = _TORCH_DTYPES[output]
    if (k * x.element_size()) % _ALIGN_BYTES or (n * out_dtype.itemsize) % _ALIGN_BYTES:
        raise GroupedGemmError(f"K={k} and N={n} rows must be multiples of {_ALIGN_BYTES} bytes")
    if not (tma_rows(x) and tma_rows(w)):
        raise GroupedGemmError("x and w must be row-major with K innermost and 16-byte aligned row strides")
    if offsets.dtype != torch.int32 or offsets.shape != (num_experts + 1,):
        raise GroupedGemmError(f"offsets must be int32 of shape ({num_experts + 1},), got "
                               f"{offsets.dtype} {tuple(offsets.shape)}")
    devices = {x.device, w.device, offsets.device}
    if x_scale is not None:
        if x_scale.dtype != torch.float32 or x_scale.shape != (x.shape[0],):
            raise GroupedGemmError(f"x_scale must be float32 ({x.shape[0]},), got "
                                   f"{x_scale.dtype} {tuple(x_scale.shape)}")
        if w_scale.dtype != torch.float32 or w_scale.shape != (num_experts, n):
            raise GroupedGemmError(f"w_scale must be float32 ({num_experts}, {n}), got "
                                   f"{w_scale.dtype} {tuple(w_scale.shape)}")
        if not (x_scale.is_contiguous() and w_scale.is_contiguous()):
            raise GroupedGemmError("x_scale and w_scale must be contiguous")
        devices |= {x_scale.device, w_scale.device}
    if out is not None:
        if out.dtype != out_dtype or out.shape != (x.shape[0], n):
            scales = "with" if x_scale is not None else "without"
            raise GroupedGemmError(f"out must be {out_dtype} ({x.shape[0]}, {n}) for {precision.value} "
                                   f"{scales} scales, got {out.dtype} {tuple(out.shape)}")
        if not out.is_contiguous():
            raise GroupedGemmError("out must be contiguous")
        devices.add(out.device)
    if len(devices) != 1 or next(iter(devices)).type != "cuda":
        raise GroupedGemmError(f"all tensors must be on one CUDA device, got {sorted(map(str, devices))}")
    return precision, output


@functools.lru_cache(maxsize=None)
def _max_active_clusters(cluster_size: int, device_index: int) -> int:
    from quack.cute_dsl_utils import get_max_active_clusters
    return get_max_active_clusters(cluster_size, device_capacity=(9, 0), device_id=device_index)


def launch(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, out: torch.Tensor,
           config: GroupedGemmConfig, x_scale: torch.Tensor | None = None,
           w_scale: torch.Tensor | None = None, max_sms: int | None = None, side_smem: int = 0) -> None:
    """Launch one compiled variant on the current stream; arguments are assumed checked (the
    variant follows from x's dtype and the scales, as in `grouped_gemm`). max_sms caps the
    persistent grid (a runtime argument: no recompile); side_smem is compiled in."""
    from quack.gemm_default_epi import GemmDefaultEpiMixin

    from kernels.grouped_gemm_sm90 import compile_grouped_gemm

    precision = precision_of(x)
    fn = compile_grouped_gemm(precision, config, output_for(precision, x_scale is not None), side_smem)
    epi_args = GemmDefaultEpiMixin.EpilogueArguments(
        alpha=None, beta=None, mRowVecBroadcast=w_scale, mColVecBroadcast=x_scale,
        add_to_output=None, rounding_mode=None, sr_seed=None)
    launch_variant(fn, x, w, offsets, out, config, epi_args, max_sms)


def shared_config(config: GroupedGemmConfig, side_smem: int) -> GroupedGemmConfig:
    """The config a launch runs: with side_smem > 0 (an SM shared with other streams' kernels,
    which takes one consumer warpgroup) a pingpong config's cooperative twin, else itself."""
    return dataclasses.replace(config, pingpong=False) if side_smem and config.pingpong else config


def persistent_ctas(config: GroupedGemmConfig, device_index: int, max_sms: int | None = None) -> int:
    """CTAs of the persistent grid launch_variant starts: as many whole clusters as fit the
    device at once, at most max_sms SMs' worth (never fewer than one cluster)."""
    cluster_size = config.cluster_m * config.cluster_n
    clusters = _max_active_clusters(cluster_size, device_index)
    if max_sms is not None:
        clusters = max(1, min(clusters, max_sms // cluster_size))
    return clusters * cluster_size


def launch_variant(fn, x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, out: torch.Tensor | None,
                   config: GroupedGemmConfig, epi_args, max_sms: int | None = None,
                   a_idx: torch.Tensor | None = None, c: torch.Tensor | None = None,
                   tile_counter: torch.Tensor | None = None) -> None:
    """Launch compiled kernel `fn` (any epilogue) with its epilogue arguments on the current
    stream, the persistent grid on at most max_sms SMs (whole clusters); a_idx (out's rows,)
    int32: the row of x each output row reads, for a variant compiled with `gather`; c: the C
    operand (out's shape) of a variant compiled with a `c_dtype`; tile_counter (1,) int32, zero
    when the kernel starts (the caller's to reset: the kernel leaves it at its tile count), for
    a variant compiled `dynamic`; out None for a variant compiled without D (`store_d`)."""
    from quack.gemm_tvm_ffi_utils import make_scheduler_args, make_varlen_args

    if tile_counter is not None and (tile_counter.dtype != torch.int32 or tuple(tile_counter.shape) != (1,)
                                     or tile_counter.device != x.device):
        raise ValueError(f"tile_counter must be int32 (1,) on {x.device}, got {tile_counter.dtype} "
                         f"{tuple(tile_counter.shape)} on {tile_counter.device}")
    clusters = persistent_ctas(config, x.device.index or 0, max_sms) // (config.cluster_m * config.cluster_n)
    fn(x, w, out, c, epi_args, make_scheduler_args(clusters, config.swizzle, tile_counter),
       make_varlen_args(offsets, None, a_idx), None, None)


def grouped_gemm(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, *,
                 x_scale: torch.Tensor | None = None, w_scale: torch.Tensor | None = None,
                 out: torch.Tensor | None = None,
                 config: GroupedGemmConfig | None = None,
                 max_sms: int | None = None, side_smem: int = 0) -> torch.Tensor:
    """Grouped GEMM over experts on an sm_90a GPU.

    x: (total_M, K) rows sorted by expert; w: (E, N, K); offsets: (E+1,) int32 on the device,
    offsets[0] = 0, non-decreasing, offsets[E] = total_M (not checked: that would sync).
    The scales select the output (x_scale (total_M,) and w_scale (E, N) fp32 come together):

    - bf16 -> bf16 (no scales);
    - fp8 e4m3 with scales -> bf16, out = (x @ w^T) * x_scale[:, None] * w_scale[e];
    - fp8 e4m3 without scales -> float32: the raw accumulator, summed in 128-k promotion windows
      exactly as the Hopper model (`proof.fp8.fp8_matmul("hopper", ...)`) does, a zero as +0;
      the FP8 mining pass hashes these values;
    - int8 without scales -> int32, exact;
    - int8 with scales -> bf16, out = float32(exact int32 x @ w^T) * x_scale[row] * w_scale[e, col].

    out: optional preallocated output of that dtype, (total_M, N), filled and returned.
    config: a fixed variant; by default the selector picks by shape (the output does not matter).
    max_sms: run the persistent grid on at most this many SMs (whole clusters), leaving the rest
    to concurrent kernels on other streams (the lagged mining passes' side work at decode, where
    the GEMM is memory-bound); None uses every SM.
    side_smem: > 0 builds a variant that shares every SM with kernels of other streams (half
    the registers and this many bytes of shared memory left to them; `max_sms` gives them
    whole SMs instead); cooperative configs only, so a pingpong config is swapped for its
    cooperative twin.
    """
    if max_sms is not None and max_sms < 1:
        raise GroupedGemmError(f"max_sms must be a positive SM count, got {max_sms}")
    if not 0 <= side_smem <= _MAX_SIDE_SMEM or side_smem % 1024:
        raise GroupedGemmError(f"side_smem must be a multiple of 1024 bytes in [0, {_MAX_SIDE_SMEM}], got {side_smem}")
    precision, output = _check(x, w, offsets, x_scale, w_scale, out)
    total_m = x.shape[0]
    num_experts, n, k = w.shape
    if out is None:
        out = torch.empty((total_m, n), dtype=_TORCH_DTYPES[output], device=x.device)
    if total_m == 0:
        return out
    if config is None:
        config = select_config(precision, total_m, num_experts, n, k)
    launch(x, w, offsets, out, shared_config(config, side_smem), x_scale, w_scale, max_sms, side_smem)
    return out
