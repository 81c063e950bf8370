"""The policy: a character tokenizer, a tiny Qwen2 from config, HF-folder save/load, and the
token rules every tokenizer shares (`tokens`)."""

from brorl.policy.model import build_policy, load_policy, load_tokenizer, save_policy
from brorl.policy.tokenizer import CHAT_TEMPLATE, DEFAULT_ALPHABET, build_tokenizer

__all__ = [
    "CHAT_TEMPLATE",
    "DEFAULT_ALPHABET",
    "build_policy",
    "build_tokenizer",
    "load_policy",
    "load_tokenizer",
    "save_policy",
]
