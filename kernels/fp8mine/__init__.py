"""FP8 V4 mining on Hopper: the A side per launch, the B side per job, the windowed FP8 GEMM,
the lottery and the peel, as device-side torch/Triton code that also runs (bit-exactly) on the
CPU backend. See docs/kernels-fp8mine.md."""
