"""Epilogue arguments of the mining GEMMs, whose epilogues store each lottery tile's 16 words and
may peel: the FP8 fold (kernels.fp8mine.fold_epilogue: folded lanes), the FP8 fold + peel
(kernels.fp8mine.peel_epilogue) and the INT7 transcript (kernels.int7.transcript_gemm: transcript
words). Beside quack's default epilogue arguments they take the experts' row bounds (E + 1,), the
int32 words buffer (tile rows, column tiles, 16); the peel's unscale uses quack's two vectors (its
operands ride the GEMM's own TMA ring). A field left None is absent from the compiled kernel, so
one argument type serves every variant.

This module imports cutlass and quack at import time, like kernels.grouped_gemm_sm90.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from quack.compile_utils import make_fake_tensor
from quack.cute_dsl_utils import mlir_namedtuple
from quack.gemm_default_epi import GemmDefaultEpiMixin


@mlir_namedtuple
class MiningEpilogueArguments(NamedTuple):
    """quack's default epilogue arguments (the peel uses the two scale vectors), then the row
    bounds and the words, then where a compact store puts its rows."""

    alpha: Optional[Float32 | cute.Tensor] = None
    beta: Optional[Float32 | cute.Tensor] = None
    mRowVecBroadcast: Optional[cute.Tensor] = None
    mColVecBroadcast: Optional[cute.Tensor] = None
    add_to_output: cutlass.Constexpr[bool] = False
    rounding_mode: cutlass.Constexpr[int] = 0
    sr_seed: Optional[Int32 | cute.Tensor] = None
    split_k_semaphore: Optional[cute.Tensor] = None
    split_k_workspace: Optional[cute.Tensor] = None
    mSFD: Optional[cute.Tensor] = None
    sfd_norm_const: Optional[Float32 | cute.Tensor] = None
    mSFDCol: Optional[cute.Tensor] = None
    lottery_bounds: Optional[cute.Tensor] = None
    lottery_lanes: Optional[cute.Tensor] = None
    # the lagged fold GEMM that stores only its clean rows, compact (kernels.fp8mine.fold_epilogue)
    compact_bounds: Optional[cute.Tensor] = None
    compact_out: Optional[cute.Tensor] = None
    # ... and counts each expert's finished tiles, for a peel that polls them
    expert_done: Optional[cute.Tensor] = None


_MINING_FIELDS = ("lottery_bounds", "lottery_lanes", "compact_bounds", "compact_out", "expert_done")


class MiningParamsMixin:
    """A GemmSm90 kernel class whose epilogue params carry `MiningEpilogueArguments`' tensors."""

    EpilogueArguments = MiningEpilogueArguments
    _extra_param_fields = GemmDefaultEpiMixin._extra_param_fields + tuple(
        (name, Optional[cute.Tensor], None) for name in _MINING_FIELDS)

    def epi_to_underlying_arguments(self, args, *, loc=None, ip=None):
        self.rounding_mode = args.rounding_mode
        d = self._epi_ops_to_params_dict(args)
        d["split_k_semaphore"] = d["split_k_workspace"] = None
        d.update({name: getattr(args, name) for name in _MINING_FIELDS})
        return self.EpilogueParams(**d)


def fake_tile_words_arguments(m, n, num_experts) -> MiningEpilogueArguments:
    """Compile-time stand-ins (symbolic sizes) of the row bounds and the words, for `compile_variant`."""
    return MiningEpilogueArguments(
        lottery_bounds=make_fake_tensor(Int32, (cute.sym_int(),), leading_dim=0),
        lottery_lanes=make_fake_tensor(Int32, (cute.sym_int(), cute.sym_int(), 16), leading_dim=2))


def fake_unscale_arguments(m, n, num_experts) -> MiningEpilogueArguments:
    """`fake_tile_words_arguments` plus the unscale's vectors: 1/α_B per column (E, n) and 1/α_A
    per row (m,)."""
    return fake_tile_words_arguments(m, n, num_experts)._replace(
        mRowVecBroadcast=make_fake_tensor(Float32, (num_experts, n), leading_dim=1, divisibility=4),
        mColVecBroadcast=make_fake_tensor(Float32, (m,), leading_dim=0, divisibility=4))


def mining_arguments(bounds, words, **vectors) -> MiningEpilogueArguments:
    """Launch-time arguments (compile-time fields travel as None); `vectors`: the unscale's
    mRowVecBroadcast and mColVecBroadcast, or the compact store's compact_bounds and compact_out
    (and its expert_done counters)."""
    return MiningEpilogueArguments(add_to_output=None, rounding_mode=None, lottery_bounds=bounds,
                                   lottery_lanes=words, **vectors)
