"""Rollout engines behind one Protocol: `hf` (in-process transformers) and `vllm` (imported lazily).

`build_engine` is the one place that maps the `generate.engine` choice to a class; vLLM is imported
only when it is chosen, never at `import brorl.engines`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from brorl.engines.base import RolloutEngine, SamplingConfig, sampling_logprobs, score_rollouts
from brorl.engines.hf import HfEngine

__all__ = [
    "HfEngine",
    "RolloutEngine",
    "SamplingConfig",
    "build_engine",
    "sampling_logprobs",
    "score_rollouts",
]


def build_engine(
    kind: Literal["hf", "vllm"],
    *,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    model_path: str | Path | None,
    max_concurrent_rollouts: int,
    max_model_len: int,
    seed: int = 0,
    dtype: str = "float32",
    gpu_memory_utilization: float = 0.5,
    cpu_kv_cache_gib: int = 1,
    enforce_eager: bool = False,
    cpu_threads: int | None = None,
) -> RolloutEngine:
    """The engine `kind` for the policy: `hf` runs `model` itself; `vllm` loads `model_path` (an HF
    folder holding the same weights) and is kept in step with `sync_weights(model)`.

    `cpu_threads` (vLLM on CPU): bind vLLM's threads to cores 0..k-1 (default: vLLM's own, which
    pins to core 0 only). The hf engine uses torch's thread count (`OMP_NUM_THREADS`)."""
    match kind:
        case "hf":
            return HfEngine(model, tokenizer, max_concurrent_rollouts=max_concurrent_rollouts)
        case "vllm":
            if model_path is None:
                raise ValueError("the vllm engine loads from an HF folder: pass model_path "
                                 "(save the policy with brorl.policy.save_policy first).")
            from brorl.engines.vllm import VllmEngine

            return VllmEngine(
                model_path, max_model_len=max_model_len,
                max_concurrent_rollouts=max_concurrent_rollouts, seed=seed, dtype=dtype,
                gpu_memory_utilization=gpu_memory_utilization, cpu_kv_cache_gib=cpu_kv_cache_gib,
                enforce_eager=enforce_eager, cpu_threads=cpu_threads,
            )
        case _:
            raise ValueError(f"unknown engine {kind!r}; choose 'hf' or 'vllm' (generate.engine).")
