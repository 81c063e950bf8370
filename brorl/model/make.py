"""Build the model stage's checkpoint folder from its source (torch, transformers, gguf).

- `gguf`: transformers reads the file (`from_pretrained(folder, gguf_file=...)`, tokenizer and
  chat template included) and dequantises it to float32. A GGUF-loaded model refuses
  `save_pretrained` (it is marked quantised), so the same architecture is built from the config
  without its `quantization_config` and takes the state dict: its logits equal the GGUF-loaded
  model's exactly (tested). The folder holds the weights as safetensors, the tokenizer with its
  chat template and the generation config (the model's stop ids).
- `random_weights`: the model of the source's config (the GGUF's, via `config_folder`, or the HF
  folder's) with weights initialised from `seed`, the source's tokenizer unchanged: the same
  shapes and tokens without the weights (a GPU machine the 98 MB file cannot reach).
- `tiny`: the character tokenizer and the tiny Qwen2 of `model`'s sizes (`brorl.policy`).
- `hf`: nothing is written but the card; the folder stays where it is.

Every folder gets `model.json`, its card: source, architecture, parameters, vocabulary, stop ids,
whether a chat template came with it, and (GGUF) the file, its quantisation and SHA-256. The card
holds what the source decides and nothing the clock or the machine does: no seconds (the task
times the call: `model/seconds` in MLflow and `<folder>.timings.json`, `brorl.runs.timings`) and the
checkpoint's path relative to the checkout (`brorl.runs.files.checkout_relative`), so a rerun writes
the same bytes.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from brorl.model.checks import check_checkpoint
from brorl.model.sources import ModelConfig, check_source, gguf_path
from brorl.policy import build_policy, build_tokenizer, load_tokenizer, save_policy
from brorl.policy.tokens import model_stop_ids
from brorl.runs.files import atomic_write_text, checkout_relative

CARD = "model.json"
"""The card the stage writes in its folder."""


def make_checkpoint(config: ModelConfig, dest: str | Path, root: str | Path = ".") -> dict[str, Any]:
    """Write the checkpoint of `config` at `dest` (paths from `root`) and return its card."""
    root, dest = Path(root), Path(dest)
    header = check_source(config, root)
    extra: dict[str, Any] = {}
    if config.source == "hf" and not config.random_weights:
        model, tokenizer = _validated_folder(root / str(config.hf_folder))
        checkpoint = str(config.hf_folder)
    elif config.random_weights:
        folder = root / str(config.config_folder if config.source == "gguf" else config.hf_folder)
        model, tokenizer = _random(folder, config.seed)
        checkpoint = str(dest)
    elif config.source == "gguf":
        model, tokenizer = _from_gguf(gguf_path(config, root))
        checkpoint = str(dest)
        where = ({"package": config.gguf_package} if config.gguf_package else {})
        extra = {"gguf": {**where, "file": str(config.gguf_file),
                          "quantisation": header.quantisation, "sha256": _sha256(header.path)}}
    else:
        tokenizer = build_tokenizer()
        model = build_policy(vocab_size=len(tokenizer), **config.tiny_sizes)
        checkpoint = str(dest)
    own = checkpoint == str(dest)  # the weights are written here, not used where they are
    card = {"source": config.source, "random_weights": config.random_weights,
            "checkpoint": checkout_relative(checkpoint, root), **describe(model, tokenizer),
            **extra}
    text = json.dumps(card, indent=1) + "\n"
    if own:
        save_policy(model, tokenizer, dest, extra_files={CARD: text})
    else:
        _write_card_only(dest, text)
    return card


def describe(model: torch.nn.Module, tokenizer: Any) -> dict[str, Any]:
    """What the card says about a loaded model and its tokenizer."""
    return {"architecture": type(model).__name__, "model_type": model.config.model_type,
            "parameters": sum(p.numel() for p in model.parameters()),
            "vocab_size": model.config.vocab_size, "stop_ids": list(model_stop_ids(model, tokenizer)),
            "chat_template": bool(getattr(tokenizer, "chat_template", None))}


def _from_gguf(path: Path) -> tuple[torch.nn.Module, Any]:
    """The dequantised float32 model of a GGUF file, as a plain (saveable) model, and its
    tokenizer with its chat template."""
    folder, name = path.parent, path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    settings = loaded.config.to_dict()
    settings.pop("quantization_config", None)
    plain_config = type(loaded.config).from_dict(settings)
    with torch.device("meta"):
        model = type(loaded)(plain_config)
    model.load_state_dict(loaded.state_dict(), assign=True)
    model.tie_weights()
    model.generation_config = loaded.generation_config
    return model.eval(), tokenizer


def _validated_folder(folder: Path) -> tuple[torch.nn.Module, Any]:
    """An HF folder used as it is: its weights checked against its config (shapes, without
    loading them: `brorl.model.checks.check_checkpoint`), its model built on the meta device for
    the card, its generation config and tokenizer."""
    check_checkpoint(folder, "model.hf_folder")
    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    if (folder / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(folder, local_files_only=True)
    return model, load_tokenizer(folder)


def _random(folder: Path, seed: int) -> tuple[torch.nn.Module, Any]:
    """A model of `folder`'s config with weights drawn from `seed` (the global RNG untouched),
    its generation config, and `folder`'s tokenizer."""
    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if (folder / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(folder, local_files_only=True)
    return model.eval(), load_tokenizer(folder)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_card_only(dest: Path, text: str) -> None:
    """The folder of an `hf` source: its card alone (the checkpoint stays where it is)."""
    dest.mkdir(parents=True, exist_ok=True)
    for stale in dest.iterdir():  # a folder a gguf or tiny source wrote before
        if stale.name != CARD:
            raise FileExistsError(f"{dest} holds {stale.name} from an earlier model; remove the "
                                  "folder or set model.path to a new one.")
    atomic_write_text(dest / CARD, text)
