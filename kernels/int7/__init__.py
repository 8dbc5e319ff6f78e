"""INT7 (certificates V1–V3) mining on the device: commitments, seeds, noise, the mined GEMM with
its transcript and winners, and the peel. See docs/kernels-int7.md."""
