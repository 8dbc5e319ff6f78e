"""Model configurations: the three MoE styles the worker serves, small by default.

A config is either a named preset (``qwen3_moe``, ``mixtral``, ``deepseek_v3``) or a Hugging
Face style ``config.json`` whose keys are mapped onto :class:`ModelConfig`. Nothing is downloaded.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STYLES = ("qwen3_moe", "mixtral", "deepseek_v3")


@dataclass(frozen=True)
class ModelConfig:
    """Shape and routing of a decoder-only MoE transformer.

    ``hidden_size`` is the common dimension k of the mined expert GEMM (FC1, gate and up fused):
    the protocols need k >= 1024 (FP8) and 16 * rank <= k (INT7, rank 128 -> k >= 2048), so the
    default is 2048. ``expert_intermediate`` is n_e; FC1 has 2 * n_e output columns per expert.
    """

    style: str = "qwen3_moe"
    vocab_size: int = 4096
    hidden_size: int = 2048
    num_layers: int = 2
    num_heads: int = 16
    num_kv_heads: int = 4
    head_dim: int = 128
    num_experts: int = 8
    top_k: int = 2
    expert_intermediate: int = 128
    shared_experts: int = 0
    norm_topk_prob: bool = True
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    rms_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_seq_len: int = 512

    def __post_init__(self) -> None:
        if self.style not in STYLES:
            raise ValueError(f"model style {self.style!r} is not one of {STYLES}")
        positive = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                    "head_dim", "num_experts", "top_k", "expert_intermediate", "max_seq_len")
        for name in positive:
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"model config {name} must be positive, got {getattr(self, name)}")
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k {self.top_k} exceeds num_experts {self.num_experts}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        if self.num_experts % self.n_group or self.topk_group > self.n_group:
            raise ValueError("num_experts must split into n_group groups and topk_group <= n_group")


_PRESETS: dict[str, dict[str, Any]] = {
    "qwen3_moe": dict(style="qwen3_moe", norm_topk_prob=True),
    "mixtral": dict(style="mixtral", norm_topk_prob=True, num_kv_heads=8),
    "deepseek_v3": dict(style="deepseek_v3", shared_experts=1, n_group=4, topk_group=2,
                        routed_scaling_factor=2.5, norm_topk_prob=True),
}

# Hugging Face config keys -> ours (several families name the same thing differently).
_HF_KEYS = {
    "vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_heads", "num_key_value_heads": "num_kv_heads",
    "head_dim": "head_dim", "num_experts": "num_experts", "num_local_experts": "num_experts",
    "n_routed_experts": "num_experts", "num_experts_per_tok": "top_k",
    "moe_intermediate_size": "expert_intermediate", "n_shared_experts": "shared_experts",
    "norm_topk_prob": "norm_topk_prob", "n_group": "n_group", "topk_group": "topk_group",
    "routed_scaling_factor": "routed_scaling_factor", "rms_norm_eps": "rms_eps",
    "rope_theta": "rope_theta", "max_position_embeddings": "max_seq_len",
}
_HF_STYLE = {"qwen3_moe": "qwen3_moe", "mixtral": "mixtral", "deepseek_v3": "deepseek_v3"}


def preset(style: str, **overrides: Any) -> ModelConfig:
    """The small default model of one style, with optional field overrides."""
    if style not in _PRESETS:
        raise ValueError(f"unknown model preset {style!r}; choose one of {STYLES}")
    return ModelConfig(**{**_PRESETS[style], **overrides})


def from_hf_dict(data: dict[str, Any]) -> ModelConfig:
    """Map a Hugging Face style config dict onto a ModelConfig (unknown keys are ignored)."""
    model_type = data.get("model_type", data.get("style"))
    if model_type not in _HF_STYLE:
        raise ValueError(f"config model_type {model_type!r} is not one of {sorted(_HF_STYLE)}")
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    values: dict[str, Any] = dict(_PRESETS[_HF_STYLE[model_type]])
    for key, value in data.items():
        name = _HF_KEYS.get(key, key if key in fields else None)
        if name is not None and name != "style" and value is not None:
            values[name] = value
    if "head_dim" not in data and "hidden_size" in data:
        values["head_dim"] = int(values["hidden_size"]) // int(values.get("num_heads", 16))
    if model_type == "mixtral" and "intermediate_size" in data and "moe_intermediate_size" not in data:
        values["expert_intermediate"] = data["intermediate_size"]
    return ModelConfig(**values)


def load_config(spec: str) -> ModelConfig:
    """A preset name or the path of a JSON config file."""
    if spec in _PRESETS:
        return preset(spec)
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"model {spec!r} is neither a preset {STYLES} nor a config file")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"model config {path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"model config {path} must hold a JSON object")
    return from_hf_dict(data)
