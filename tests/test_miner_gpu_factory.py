"""miner.gpu's factory (which backend mines a layer, kept across jobs) and the backends' refusals
of bad setups, before any kernel runs."""
import pytest
import torch

from miner.gpu import FP8_DENSE, backend_factory, factory_for, worker_factory
from miner.gpu.fp8 import GpuFp8Backend
from miner.gpu.fp8 import lagged_applies as fp8_lagged_applies
from miner.gpu.int7 import GpuInt7Backend
from miner.gpu.int7 import lagged_applies as int7_lagged_applies
from miner.jobs import MiningJob
from miner.model import preset
from miner.modes import Mode
from miner.worker import cpu_backend
from proof.chain import BlockHeader

HEADER = BlockHeader(1, b"\x11" * 32, b"\x22" * 32, 1_700_000_000, 0x1E010000).incomplete_bytes()


class _Layer:
    def __init__(self, experts: int = 4, top_k: int = 2, hidden: int = 2048, n_e: int = 32) -> None:
        self.layer_id = 1
        self.cfg = preset("qwen3_moe", hidden_size=hidden, num_experts=experts, top_k=top_k, expert_intermediate=n_e)


@pytest.mark.parametrize("mode,cls,name", [(Mode.INT7_DENSE, GpuInt7Backend, "gpu-int7-dense"),
                                           ("int7-moe", GpuInt7Backend, "gpu-int7-moe"),
                                           (Mode.FP8_MOE, GpuFp8Backend, "gpu-fp8-moe")])
def test_backend_factory_picks_the_pipeline_of_the_mode(mode, cls, name):
    backend = backend_factory(mode, _Layer(), "cpu")
    assert isinstance(backend, cls) and backend.name == name and backend.layer_id == 1


def test_fp8_dense_is_the_one_expert_case():
    backend = backend_factory(FP8_DENSE, _Layer(experts=1, top_k=1), "cpu")
    assert backend.name == "gpu-fp8-dense" and backend.experts == 1
    with pytest.raises(ValueError, match="one-expert"):
        backend_factory(FP8_DENSE, _Layer(), "cpu")
    with pytest.raises(NotImplementedError, match="off"):
        backend_factory(Mode.OFF, _Layer(), "cpu")


def test_worker_factory_keeps_one_backend_per_mode_and_layer():
    make = worker_factory("cpu")
    cfg = _Layer().cfg
    first = make(Mode.INT7_DENSE, 0, cfg)
    assert make(Mode.INT7_DENSE, 0, cfg) is first
    assert make(Mode.INT7_DENSE, 1, cfg) is not first
    assert make(Mode.INT7_MOE, 0, cfg) is not first
    assert factory_for("cpu") is cpu_backend
    assert factory_for(torch.device("cuda", 0)) is not cpu_backend


def test_backends_refuse_bad_setups_before_any_kernel():
    w13 = torch.zeros(4, 64, 2048)
    with pytest.raises(ValueError, match="int7-moe or int7-dense"):
        GpuInt7Backend(Mode.FP8_MOE, 0, 4, 2)
    int7 = GpuInt7Backend(Mode.INT7_DENSE, 0, 4, 2)
    job = MiningJob.of(HEADER, 1, 3)
    with pytest.raises(RuntimeError, match="prepare_job"):
        int7.mine_launch(torch.zeros(4, 2048), torch.zeros(4, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="8 experts"):
        int7.prepare_job(job, torch.zeros(8, 64, 2048))
    with pytest.raises(ValueError, match="16·r"):  # k = 1024 is below 16 · rank 128
        int7.prepare_job(job, torch.zeros(4, 64, 1024))
    with pytest.raises(ValueError, match="multiple of 16"):
        int7.prepare_job(job, torch.zeros(4, 40, 2048))
    fp8 = GpuFp8Backend(0, 4, 2)
    with pytest.raises(ValueError, match="cert V4"):
        fp8.prepare_job(job, w13)
    with pytest.raises(ValueError, match="ancestor"):
        fp8.prepare_job(MiningJob.of(HEADER, 1, 4), w13)
    v4 = MiningJob.of(HEADER, 1, 4, (bytes(108),))
    with pytest.raises(ValueError, match="multiple of 64"):
        fp8.prepare_job(v4, torch.zeros(4, 96, 2048))
    with pytest.raises(RuntimeError, match="prepare_job"):
        fp8.mine_launch(torch.zeros(4, 2048), torch.zeros(4, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="top_k"):
        GpuFp8Backend(0, 1, 2)


def test_lagged_decode_knob_reaches_the_backends():
    assert backend_factory(Mode.INT7_DENSE, _Layer(), "cpu").lagged_decode
    assert not backend_factory(Mode.INT7_DENSE, _Layer(), "cpu", lagged_decode=False).lagged_decode
    assert not backend_factory(Mode.FP8_MOE, _Layer(), "cpu", lagged_decode=False).lagged_decode
    assert not worker_factory("cpu", lagged_decode=False)(Mode.FP8_MOE, 0, _Layer().cfg).lagged_decode
    assert worker_factory("cpu")(Mode.INT7_MOE, 0, _Layer().cfg).lagged_decode


_GLM5_FC1 = (32, 4096, 6144)  # 805 MB of int8 weights a launch: the GEMM hides the side chain
_QWEN3_FC1 = (16, 3072, 4096)  # 192 MiB: the split side chain (~41 µs) ends inside a 62 µs GEMM
_QWEN3_FC2 = (16, 4096, 1536)  # 96 MiB: not measured, stays same-launch


@pytest.mark.parametrize("moe,rows,shape,lagged", [(False, 16, _GLM5_FC1, True), (False, 64, _GLM5_FC1, True),
                                                   (False, 128, _GLM5_FC1, False),  # prefill: same-launch
                                                   (False, 48, _GLM5_FC1, False),  # no fused A side at M 48
                                                   (False, 16, _QWEN3_FC1, True),
                                                   (False, 16, _QWEN3_FC2, False),  # too few weight bytes
                                                   (True, 16, _GLM5_FC1, False)])  # MoE: the pipeline refuses lagged
def test_int7_lags_dense_decode_shapes_only(moe, rows, shape, lagged):
    assert int7_lagged_applies(moe, rows, shape) == lagged


@pytest.mark.parametrize("tokens,top_k,experts,lagged", [(16, 8, 256, True), (1024, 8, 256, True),
                                                         (1025, 8, 256, False),  # 33 rows per expert
                                                         (32, 1, 1, True), (33, 1, 1, False),
                                                         (2048, 8, 256, False)])  # prefill
def test_fp8_lags_launches_of_at_most_32_rows_per_expert(tokens, top_k, experts, lagged):
    assert fp8_lagged_applies(tokens, top_k, experts) == lagged
