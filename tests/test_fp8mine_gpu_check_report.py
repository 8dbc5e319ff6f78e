"""The FP8 GPU check's switch variants on the CPU (no kernel runs): a variant that cannot be
built or launched is reported under its own label, the variants that work are kept, and the
switch is restored either way, so one failing variant of a short device run does not take the
default pass's numbers of its shape with it."""
import torch

from kernels.fp8mine import gpu_check, pipeline


class _FakePass:
    """Stands in for MinedGemm: fails at its first launch when built with the polling peel."""

    def __init__(self, weights, *, m, top_k, layer_id, lagged):
        self.m, self.top_k, self.polls, self.jobs = m, top_k, pipeline.LAGGED_PEEL_POLLS, []

    def set_job(self, header, ancestors, target):
        self.jobs.append(target)

    def forward(self, x, topk):
        if self.polls:
            raise RuntimeError("the polling peel failed")


def test_a_failing_variant_is_reported_and_the_others_kept(monkeypatch):
    monkeypatch.setattr(gpu_check, "MinedGemm", _FakePass)
    lag = _FakePass(None, m=64, top_k=8, layer_id=1, lagged=True)
    before = {switch: getattr(pipeline, switch) for switch in gpu_check.LAGGED_SWITCHES}
    variants, errors = gpu_check._lagged_variants(lag, torch.zeros(1), torch.zeros(2), None, b"h" * 76)
    polls = f"LAGGED_PEEL_POLLS={not before['LAGGED_PEEL_POLLS']}"
    compact = f"LAGGED_COMPACT_ACC={not before['LAGGED_COMPACT_ACC']}"
    assert not before["LAGGED_PEEL_POLLS"]  # the polling form is the variant, so it is the one that fails
    assert list(errors) == [polls] and "the polling peel failed" in errors[polls]
    assert list(variants) == [compact] and variants[compact].jobs == [0]
    assert {switch: getattr(pipeline, switch) for switch in gpu_check.LAGGED_SWITCHES} == before
