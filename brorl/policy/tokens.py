"""Text to token ids and back for any Hugging Face tokenizer: prompts, stop ids, responses.

One home for the three rules every stage that touches tokens must share, whichever tokenizer the
checkpoint brings (the character tokenizer of the tiny policy or a pretrained model's BPE):

- `encode_prompts`: a rendered prompt is encoded as it is, with no special tokens added. A chat
  template (`brorl.families.prompts.render_prompt`) already writes the ones the model was trained with
  (SmolLM2's `<|im_start|>`, Qwen's); adding a BOS on top would give the model a prompt it never
  saw. The character tokenizer adds none either way.
- `stop_ids`: a response ends at any of the model's end-of-sequence ids. Instruct checkpoints
  often list several in `generation_config.eos_token_id` (Qwen2.5: `<|im_end|>` and
  `<|endoftext|>`); the tokenizer's own `eos_token_id` is always among them.
- `decode_responses`: response text with special tokens dropped (what verifiers read).

Deliberately ignored: stop strings (only ids stop a rollout), tokenizers without an EOS.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def encode_prompts(tokenizer: Any, prompts: Sequence[str]) -> list[tuple[int, ...]]:
    """Token ids of each rendered prompt, no special tokens added; refuses an empty prompt."""
    ids = [tuple(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    empty = [b for b, row in enumerate(ids) if not row]
    if empty:
        raise ValueError(f"prompts {empty} tokenize to no tokens; every prompt needs at least one.")
    return ids


def stop_ids(tokenizer: Any, generation_eos: int | Iterable[int] | None = None) -> tuple[int, ...]:
    """The ids that end a response: the tokenizer's EOS plus the generation config's
    `eos_token_id` (an int or a list), sorted, each once."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    if isinstance(generation_eos, int):
        ids.add(generation_eos)
    elif generation_eos is not None:
        ids.update(int(i) for i in generation_eos)
    if not ids:
        raise ValueError("the tokenizer has no eos_token_id and the generation config names none; "
                         "rollouts could never stop: set eos_token in the checkpoint's tokenizer.")
    return tuple(sorted(ids))


def model_stop_ids(model: Any, tokenizer: Any) -> tuple[int, ...]:
    """`stop_ids` of a loaded model (its `generation_config`) and its tokenizer."""
    config = getattr(model, "generation_config", None)
    return stop_ids(tokenizer, getattr(config, "eos_token_id", None))


def pad_id(tokenizer: Any) -> int:
    """The id that pads batches: the tokenizer's pad token, else its EOS."""
    pad = tokenizer.pad_token_id
    return int(pad if pad is not None else tokenizer.eos_token_id)


def decode_responses(tokenizer: Any, rows: Iterable[Sequence[int]]) -> list[str]:
    """The text of each response's ids, special tokens dropped."""
    return tokenizer.batch_decode([list(r) for r in rows], skip_special_tokens=True)
