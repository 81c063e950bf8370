"""The parameter shapes a Hugging Face `config.json` implies, without torch or transformers.

`brorl.runs.preflight` compares them with a safetensors header before anything loads, so weights that
belong to another model are refused in a second instead of after the model library starts.
`expected_shapes` knows the decoder families brorl trains and evaluates (Qwen2: the tiny policy
and the paper's 1.5B; Llama: SmolLM2; Mistral; Qwen3), one formula each, as their
`transformers` modeling files lay the parameters out; tests/test_preflight_shapes.py checks every
formula against the model `transformers` builds on the meta device.

Deliberately ignored: other families (`expected_shapes` returns only the embedding, whose shape
every decoder shares: loading the model reports the rest), quantised checkpoints.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

FAMILIES = ("qwen2", "llama", "mistral", "qwen3")


def _layer(config: Mapping[str, Any], family: str) -> dict[str, list[int]]:
    """Shapes of one decoder layer's parameters, names relative to the layer."""
    h, inter = config["hidden_size"], config["intermediate_size"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or h // heads
    q, kv = heads * head_dim, kv_heads * head_dim
    shapes = {"self_attn.q_proj.weight": [q, h], "self_attn.k_proj.weight": [kv, h],
              "self_attn.v_proj.weight": [kv, h], "self_attn.o_proj.weight": [h, q],
              "mlp.gate_proj.weight": [inter, h], "mlp.up_proj.weight": [inter, h],
              "mlp.down_proj.weight": [h, inter],
              "input_layernorm.weight": [h], "post_attention_layernorm.weight": [h]}
    qkv_bias = family == "qwen2" or (family in ("llama", "qwen3")
                                     and config.get("attention_bias", False))
    if qkv_bias:
        shapes |= {"self_attn.q_proj.bias": [q], "self_attn.k_proj.bias": [kv],
                   "self_attn.v_proj.bias": [kv]}
    if family in ("llama", "qwen3") and config.get("attention_bias", False):
        shapes["self_attn.o_proj.bias"] = [h]
    if family == "llama" and config.get("mlp_bias", False):
        shapes |= {"mlp.gate_proj.bias": [inter], "mlp.up_proj.bias": [inter],
                   "mlp.down_proj.bias": [h]}
    if family == "qwen3":
        shapes |= {"self_attn.q_norm.weight": [head_dim], "self_attn.k_norm.weight": [head_dim]}
    return shapes


def expected_shapes(config: Mapping[str, Any]) -> dict[str, list[int]]:
    """Parameter name -> shape as `save_pretrained` writes them (a tied `lm_head` is saved once,
    as the embedding). KeyError or TypeError when a size the family needs is missing or not a
    number."""
    vocab, h = config["vocab_size"], config["hidden_size"]
    shapes = {"model.embed_tokens.weight": [vocab, h]}
    family = config.get("model_type")
    if family not in FAMILIES:
        return shapes
    layer = _layer(config, family)
    for i in range(config["num_hidden_layers"]):
        shapes |= {f"model.layers.{i}.{name}": shape for name, shape in layer.items()}
    shapes["model.norm.weight"] = [h]
    if not config.get("tie_word_embeddings", False):  # every family defaults to untied
        shapes["lm_head.weight"] = [vocab, h]
    return shapes


def is_complete(config: Mapping[str, Any]) -> bool:
    """Whether `expected_shapes` knows every parameter of this config's family."""
    return config.get("model_type") in FAMILIES
