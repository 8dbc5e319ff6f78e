"""Build a model from its config, with local weights when given (safetensors or torch file).

Weights use this package's parameter names (``model.state_dict()`` keys); without a file the
weights are random (seeded), so a model is always available and nothing is downloaded.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

from miner.model.config import ModelConfig
from miner.model.transformer import MoETransformer

_SAFETENSORS_DTYPES = {
    "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
    "I64": torch.int64, "I32": torch.int32, "I8": torch.int8, "U8": torch.uint8,
}


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Parse a .safetensors file (8-byte LE header length, JSON header, raw tensor bytes)."""
    raw = path.read_bytes()
    if len(raw) < 8:
        raise ValueError(f"{path}: too short to be a safetensors file")
    (header_len,) = struct.unpack_from("<Q", raw, 0)
    if 8 + header_len > len(raw):
        raise ValueError(f"{path}: header length {header_len} runs past the end of the file")
    try:
        header = json.loads(raw[8:8 + header_len])
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: safetensors header is not JSON: {exc}") from exc
    body = memoryview(raw)[8 + header_len:]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _SAFETENSORS_DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {info.get('dtype')!r}")
        start, end = info["data_offsets"]
        if not 0 <= start <= end <= len(body):
            raise ValueError(f"{path}: tensor {name} offsets {start}..{end} are out of range")
        flat = torch.frombuffer(bytearray(body[start:end]), dtype=dtype) if end > start \
            else torch.empty(0, dtype=dtype)
        tensors[name] = flat.reshape(info["shape"])
    return tensors


def check_weights_file(path: Path) -> None:
    """A weights path that is a file (checked before the worker starts, and again at load)."""
    if not path.is_file():
        raise ValueError(f"weights file {path} does not exist")


def load_state(path: Path) -> dict[str, torch.Tensor]:
    check_weights_file(path)
    if path.suffix == ".safetensors":
        return read_safetensors(path)
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise ValueError(f"{path}: expected a state dict, found {type(state).__name__}")
    return state


def build_model(cfg: ModelConfig, weights: Path | None = None, seed: int = 0) -> MoETransformer:
    """The model in eval mode: local weights if ``weights`` is given, seeded random otherwise."""
    torch.manual_seed(seed)
    model = MoETransformer(cfg)
    if weights is not None:
        state = load_state(weights)
        own = model.state_dict()
        missing = sorted(set(own) - set(state))
        unexpected = sorted(set(state) - set(own))
        if missing or unexpected:
            raise ValueError(f"{weights}: missing {missing[:5]} unexpected {unexpected[:5]}")
        for name, tensor in state.items():
            if tuple(tensor.shape) != tuple(own[name].shape):
                raise ValueError(f"{weights}: {name} has shape {tuple(tensor.shape)}, "
                                 f"the config needs {tuple(own[name].shape)}")
        model.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()})
    return model.eval()
