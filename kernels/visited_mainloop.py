"""quack's 8-bit main loop with a visit of the accumulator after every k-tile: the kernels that
need the running sums during the k loop (the INT7 transcript, int8 Horner digit sums).

quack's main loop for 8-bit operands already waits for each k-tile's WGMMAs before issuing the
next (its promotion path adds a zeroed window into a second accumulator); here the WGMMAs
accumulate straight into the accumulator, and after each k-tile's wait the subclass's
`visit_k_tile` reads or rewrites it before the next k-tile's MMAs. Two consumer warpgroups cover
each other's visits as they cover each other's window adds in the unmined kernel.

This module imports cutlass at import time, like kernels.grouped_gemm_sm90.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Int32, const_expr
from cutlass.cute.nvgpu import warpgroup


class VisitedMainloopMixin:
    """mma: k-tiles with `begin_tile(acc)` before the first and `visit_k_tile(acc, k_tile,
    k_tile_cnt)` after each one's WGMMAs retired and its stage was released."""

    def begin_tile(self, acc: cute.Tensor) -> None:
        """Per output tile, before its k loop (state for the visits)."""

    def visit_k_tile(self, acc: cute.Tensor, k_tile: Int32, k_tile_cnt: Int32) -> None:
        """The accumulator after k-tile `k_tile` (no WGMMA in flight)."""

    @cute.jit
    def mma(self, ab_pipeline, ab_read_state, mma_fn, acc: cute.Tensor, acc_slow, k_tile_cnt: Int32,
            warp_group_idx: Int32):
        self.begin_tile(acc)
        peek = Boolean(True)
        if 0 < k_tile_cnt:
            peek = ab_pipeline.consumer_try_wait(ab_read_state)
        for k_tile in cutlass.range(k_tile_cnt, unroll=1):
            ab_pipeline.consumer_wait(ab_read_state, peek)
            mma_fn(A_idx=ab_read_state.index, B_idx=ab_read_state.index, zero_init=k_tile == 0)
            warpgroup.wait_group(0)
            ab_pipeline.consumer_release(ab_read_state)
            ab_read_state.advance()
            peek = Boolean(True)
            if k_tile + 1 < k_tile_cnt:
                peek = ab_pipeline.consumer_try_wait(ab_read_state)
            self.visit_k_tile(acc, k_tile, k_tile_cnt)
        if const_expr(self.pingpong):
            self.pingpong_barrier_arrive(1 - warp_group_idx, stage="mma")
        return ab_read_state
