"""The committed generated gRPC code is what grpc_tools makes from miner/proto/control.proto."""
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GENERATED = ("control_pb2.py", "control_pb2_grpc.py")


def test_committed_generated_code_is_current(tmp_path) -> None:
    protoc = pytest.importorskip("grpc_tools.protoc")
    (tmp_path / "miner" / "proto").mkdir(parents=True)
    shutil.copy(ROOT / "miner" / "proto" / "control.proto", tmp_path / "miner" / "proto")
    rc = protoc.main(["protoc", f"-I{tmp_path}", f"--python_out={tmp_path}", f"--grpc_python_out={tmp_path}",
                      str(tmp_path / "miner" / "proto" / "control.proto")])
    assert rc == 0
    for name in GENERATED:
        fresh = (tmp_path / "miner" / "proto" / name).read_text()
        assert fresh == (ROOT / "miner" / "proto" / name).read_text(), f"{name} is stale: regenerate it"
