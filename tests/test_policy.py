"""The tiny policy: character tokenizer and Qwen2 model round-trip through an HF folder."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest
import torch
from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

from brorl.policy import CHAT_TEMPLATE, build_policy, build_tokenizer, load_policy, save_policy

SIZES = dict(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64,
             max_position_embeddings=128)


def _policy(seed: int = 0) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast]:
    tok = build_tokenizer()
    return build_policy(vocab_size=len(tok), seed=seed, **SIZES), tok


def test_tokenizer_is_one_token_per_character_and_keeps_spaces():
    tok = build_tokenizer()
    text = "def f(x):\n    return x  + 1"
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text)  # no merges, no word boundaries
    assert tok.decode(ids) == text
    # ids: <pad> 0, <bos> 1, <eos> 2, <unk> 3, then "\n" 4, " " 5, "!" 6, ...
    assert tok("\n !")["input_ids"] == [4, 5, 6]
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    assert len(tok) == 4 + 96


def test_tokenizer_maps_special_strings_and_unknown_characters():
    tok = build_tokenizer("ab")
    assert tok("ab<eos>é")["input_ids"] == [4, 5, 2, 3]
    assert tok.decode([4, 5, 2], skip_special_tokens=True) == "ab"


def test_tokenizer_has_no_chat_template_unless_asked_and_then_renders_roles():
    assert build_tokenizer().chat_template is None  # the tiny policy takes plain prompts
    tok = build_tokenizer(chat_template=CHAT_TEMPLATE)
    text = tok.apply_chat_template([{"role": "user", "content": "1+1"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text == "user: 1+1\nassistant: "


def test_tokenizer_rejects_empty_alphabet():
    with pytest.raises(ValueError, match="alphabet is empty"):
        build_tokenizer("")


def test_build_policy_is_deterministic_per_seed_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a, _ = _policy(seed=7)
    after = torch.rand(1)
    b, _ = _policy(seed=7)
    c, _ = _policy(seed=8)
    assert torch.equal(before, after)
    wa, wb, wc = (m.model.embed_tokens.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    assert a.dtype == torch.float32 and a.lm_head.weight.data_ptr() == wa.data_ptr()  # tied


def test_build_policy_rejects_heads_that_do_not_divide_hidden_size():
    with pytest.raises(ValueError, match="divisible by num_heads"):
        build_policy(vocab_size=100, hidden_size=30, num_layers=1, num_heads=4, num_kv_heads=1,
                     intermediate_size=8, max_position_embeddings=16)


def test_save_and_load_round_trip_gives_same_logits_and_tokens(tmp_path):
    model, tok = _policy(seed=3)
    save_policy(model, tok, tmp_path / "ckpt")
    model2, tok2 = load_policy(tmp_path / "ckpt")
    text = "12+7=19\n"
    assert tok2(text)["input_ids"] == tok(text)["input_ids"]
    assert tok2.chat_template == tok.chat_template and tok2.pad_token_id == 0
    ids = torch.tensor([tok(text)["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, model2(ids).logits)
    assert not model2.training


def test_save_policy_replaces_existing_folder_and_leaves_no_temp(tmp_path):
    first, tok = _policy(seed=1)
    second, _ = _policy(seed=2)
    save_policy(first, tok, tmp_path / "ckpt")
    save_policy(second, tok, tmp_path / "ckpt")
    loaded, _ = load_policy(tmp_path / "ckpt")
    assert torch.equal(loaded.model.embed_tokens.weight, second.model.embed_tokens.weight)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def test_load_policy_names_a_folder_without_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_policy(tmp_path)


def test_a_loaded_policy_holds_its_weights_in_aligned_memory_of_its_own(tmp_path):
    model, tok = _policy(seed=4)
    save_policy(model, tok, tmp_path / "ckpt")
    loaded, _ = load_policy(tmp_path / "ckpt")
    # from_pretrained alone leaves views into the file's memory map, at the offset its header
    # gives (not a multiple of 64): kernels may round those differently from aligned copies
    assert {t.data_ptr() % 64 for t in [*loaded.parameters(), *loaded.buffers()]} == {0}
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight  # still tied
    assert torch.equal(loaded.model.embed_tokens.weight, model.model.embed_tokens.weight)


SAME_LOGITS = """
import copy, sys, torch
from brorl.policy import build_policy, build_tokenizer, load_policy, save_policy
tok = build_tokenizer()
built = build_policy(vocab_size=len(tok), hidden_size=576, num_layers=1, num_heads=9,
                     num_kv_heads=3, intermediate_size=1536, max_position_embeddings=64, seed=0)
save_policy(built, tok, sys.argv[1])
loaded, _ = load_policy(sys.argv[1])
with torch.no_grad():
    for ids in ([[5]], [[5, 9, 13, 4, 22, 7]], [[5, 9], [13, 4], [22, 7]]):
        ids = torch.tensor(ids)
        for other in (loaded, copy.deepcopy(loaded)):
            assert torch.equal(built(ids).logits, other(ids).logits), ids.tolist()
"""


MKL_X86 = platform.machine() in ("x86_64", "AMD64") and torch.backends.mkl.is_available()
"""MKL_ENABLE_INSTRUCTIONS, MKL's instruction-set switch, exists on x86 builds only."""


@pytest.mark.skipif(not MKL_X86, reason="MKL's instruction-set switch exists on x86 builds only")
def test_built_loaded_and_copied_policies_give_the_same_logits_on_every_kernel_path(tmp_path):
    """A resumed run's reference (loaded) must score as the uninterrupted run's (built or
    copied). MKL's SSE4.2 path, which MKL picks on some CPUs, rounds a one-row product
    differently on a misaligned weight: forced here, it shows what a machine's default hides."""
    env = {**os.environ, "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", SAME_LOGITS, str(tmp_path / "ckpt")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
