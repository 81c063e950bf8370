"""The `model` stage: the policy's starting checkpoint as a Hugging Face folder, from its source.

Three sources (the `model` params section): a GGUF file (dequantised to float32, saved with
`save_pretrained` together with its tokenizer and chat template), a local HF folder (validated
and used where it is), or the tiny Qwen2 built from config. Every later stage reads the folder
the same way (`brorl.policy.load_policy`), whatever the source.

`sources` holds what is checked before anything starts (paths, the GGUF header, the folder's
files; no torch), `checks` whether a checkpoint folder loads (its weights' shapes against its
config; no torch); `make` builds the folder (torch, transformers, gguf). `ModelConfig` is the
stage's one conversion from the schema.

Deliberately ignored: downloads (nothing loads from a hub), quantised training (the GGUF is
dequantised), sharded or non-safetensors weights.
"""

from brorl.model.sources import GgufHeader, ModelConfig, ModelSourceError, check_source

__all__ = ["GgufHeader", "ModelConfig", "ModelSourceError", "check_source"]
