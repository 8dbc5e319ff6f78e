"""Epilogue arguments of the mining GEMMs that store each lottery tile's 16 words from the
epilogue: the FP8 fold (kernels.fp8mine.fold_epilogue: folded lanes) and the INT7 transcript
(kernels.int7.transcript_gemm: transcript words). Both need the same two tensors beside quack's
default epilogue arguments: the experts' row bounds (E + 1,) and the int32 words buffer
(tile rows, column tiles, 16).

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
class TileWordsArguments(NamedTuple):
    """quack's default epilogue arguments (all unused here), the row bounds and the words."""

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


_TILE_WORD_FIELDS = ("lottery_bounds", "lottery_lanes")


class TileWordsParamsMixin:
    """A GemmSm90 kernel class whose epilogue params carry `TileWordsArguments`' two tensors."""

    EpilogueArguments = TileWordsArguments
    _extra_param_fields = GemmDefaultEpiMixin._extra_param_fields + tuple(
        (name, Optional[cute.Tensor], None) for name in _TILE_WORD_FIELDS)

    def epi_to_underlying_arguments(self, args, *, loc=None, ip=None):
        self.rounding_mode = args.rounding_mode
        d = self._epi_ops_to_params_dict(args)
        d["split_k_semaphore"] = d["split_k_workspace"] = None
        d.update({name: getattr(args, name) for name in _TILE_WORD_FIELDS})
        return self.EpilogueParams(**d)


def fake_tile_words_arguments(m, n, num_experts) -> TileWordsArguments:
    """Compile-time stand-ins (symbolic sizes) for `compile_variant`."""
    return TileWordsArguments(
        lottery_bounds=make_fake_tensor(Int32, (cute.sym_int(),), leading_dim=0),
        lottery_lanes=make_fake_tensor(Int32, (cute.sym_int(), cute.sym_int(), 16), leading_dim=2))


def tile_words_arguments(bounds, words) -> TileWordsArguments:
    """Launch-time arguments: compile-time fields travel as None."""
    return TileWordsArguments(add_to_output=None, rounding_mode=None, lottery_bounds=bounds, lottery_lanes=words)
