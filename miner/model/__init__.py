"""Small MoE transformers (Qwen3-MoE, Mixtral, DeepSeek-V3 styles) whose FC1 is mined."""
from miner.model.config import ModelConfig, load_config, preset
from miner.model.transformer import MoETransformer
from miner.model.weights import build_model

__all__ = ["ModelConfig", "MoETransformer", "build_model", "load_config", "preset"]
