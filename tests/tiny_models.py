"""Tiny random-weight causal LMs of three architectures, for CPU tests of the engine and scoring.

`qwen2`: the project's policy architecture (`brorl.policy.build_policy`'s). `llama`: SmolLM2-135M-
Instruct's layout in miniature (Llama, grouped-query attention with 3 query heads per kv head,
tied embeddings). `gpt2`: an architecture the shared-prefix path does not cover (learned
positions), which takes the plain-attention fallback. Weights are drawn 10x wider than the
transformers default (initializer_range 0.2), so attention moves the logits enough that an error
in positions, masks or caches changes tokens and log-probs.
"""

from __future__ import annotations

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

ARCHITECTURES = ("qwen2", "llama", "gpt2")


def tiny_model(architecture: str, vocab_size: int, seed: int = 0) -> torch.nn.Module:
    """A float32 model in eval mode with pad 0, bos 1, eos 2 (the character tokenizer's ids)."""
    common = dict(vocab_size=vocab_size, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                  initializer_range=0.2, tie_word_embeddings=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        match architecture:
            case "qwen2":
                model = Qwen2ForCausalLM(Qwen2Config(
                    hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                    **common))
            case "llama":
                model = LlamaForCausalLM(LlamaConfig(
                    hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                    num_attention_heads=6, num_key_value_heads=2, head_dim=8,
                    max_position_embeddings=256, **common))
            case "gpt2":
                model = GPT2LMHeadModel(GPT2Config(n_embd=48, n_layer=2, n_head=4,
                                                   n_positions=256, **common))
            case _:
                raise ValueError(f"unknown architecture {architecture!r}")
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = 0, 2
    return model.float().eval()
