"""Rollout engines behind one Protocol: `hf` (in-process transformers) and `vllm` (imported lazily)."""

from brorl.engines.base import RolloutEngine, SamplingConfig, sampling_logprobs

__all__ = ["RolloutEngine", "SamplingConfig", "sampling_logprobs"]
