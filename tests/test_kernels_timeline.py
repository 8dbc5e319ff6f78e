"""kernels.timeline: the per-kernel summary of a recorded timeline, and a clear refusal without a GPU
(the recording itself runs in the GPU checks: `gpu_check --sections timeline`)."""
import pytest
import torch

from kernels.timeline import KernelSpan, kernel_timeline, summarize, timeline_entry


def test_summary_counts_each_kernel_and_takes_its_median_longest_first():
    spans = [KernelSpan(0.0, 6.8, 7, "front"), KernelSpan(7.1, 284.0, 7, "gemm"), KernelSpan(8.0, 3.0, 9, "lottery"),
             KernelSpan(300.0, 7.2, 7, "front"), KernelSpan(301.0, 283.0, 7, "gemm"), KernelSpan(302.0, 9.0, 9, "lottery"),
             KernelSpan(600.0, 7.0, 7, "front")]
    summary = summarize(spans)
    assert list(summary) == ["gemm", "front", "lottery"]
    assert summary["gemm"] == {"count": 2, "median_us": 283.5}
    assert summary["lottery"] == {"count": 2, "median_us": 6.0}
    assert summary["front"] == {"count": 3, "median_us": 7.0}
    assert summarize([]) == {}


def test_a_reported_timeline_keeps_every_span_in_order_beside_its_summary():
    spans = [KernelSpan(0.0, 6.8, 7, "front"), KernelSpan(7.1, 284.0, 7, "gemm"), KernelSpan(8.0, 3.0, 9, "lottery")]
    entry = timeline_entry(spans)
    assert entry["kernels"] == summarize(spans)
    assert entry["spans (start us, us, stream, name)"] == [[0.0, 6.8, 7, "front"], [7.1, 284.0, 7, "gemm"],
                                                          [8.0, 3.0, 9, "lottery"]]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")
def test_recording_needs_a_gpu():
    with pytest.raises(RuntimeError, match="need a CUDA device"):
        kernel_timeline(lambda: None)
