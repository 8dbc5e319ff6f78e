"""miner.gpu.h200_check end to end on the CPU (--cpu-smoke): the worker mines accepted devnet
blocks through the GPU backends (Triton's interpreter), then measures tokens/s unmined vs mined
against the quiet devnet; the JSON and the markdown table are written. Slow (minutes)."""
import json

import pytest

from miner.gpu import h200_check


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_cpu_smoke_mines_accepted_blocks_and_measures(tmp_path):
    assert h200_check.main(["--out", str(tmp_path), "--cpu-smoke", "--phases", "mainnet@100000"]) == 0
    data = json.loads((tmp_path / "h200_check.json").read_text())
    (phase,) = data["phases"]
    assert phase.get("errors") is None, phase.get("tracebacks")
    assert phase["modes"] == ["int7-dense"]
    assert phase["mining_stats"]["accepted"] >= 1 and phase["mining_stats"]["verify_failed"] == 0
    bench = phase["bench"]
    assert bench["mode"] == "int7-dense" and bench["mined_launches"] >= 1
    assert bench["overall"]["unmined"] > 0 and bench["overall"]["mined"] > 0
    assert any(row["mined_ms"] for row in bench["launch_times"])  # the prefill size (unmined: one launch, warm-up)
    table = (tmp_path / "h200_check.md").read_text()
    assert "| mainnet@100000 | int7-dense |" in table and "mined / unmined" in table
    assert "mainnet@100000: phase done" in (tmp_path / "h200_check.log").read_text()


def test_markdown_reports_partial_results():
    data = {"meta": {"device": "X"}, "errors": ["late: skipped"],
            "phases": [{"profile": "regtest-fp8", "modes": ["fp8-moe"], "first_block_s": 2.5,
                        "mining_stats": {"accepted": 2, "submitted": 2, "rejected": 0, "winners": 9,
                                         "verify_failed": 0, "mining_errors": 0},
                        "bench": {"mode": "fp8-moe",
                                  "decode": {"unmined": 100.0, "mined": 95.0, "ratio": 0.95},
                                  "launch_times": [{"tokens": 16.0, "unmined_ms": 0.2, "mined_ms": 0.25}]},
                        "errors": ["benchmark: RuntimeError: boom"]}]}
    text = h200_check.markdown(data)
    assert "| regtest-fp8 | fp8-moe | 2 | 2 | 0 | 9 | 0 | 0 | 2.5 |" in text
    assert "| regtest-fp8 | fp8-moe | decode | 100.0 | 95.0 | 0.950 |" in text
    assert "- regtest-fp8: benchmark: RuntimeError: boom" in text and "- late: skipped" in text
    assert "| regtest-fp8 | 16 | 0.200 | 0.250 | 1.250 |" in text


def test_a_cuda_run_needs_a_device(tmp_path, monkeypatch):
    monkeypatch.setattr(h200_check.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        h200_check.main(["--out", str(tmp_path)])
