"""Build, save and load the policy: a tiny Qwen2 from config on CPU, or any local HF checkpoint.

`build_policy` makes a Qwen2-architecture causal LM (the paper's policy family, ProRL (arXiv
2505.24864): Nemotron-Research-Reasoning-Qwen-1.5B) from explicit sizes, initialised from a seed, in
float32.
`save_policy` writes a standard Hugging Face folder atomically; `load_policy` reads any local
folder with `AutoModelForCausalLM` and `PreTrainedTokenizerFast` (not `AutoTokenizer`: on a Qwen2
folder it returns a tokenizer that drops spaces of the character vocabulary, platform notes).

Deliberately ignored: downloads (everything is `local_files_only`), quantisation, sharding.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from brorl.policy.tokenizer import SPECIAL_IDS, SPECIAL_TOKENS


def build_policy(
    *,
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    intermediate_size: int,
    max_position_embeddings: int,
    tie_word_embeddings: bool = True,
    seed: int = 0,
) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2ForCausalLM in float32, in eval mode.

    Special-token ids follow `build_tokenizer` (pad 0, bos 1, eos 2). The global torch RNG is
    left untouched: initialisation runs inside a forked RNG seeded with `seed`.
    """
    if hidden_size % num_heads:
        raise ValueError(
            f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads}); "
            "pick sizes with hidden_size = num_heads * head_dim."
        )
    if num_heads % num_kv_heads:
        raise ValueError(
            f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads}) "
            "for grouped-query attention; e.g. num_kv_heads = 1 or = num_heads."
        )
    if vocab_size < len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size ({vocab_size}) is below the {len(SPECIAL_TOKENS)} specials.")
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        use_cache=True,
        **SPECIAL_IDS,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.update(**SPECIAL_IDS)
    return model.to(torch.float32).eval()


def save_policy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, path: str | Path, *,
                extra_files: dict[str, str] | None = None) -> None:
    """Write model and tokenizer to `path` as one HF folder: a temp sibling, then a rename.

    An existing folder at `path` is replaced only once the new one is complete, so a crash never
    leaves a half-written checkpoint under `path`. `extra_files` (name -> text) are written into
    the folder with the rest.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old.", dir=path.parent))
            path.rename(old / "ckpt")
            tmp.rename(path)
            shutil.rmtree(old)
        else:
            tmp.rename(path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def load_policy(
    path: str | Path, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """Load any local HF checkpoint folder (tiny or real) as (model in eval mode, tokenizer)."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"{path} is not a Hugging Face checkpoint folder (no config.json); "
            "pass a folder written by save_policy or save_pretrained."
        )
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
    return own_memory(model.to(device)).eval(), load_tokenizer(path)


def own_memory(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with every parameter and buffer copied into memory of its own (in place; tied
    weights stay tied), as a freshly built or deep-copied model holds them.

    `from_pretrained` leaves CPU tensors as views into the checkpoint file's memory map, at
    offsets its header length decides (rarely a multiple of 64 bytes).
    Some CPU kernels (MKL's, by the instruction set it picks on a machine) round differently on
    differently aligned inputs, so the same weights loaded from two folders, or loaded against
    deep-copied, can give log-probabilities that differ in the last bits: a resumed run's
    reference then scored its KL apart from the uninterrupted run's. Owned tensors are aligned
    by torch's allocator whatever the file, so a model computes the same however it was made.
    """
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            tensor.data = tensor.data.clone(memory_format=torch.contiguous_format)
    return model


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """The tokenizer of a local HF folder, exactly as its `tokenizer.json` defines it (with its
    chat template), padding with EOS when it has no pad token (batched generation needs one)."""
    path = Path(path)
    if not (path / "tokenizer.json").is_file():
        raise FileNotFoundError(
            f"{path} has no tokenizer.json: brorl reads the fast tokenizer a checkpoint ships; "
            "save one beside the weights (tokenizer.save_pretrained(folder)).")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True)
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
