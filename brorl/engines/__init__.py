"""Rollout engines behind one Protocol: `hf` (in-process transformers) and `vllm` (imported lazily).

`build_engine` is the one place that maps the `generate.engine` choice to a class; vLLM is imported
only when it is chosen, never at `import brorl.engines`.
"""

from __future__ import annotations

from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from brorl.engines.base import (
    EngineConfig,
    RolloutEngine,
    SamplingConfig,
    sampling_logprobs,
    score_rollouts,
)
from brorl.engines.hf import HfEngine

__all__ = [
    "EngineConfig",
    "HfEngine",
    "RolloutEngine",
    "SamplingConfig",
    "build_engine",
    "sampling_logprobs",
    "score_rollouts",
]


def build_engine(
    config: EngineConfig,
    *,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    model_path: str | Path | None,
    max_model_len: int,
    cpu_threads: int | None = None,
) -> RolloutEngine:
    """The engine `config.kind` for the policy: `hf` runs `model` itself; `vllm` loads
    `model_path` (an HF folder holding the same weights) and is kept in step with
    `sync_weights(model)`. `config` holds the `generate` section's settings
    (`EngineConfig`); `max_model_len` is the model's context.

    `cpu_threads` (vLLM on CPU): bind vLLM's threads to cores 0..k-1 (default: vLLM's own, which
    pins to core 0 only). The hf engine uses torch's thread count (`OMP_NUM_THREADS`)."""
    match config.kind:
        case "hf":
            return HfEngine(model, tokenizer,
                            max_concurrent_rollouts=config.max_concurrent_rollouts,
                            compile=config.compile, stop_check_tokens=config.stop_check_tokens)
        case "vllm":
            if model_path is None:
                raise ValueError("the vllm engine loads from an HF folder: pass model_path "
                                 "(save the policy with brorl.policy.save_policy first).")
            from brorl.engines.vllm import VllmEngine

            return VllmEngine(model_path, config, max_model_len=max_model_len,
                              cpu_threads=cpu_threads)
        case _:
            raise ValueError(f"unknown engine {config.kind!r}; choose 'hf' or 'vllm' "
                             "(generate.engine).")
