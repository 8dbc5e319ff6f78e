"""GPU check of the codes launch rounding with the device's own instructions
(`noisy_kernel._by_device`: cvt.rn.bf16.f32, fma.rn.bf16, cvt.rn.satfinite.e4m3x2.f32;
skipped without a GPU): on every bf16 X, with α, β and noise at the edges, its codes are the
reference's and the emulation's (NaN codes up to their sign); the A side's launch form (noise
dot inside, planes opened, expert order, peel tails) writes the emulation's codes bit for bit."""
import numpy as np
import pytest
import torch

from proof.fp8 import bf16 as ref_bf16
from proof.fp8 import quantization as ref_quant
from test_fp8mine_stages import _noisy_case, bf16_tensor, same_e4m3

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _both(monkeypatch, launch):
    """The launch's codes (uint8, on the host) by the emulation and by the device's instructions."""
    from kernels.fp8mine import noisy_kernel
    out = []
    for hardware in (False, True):
        monkeypatch.setattr(noisy_kernel, "_by_device", lambda x, on=hardware: on and x.is_cuda)
        out.append(launch().view(torch.uint8).cpu().numpy())
    return out


def test_every_bf16_x_rounds_as_the_reference(monkeypatch) -> None:
    from kernels.fp8mine import noisy_kernel
    rng = np.random.default_rng(6)
    x = np.arange(0x10000, dtype=np.uint16).reshape(64, 1024)
    noise_f32 = rng.standard_normal((64, 1024)).astype(np.float32) * 3000
    noise_f32[0, :5] = [np.nan, np.inf, -np.inf, 0.0, -0.0]
    noise_f32[1, :4] = [1e-40, -1e-40, 3.4e38, 2.0 ** -133]  # f32 subnormals, the top of the range
    noise = torch.from_numpy(noise_f32).cuda()
    unit = (np.full(64, 0x3F80, dtype=np.uint16), np.zeros(64, dtype=np.uint16))
    drawn = (rng.choice([0x3F80, 0x4000, 0x3E00, 0x4315, 0x0001, 0x7F00, 0x0080], 64).astype(np.uint16),
             rng.choice([0x0000, 0x3B95, 0x3000, 0x8001, 0x6000, 0x0001], 64).astype(np.uint16))
    for alpha, beta in (unit, drawn):
        want = ref_quant._noisy_codes(alpha[:, None], beta[:, None], x, ref_bf16.f32_to_bf16(noise_f32))
        emulated, by_device = _both(monkeypatch, lambda: noisy_kernel.noisy_codes(
            bf16_tensor(alpha).cuda(), bf16_tensor(beta).cuda(), bf16_tensor(x).cuda(), noise))
        assert same_e4m3(emulated, want) and same_e4m3(by_device, want)
        assert same_e4m3(by_device, emulated)


def test_a_side_launch_writes_the_emulations_codes(monkeypatch) -> None:
    from kernels.fp8mine import noisy_kernel, routing
    from kernels.fp8mine.peel import TAIL_BYTES
    rows, k, top_k, experts = 300, 1024, 4, 8
    rng, rows_in, (e_t, f_t), _ = _noisy_case(31, rows, k, 60)
    planes = noisy_kernel.Planes(rows_in.codes.cuda(), rows_in.scales.cuda())
    topk = np.stack([rng.permutation(experts)[:top_k] for _ in range(rows)])
    positions = routing.routing_table(torch.from_numpy(topk).cuda(), experts).positions
    for x in (rows_in.values.cuda(), planes):
        emulated, by_device = _both(monkeypatch, lambda: noisy_kernel.noisy_codes_of_lines(
            rows_in.alpha.cuda(), rows_in.beta.cuda(), x, e_t.cuda(), f_t.cuda(), positions, TAIL_BYTES))
        assert np.array_equal(by_device, emulated)
