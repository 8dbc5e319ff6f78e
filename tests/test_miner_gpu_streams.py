"""miner.gpu.streams.SideWork: per-job work on a side stream that the serving stream waits for on
the device (CUDA), a no-op on the CPU."""
import pytest
import torch

from miner.gpu.streams import SideWork


def test_side_work_is_inline_on_the_cpu():
    side = SideWork(torch.device("cpu"))
    with side.run():
        value = torch.arange(4) * 2
    side.ready()
    assert side.stream is None and side.event is None and value.tolist() == [0, 2, 4, 6]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_serving_stream_waits_for_the_side_work_on_the_device():
    device = torch.device("cuda")
    side = SideWork(device)
    source = torch.randn(4096, 4096, device=device)
    with side.run():
        assert torch.cuda.current_stream(device) == side.stream
        prepared = source @ source  # long enough to still be running when the serving stream reads it
    assert side.event is not None
    side.ready()
    assert side.event is None  # waited once; later launches are ordered after
    total = prepared.sum()
    torch.testing.assert_close(total, (source @ source).sum(), rtol=1e-3, atol=1e-1)
