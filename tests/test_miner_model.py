"""The served models: three styles, config mapping, weights loading, routing, KV-cache decoding."""
import json
import struct

import pytest
import torch

from miner.generation import Generator, byte_tokens, generated_prompts
from miner.model import build_model, load_config, preset
from miner.model.config import ModelConfig, from_hf_dict
from miner.model.layers import KVCache
from miner.model.moe import Router, grouped_fc1
from miner.model.weights import read_safetensors

SMALL = dict(hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=64, vocab_size=512,
             num_experts=8, expert_intermediate=64, max_seq_len=128)


def small(style: str) -> ModelConfig:
    return preset(style, **SMALL)


@pytest.mark.parametrize("style", ["qwen3_moe", "mixtral", "deepseek_v3"])
def test_each_style_runs_a_forward_pass(style: str) -> None:
    model = build_model(small(style))
    tokens = torch.randint(1, 512, (2, 12))
    logits = model(tokens, torch.arange(12).expand(2, 12), torch.ones(2, 12, dtype=torch.bool),
                   KVCache(model.cfg.num_layers))
    assert logits.shape == (2, 512)
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("style", ["qwen3_moe", "deepseek_v3"])
def test_incremental_decode_matches_full_recompute(style: str) -> None:
    model = build_model(small(style), seed=3)
    seq = torch.randint(1, 512, (1, 10))
    full = model(seq, torch.arange(10)[None], torch.ones(1, 10, dtype=torch.bool), KVCache(2))
    cache = KVCache(2)
    model(seq[:, :7], torch.arange(7)[None], torch.ones(1, 7, dtype=torch.bool), cache)
    for i in range(7, 10):
        step = model(seq[:, i:i + 1], torch.tensor([[i]]), torch.ones(1, i + 1, dtype=torch.bool), cache)
    torch.testing.assert_close(step, full, rtol=1e-4, atol=1e-4)


def test_left_padding_does_not_change_a_prompt_completion() -> None:
    model = build_model(small("qwen3_moe"), seed=1)
    gen = Generator(model, batch_size=2, max_new_tokens=4)
    short, long = [5, 6, 7], list(range(1, 12))
    together = gen.serve_batch([short, long])
    alone = Generator(model, batch_size=1, max_new_tokens=4).serve_batch([short])
    assert together[0] == alone[0]
    assert gen.stats.prefill_tokens == len(short) + len(long)
    assert gen.stats.decode_tokens == 8 and gen.stats.requests == 2


def test_grouped_fc1_equals_per_token_products() -> None:
    x, w = torch.randn(9, 16), torch.randn(4, 6, 16)
    ids = torch.stack([torch.randperm(4)[:2] for _ in range(9)])
    out = grouped_fc1(x, ids, w)
    for t in range(9):
        for s in range(2):
            torch.testing.assert_close(out[t, s], w[ids[t, s]] @ x[t])


def test_deepseek_router_keeps_to_the_chosen_groups() -> None:
    # 8 experts in 4 groups of 2; top-2 groups; top-4 experts must be exactly those groups' experts.
    cfg = preset("deepseek_v3", **{**SMALL, "top_k": 4})
    router = Router(cfg)
    ids, weights = router(torch.randn(64, cfg.hidden_size))
    assert ids.shape == (64, 4)
    torch.testing.assert_close(weights.sum(-1), torch.full((64,), cfg.routed_scaling_factor))
    for row in (ids // 2).tolist():
        assert len(set(row)) == cfg.topk_group


def test_hf_config_mapping(tmp_path) -> None:
    cfg = from_hf_dict({"model_type": "mixtral", "hidden_size": 1024, "num_hidden_layers": 3,
                        "num_attention_heads": 8, "num_key_value_heads": 2, "num_local_experts": 4,
                        "num_experts_per_tok": 2, "intermediate_size": 128, "vocab_size": 1000})
    assert (cfg.style, cfg.num_layers, cfg.num_experts, cfg.expert_intermediate, cfg.head_dim) == \
        ("mixtral", 3, 4, 128, 128)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "deepseek_v3", "n_routed_experts": 16, "n_group": 4}))
    assert load_config(str(path)).num_experts == 16
    with pytest.raises(ValueError, match="model_type"):
        from_hf_dict({"model_type": "llama"})
    with pytest.raises(ValueError, match="neither a preset"):
        load_config("no-such-model")


def _write_safetensors(path, tensors: dict[str, torch.Tensor]) -> None:
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        raw = t.contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def test_weights_load_from_safetensors_and_torch_files(tmp_path) -> None:
    cfg = small("qwen3_moe")
    source = build_model(cfg, seed=7)
    state = {k: v.float() for k, v in source.state_dict().items()}
    st, pt = tmp_path / "w.safetensors", tmp_path / "w.pt"
    _write_safetensors(st, state)
    torch.save(state, pt)
    assert set(read_safetensors(st)) == set(state)
    for path in (st, pt):
        loaded = build_model(cfg, path, seed=99)
        for name, value in loaded.state_dict().items():
            torch.testing.assert_close(value, state[name])


def test_bad_weights_are_named(tmp_path) -> None:
    cfg = small("qwen3_moe")
    state = build_model(cfg).state_dict()
    state["embed.weight"] = torch.zeros(3, 3)
    torch.save(state, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="embed.weight"):
        build_model(cfg, tmp_path / "bad.pt")
    (tmp_path / "junk.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{nope")
    with pytest.raises(ValueError, match="not JSON"):
        build_model(cfg, tmp_path / "junk.safetensors")
    with pytest.raises(ValueError, match="does not exist"):
        build_model(cfg, tmp_path / "missing.pt")


def test_config_errors_are_named() -> None:
    with pytest.raises(ValueError, match="style"):
        ModelConfig(style="gpt")
    with pytest.raises(ValueError, match="top_k"):
        preset("qwen3_moe", top_k=9)


def test_prompt_streams() -> None:
    assert byte_tokens("ab", 512) == [1 + ord("a"), 1 + ord("b")]
    stream = generated_prompts(5, 100, seed=1)
    first, second = next(stream), next(stream)
    assert len(first) == 5 and first != second and all(1 <= t < 100 for t in first)
