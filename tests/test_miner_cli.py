"""`pearl-moe run` as users start it: the embedded devnet, a prompts file, clean exit and errors."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from miner import cli

ROOT = Path(__file__).resolve().parents[1]
TINY = {"model_type": "mixtral", "hidden_size": 2048, "num_hidden_layers": 1, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 512, "num_local_experts": 8,
        "intermediate_size": 128, "max_position_embeddings": 256}


def test_run_with_the_embedded_devnet_mines_a_block_and_exits(tmp_path) -> None:
    (tmp_path / "tiny.json").write_text(json.dumps(TINY))
    (tmp_path / "prompts.txt").write_text("The quick brown fox jumps over the lazy dog, " * 2 + "\n"
                                          "Pearl mines inside the expert GEMMs.\n")
    proc = subprocess.run(
        [sys.executable, "-m", "miner.cli", "run", "--model", str(tmp_path / "tiny.json"),
         "--prompts", str(tmp_path / "prompts.txt"), "--batch-size", "8", "--max-new-tokens", "2",
         "--control", "127.0.0.1:0", "--metrics-port", "0", "--progress-interval", "1"],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "embedded devnet (regtest)" in out and "mixtral model" in out and "metrics on http://127.0.0.1:" in out
    assert "mode: int7-moe" in out and "accepted: block for job" in out
    # at least the one block asked for; a winner of the next job sent before the first block was
    # seen may be accepted too, and the final line counts what the chain took (docs/miner.md)
    accepted = int(re.search(r"accepted=(\d+)", out[out.index("done after"):]).group(1))
    assert accepted >= 1 and out.count("accepted: block for job") == accepted
    assert not (tmp_path / "pearl-moe-data").exists()  # the embedded run keeps its data in a temp dir


def test_run_argument_errors_are_named(tmp_path, capsys) -> None:
    assert cli.main(["run", "--gateway", "tcp://127.0.0.1:1", "--data-dir", str(tmp_path)]) == 2
    assert "--network is required" in capsys.readouterr().err
    assert cli.main(["run", "--model", "no-such-model", "--data-dir", str(tmp_path)]) == 2
    assert "neither a preset" in capsys.readouterr().err
    assert cli.main(["run", "--gateway", "tcp://127.0.0.1:1", "--network", "no-such-net",
                     "--data-dir", str(tmp_path)]) == 2
    assert "unknown network 'no-such-net'" in capsys.readouterr().err


def test_bad_run_settings_are_refused_before_anything_starts(tmp_path, capsys) -> None:
    """Each is a one-line error and exit status 2, and no devnet or worker was started for it."""
    (tmp_path / "empty.txt").write_text("\n  \n")
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9\n")
    cases = {
        ("--prompts", str(tmp_path / "missing.txt")): "cannot read the prompt file",
        ("--prompts", str(tmp_path / "empty.txt")): "holds no prompts",
        ("--prompts", str(tmp_path / "latin1.txt")): "cannot read the prompt file",
        ("--device", "gpu"): "is not a torch device",
        ("--device", "mps"): "runs on cuda or cpu",
        ("--prompt-len", "0"): "prompt_len must be positive",
        ("--batch-size", "-3"): "batch_size must be positive",
        ("--max-new-tokens", "512"): "leaves no room for a prompt",
        ("--min-mining-tokens", "-1"): "min_mining_tokens must be 0 or more",
        ("--max-blocks", "0"): "max_blocks must be positive",
        ("--duration", "-5"): "duration_s must be positive",
        ("--weights", str(tmp_path / "none.safetensors")): "does not exist",
    }
    for args, message in cases.items():
        assert cli.main(["run", *args, "--data-dir", str(tmp_path / "data")]) == 2, args
        err = capsys.readouterr()
        assert message in err.err and "Traceback" not in err.err, (args, err.err)
        assert "embedded devnet" not in err.out, args
    assert not (tmp_path / "data" / "devnet").exists()
    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", "--mode", "bogus"])
    assert exit_.value.code == 2 and "invalid choice: 'bogus'" in capsys.readouterr().err


def test_a_cuda_device_without_cuda_is_named() -> None:
    from miner.model import load_config
    from miner.worker import WorkerConfig

    config = WorkerConfig(model=load_config("qwen3_moe"), network="regtest", data_dir=Path("unused"),
                          device="cuda:0")
    if torch.cuda.is_available():
        config.device = f"cuda:{torch.cuda.device_count()}"
        with pytest.raises(ValueError, match="CUDA device\\(s\\) here"):
            config.check()
    else:
        with pytest.raises(ValueError, match="no usable CUDA device"):
            config.check()


def test_ports_out_of_range_are_argument_errors(capsys) -> None:
    for command, flag, value in (("devnet", "--rpc-port", "-5"), ("devnet", "--gateway-port", "70000"),
                                 ("devnet", "--rpc-port", "x"), ("run", "--metrics-port", "99999")):
        with pytest.raises(SystemExit) as exit_:
            cli.main([command, flag, value])
        assert exit_.value.code == 2 and f"argument {flag}" in capsys.readouterr().err


def test_devnet_subcommand_is_the_node_clients_cli(tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "miner.cli", "devnet", "--datadir", str(tmp_path / "chain"), "--rpc-port", "0",
         "--gateway-port", "0", "--mine", "1", "--exit-after-mining"],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "accepted, height 1" in proc.stdout


def test_cpu_devices_mine_with_the_reference_backends() -> None:
    from miner.runner import backend_factory
    from miner.worker import cpu_backend

    assert backend_factory("cpu") is cpu_backend
