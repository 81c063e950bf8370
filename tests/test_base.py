"""The base stage: batching by hand, determinism, and a real rise of held-out pass@1 at CI size."""

from __future__ import annotations

import json

import pytest
import torch

from brorl.base import collate, encode_pairs, family_weights, make_base_checkpoint, warm_up
from brorl.data import generate_code, make_problem, split_problems
from brorl.evaluate import evaluate_policy
from brorl.policy import build_policy, build_tokenizer, load_policy
from brorl.prompts import render_prompt, render_target

TINY = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128,
            max_position_embeddings=256, seed=0)


def test_collate_puts_loss_only_on_the_response():
    batch = collate([([7, 8], [9, 2]), ([5], [6, 7, 2])], pad_id=0)
    # row 0: prompt 7 8, response 9 <eos>, one pad; row 1: prompt 5, response 6 7 <eos>
    assert batch["input_ids"].tolist() == [[7, 8, 9, 2], [5, 6, 7, 2]]
    assert batch["labels"].tolist() == [[-100, -100, 9, 2], [-100, 6, 7, 2]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 1]]
    short = collate([([7], [2]), ([5, 5], [6, 2])], pad_id=0)
    assert short["input_ids"][0].tolist() == [7, 2, 0, 0] and short["labels"][0].tolist()[2:] == [-100, -100]


def test_encode_pairs_renders_prompt_then_target_and_eos():
    tok = build_tokenizer()
    p = make_problem("math", "t", "Compute 1 + 1.", answer="2")
    [(prompt, target)] = encode_pairs([p], tok)
    assert tok.decode(prompt) == render_prompt(p, tok)
    assert tok.decode(target) == render_target(p) + "<eos>"


def test_family_weights_make_families_equally_likely():
    ps = [make_problem("math", "t", f"Compute {i} + 1.", answer=str(i + 1)) for i in range(3)]
    ps.append(make_problem("reasoning", "r", "Spell cat backward.", answer="tac"))
    assert family_weights(ps).tolist() == pytest.approx([1 / 3, 1 / 3, 1 / 3, 1.0])


def _code_splits():
    """CI-sized data: the generated `add` and `subtract` templates (copying k and the name)."""
    return split_problems(generate_code(60, seed=0, tasks=("add", "subtract")), seed=0,
                          validation_fraction=0.15, test_fraction=0.25)


def test_warm_up_is_deterministic_for_a_seed():
    splits = _code_splits()
    tok = build_tokenizer()
    runs = []
    for _ in range(2):
        model = build_policy(vocab_size=len(tok), **TINY)
        warm_up(model, tok, splits["train"], splits["validation"][:4], max_steps=3, eval_every=3,
                batch_size=4, lr=1e-3, seed=5, target_pass_low=1.0, max_new_tokens=4)
        runs.append(model.model.embed_tokens.weight.detach().clone())
    assert torch.equal(runs[0], runs[1])


def test_base_stage_at_ci_size_raises_held_out_pass_at_1(tmp_path):
    splits = _code_splits()
    test = splits["test"]
    tok = build_tokenizer()
    untrained = build_policy(vocab_size=len(tok), **TINY)
    before, _ = evaluate_policy(untrained, tok, test, max_new_tokens=48, workers=2)
    model, tok, report = make_base_checkpoint(
        splits["train"], splits["validation"], test, model_config=TINY, max_steps=300,
        eval_every=100, batch_size=16, lr=1e-2, seed=0, target_pass_low=0.3,
        eval_per_family=12, test_samples=1, eval_temperature=0.0, eval_top_p=1.0,
        max_response_tokens=48, workers=2)
    after = report["test"]["family"]["code"]["pass_at_1"]
    print(json.dumps({"before": before["family"]["code"]["pass_at_1"], "after": after,
                      "steps": report["steps"], "seconds": report["train_seconds"]}))
    assert before["family"]["code"]["pass_at_1"] == 0.0  # random weights write no code block
    assert after >= 0.2  # at least 20 points above the untrained model on unseen problems
    assert report["history"][0]["step"] == 0 and report["steps"] <= 300


def _ci_tasks(tmp_path):
    """Run the `data` and `base` tasks through `.fn()` at a few-problem size; return outputs."""
    from tasks.base import train_base
    from tasks.data import build_data

    data = build_data.fn(path=str(tmp_path / "problems"), metrics_path=str(tmp_path / "d.json"),
                         seed=0, validation_fraction=0.2, test_fraction=0.2, math_per_task=4,
                         code_per_task=5, reasoning_per_task=4)
    base = train_base.fn(data_path=data["path"], path=str(tmp_path / "base" / "ckpt"),
                         metrics_path=str(tmp_path / "b.json"), target_pass_high=0.6,
                         model_config=TINY, max_steps=2, eval_every=2, batch_size=4, lr=1e-3,
                         seed=0, target_pass_low=0.2, eval_per_family=2, test_samples=1,
                         eval_temperature=0.6, eval_top_p=0.95, max_response_tokens=4)
    return data, base


def test_data_and_base_tasks_write_splits_checkpoint_and_metrics(tmp_path):
    data, base = _ci_tasks(tmp_path)
    counts = json.loads((tmp_path / "d.json").read_text())
    assert counts == data["counts"] and counts["data/train/code"] > 0
    assert (tmp_path / "problems" / "dataset_dict.json").is_file()
    metrics = json.loads((tmp_path / "b.json").read_text())
    assert metrics == base["metrics"] and metrics["base/steps"] == 2.0
    assert {"base/pass_at_1_math", "base/pass_at_1_code", "base/pass_at_1_reasoning",
            "base/in_band"} <= set(metrics)
    model, _ = load_policy(base["path"])
    assert model.config.hidden_size == TINY["hidden_size"]
    history = json.loads((tmp_path / "base" / "report.json").read_text())["history"]
    assert [h["step"] for h in history] == [0, 2]


@pytest.mark.slow
def test_data_and_base_flows_run_on_a_prefect_server(tmp_path, monkeypatch):
    from pathlib import Path

    from prefect.testing.utilities import prefect_test_harness

    from flows.base import base
    from flows.data import data

    params = str(Path("params/tiny_ci.yaml").resolve())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    sizes = ["data.math_per_task=4", "data.code_per_task=5", "data.reasoning_per_task=4",
             "base.max_steps=2", "base.eval_every=2", "base.eval_per_family=2",
             f"tracking.metrics_dir={tmp_path / 'metrics'}"]
    with prefect_test_harness(server_startup_timeout=120):
        counts = data(params_path=params, overrides=sizes)["counts"]
        summary = base(params_path=params, overrides=sizes)
    assert json.loads((tmp_path / "metrics/data.json").read_text()) == counts
    assert json.loads((tmp_path / "metrics/base.json").read_text())["base/steps"] == 2.0
    assert load_policy(summary["path"])[0].config.hidden_size == 64  # tiny_ci.yaml's size
    import mlflow

    run = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(summary["mlflow_run_id"])
    assert run.data.metrics["base/steps"] == 2.0 and run.data.params["base.max_steps"] == "2"
