"""An offline character-level tokenizer for the tiny policy, built with `tokenizers`.

Each character of a fixed alphabet is one token (a BPE model with no merges, so no pre-tokenizer
and no word boundaries: spaces and newlines are ordinary tokens). Three special tokens (`<pad>`,
`<bos>`, `<eos>`) and `<unk>` for characters outside the alphabet. No chat template by default,
so `brorl.families.prompts.render_prompt` gives the tiny policy its short plain template (`Q: ...\nA: `):
every prompt character costs compute on CPU, and the supervised warm-up teaches the answer
format that a chat prompt would spell out. `CHAT_TEMPLATE` (`role: content` lines) exercises the
chat code path (`apply_chat_template`) on the tiny tokenizer when asked for.

Deliberately ignored: subword merges (a tiny model learns characters faster than it would learn
a large vocabulary), normalisation (prompts are ASCII by construction). Paper: none; this is the
CPU stand-in for the Qwen tokenizer of the paper's 1.5B policy (DeepSeek-R1-Distill-Qwen-1.5B
at the root, ProRL (arXiv 2505.24864) §2.3.1).
"""

from __future__ import annotations

import string

from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
"""Special tokens, in id order: `<pad>` = 0, `<bos>` = 1, `<eos>` = 2, `<unk>` = 3."""
SPECIAL_ROLES = {"pad_token": PAD, "bos_token": BOS, "eos_token": EOS, "unk_token": UNK}
"""Each special token by its role, as `PreTrainedTokenizerFast` takes them."""
SPECIAL_IDS = {f"{role}_id": SPECIAL_TOKENS.index(token) for role, token in SPECIAL_ROLES.items()
               if token != UNK}
"""`pad_token_id`, `bos_token_id`, `eos_token_id`: the ids a model built for this tokenizer
(`build_policy`) puts in its config and generation config."""

DEFAULT_ALPHABET = "\n" + "".join(chr(c) for c in range(32, 127))
"""Newline plus printable ASCII (space to `~`): 96 characters, so V = 100 with the specials."""

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
"""`role: content` lines, then `assistant: ` when a generation prompt is asked for (opt-in:
`build_tokenizer(chat_template=CHAT_TEMPLATE)`)."""


def _check_alphabet(alphabet: str) -> str:
    chars = list(dict.fromkeys(alphabet))  # de-duplicate, keep order
    if not chars:
        raise ValueError("alphabet is empty; pass the characters the tokenizer must know.")
    bad = [c for c in chars if c in string.whitespace and c not in " \n\t"]
    if bad:
        raise ValueError(f"alphabet holds control whitespace {bad!r}; keep only ' ', '\\n', '\\t'.")
    return "".join(chars)


def build_tokenizer(alphabet: str | None = None, *,
                    chat_template: str | None = None) -> PreTrainedTokenizerFast:
    """A character-level fast tokenizer: ids 0-3 special, then one id per alphabet character.

    Deterministic: the same alphabet always gives the same ids. V = 4 + len(set(alphabet)).
    `chat_template` None (the default) leaves the tokenizer without one (plain prompts).
    """
    chars = _check_alphabet(DEFAULT_ALPHABET if alphabet is None else alphabet)
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in chars:
        vocab[ch] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    core.decoder = decoders.Fuse()
    core.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        **SPECIAL_ROLES,
        tokenizer_object=core,
        chat_template=chat_template,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=1_000_000,
    )
