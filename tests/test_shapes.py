"""`brorl.model.shapes.expected_shapes` against the models transformers builds from the same config.json
(on the meta device: no memory, no weights), for every family it knows."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
    Qwen3Config,
)

from brorl.model.shapes import FAMILIES, expected_shapes

SMALL = dict(vocab_size=50, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2)


@pytest.mark.parametrize(("config_class", "extra"), [
    (Qwen2Config, {}), (Qwen2Config, {"tie_word_embeddings": True}),
    (LlamaConfig, {}), (LlamaConfig, {"attention_bias": True, "mlp_bias": True, "head_dim": 8}),
    (MistralConfig, {}), (MistralConfig, {"head_dim": 8, "num_key_value_heads": 4}),
    (Qwen3Config, {}), (Qwen3Config, {"attention_bias": True, "tie_word_embeddings": True}),
])
def test_shapes_from_config_json_equal_the_saved_model_of_that_config(config_class, extra,
                                                                       tmp_path):
    config_class(**{**SMALL, **extra}).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] in FAMILIES
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tmp_path))
    built = {name: list(t.shape) for name, t in model.state_dict().items()}
    if saved.get("tie_word_embeddings", False):
        built.pop("lm_head.weight")  # saved once, as the embedding
    assert expected_shapes(saved) == built


def test_an_unknown_family_gets_its_embedding_checked_only():
    assert expected_shapes({"model_type": "gpt_neox", "vocab_size": 7, "hidden_size": 4}) == {
        "model.embed_tokens.weight": [7, 4]}
    with pytest.raises(KeyError):
        expected_shapes({"model_type": "qwen2", "vocab_size": 7, "hidden_size": 4})
