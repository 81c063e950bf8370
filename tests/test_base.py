"""The base stage: batching by hand, determinism, and a real rise of held-out pass@1 at CI size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import brorl.base.supervised
from brorl.base import (
    band_distance,
    batch_loss_backward,
    collate,
    encode_pairs,
    family_weights,
    length_sorted_chunks,
    lr_at,
    make_base_checkpoint,
    round_shares,
    warm_up,
)
from brorl.data import make_problem, split_problems
from brorl.engines import HfEngine
from brorl.evaluation.scoring import evaluate_policy
from brorl.families.code import generate_code
from brorl.families.math import generate_math
from brorl.families.prompts import render_prompt, render_target
from brorl.params import BaseParams, DataParams, ExperimentParams, ModelParams, TrackingParams
from brorl.policy import build_policy, build_tokenizer, load_policy, save_policy
from brorl.runs.machine import conditions
from brorl.verifiers import VerifyConfig

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


def test_families_that_reached_the_band_get_a_smaller_share_next_round():
    passes = {"math": 0.3, "code": 0.1, "reasoning": 0.2}  # reasoning exactly at the low end
    shares = round_shares(passes, target_pass_low=0.2, reached_share=0.25,
                          family_shares={"code": 0.5})
    # math 1 x 0.25 (reached), code 0.5 x 1 (not yet), reasoning 1 x 0.25 (reached)
    assert shares == {"code": 0.5, "math": 0.25, "reasoning": 0.25}
    assert round_shares(passes, target_pass_low=0.2, reached_share=1.0) == {
        "code": 1.0, "math": 1.0, "reasoning": 1.0}  # 1: no adaptation
    weights = family_weights([make_problem("math", "t", "1 + 1", answer="2"),
                              make_problem("code", "t", "f", tests=["assert True"])], shares)
    assert weights.tolist() == [0.25, 0.5]


def test_lr_at_warms_up_linearly_then_decays_by_cosine_to_the_floor():
    rate = dict(lr=1.0, warmup_steps=4, total_steps=12, min_lr_ratio=0.1)
    # warm-up: (step + 1) / 4
    assert [lr_at(s, **rate) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    # cosine over steps 4..12: f = (step - 4) / 8; 0.1 + 0.9 (1 + cos(pi f)) / 2
    assert lr_at(4, **rate) == pytest.approx(1.0)
    assert lr_at(8, **rate) == pytest.approx(0.1 + 0.9 * 0.5)  # f = 1/2, cos = 0
    assert lr_at(12, **rate) == pytest.approx(0.1) and lr_at(30, **rate) == pytest.approx(0.1)
    assert lr_at(9, **{**rate, "min_lr_ratio": 1.0}) == 1.0  # ratio 1: constant after warm-up
    assert lr_at(0, **{**rate, "warmup_steps": 0}) == 1.0  # no warm-up: the cosine starts at lr


def test_length_sorted_chunks_group_short_pairs_together():
    pairs = [([1] * 4, [2]), ([1], [2]), ([1] * 8, [2]), ([1], [2])]  # lengths 5, 2, 9, 2
    assert length_sorted_chunks(pairs, 2) == [[1, 3], [0, 2]]  # ties keep their order
    assert length_sorted_chunks(pairs, 1) == [[1, 3, 0, 2]]
    assert length_sorted_chunks(pairs[:2], 3) == [[1], [0]]  # no empty micro-batch


def test_micro_batches_give_the_gradient_of_one_padded_batch():
    tok = build_tokenizer()
    problems = generate_code(2, seed=0, tasks=("add", "head")) + [
        make_problem("math", "t", f"Compute {i} + 1.", answer=str(i + 1)) for i in range(4)]
    pairs = encode_pairs(problems, tok)  # code pairs are about twice as long as math pairs
    grads, losses = [], []
    for micro_batches in (1, 3):
        model = build_policy(vocab_size=len(tok), **TINY)
        losses.append(batch_loss_backward(model, pairs, pad_id=tok.pad_token_id,
                                          micro_batches=micro_batches))
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    assert torch.allclose(grads[0], grads[1], rtol=1e-4, atol=1e-7)


def test_band_distance_sums_how_far_each_family_is_outside_the_band():
    # math 0.1 is 0.1 below 0.2; code 0.9 is 0.3 above 0.6; reasoning 0.4 is inside
    assert band_distance({"math": 0.1, "code": 0.9, "reasoning": 0.4}, 0.2, 0.6) == \
        pytest.approx(0.4)
    assert band_distance({"math": 0.2, "code": 0.6}, 0.2, 0.6) == 0.0  # the ends are inside


def test_warm_up_keeps_the_weights_of_the_check_closest_to_the_band(monkeypatch, warm_up_config):
    # scripted validation pass@1 at steps 0, 2, 4; band [0.2, 0.6]:
    #   step 0: math 0.0, code 0.0 -> distance 0.2 + 0.2 = 0.4
    #   step 2: math 0.3, code 0.1 -> distance 0.1            (the best)
    #   step 4: math 0.3, code 0.9 -> distance 0.3; every family >= 0.2: the rule stops here
    script = iter([(0.0, 0.0), (0.3, 0.1), (0.3, 0.9)])
    weights_at_check = []

    def scripted(engine, *args, **kwargs):
        assert isinstance(engine, HfEngine) and engine.model is model  # the model it trains
        weights_at_check.append({k: v.clone() for k, v in engine.model.state_dict().items()})
        math, code = next(script)
        return {"family": {"math": {"pass_at_1": math}, "code": {"pass_at_1": code}}}, None

    monkeypatch.setattr(brorl.base.supervised, "evaluate_policy", scripted)
    tok = build_tokenizer()
    model = build_policy(vocab_size=len(tok), **TINY)
    problems = generate_code(4, seed=0, tasks=("add",)) + [
        make_problem("math", "t", f"Compute {i} + 1.", answer=str(i + 1)) for i in range(4)]
    config = warm_up_config(max_steps=10, eval_every=2, batch_size=4, lr=1e-2, seed=0,
                            target_pass_low=0.2, target_pass_high=0.6)
    history = warm_up(model, tok, problems, problems, config)
    assert [h["step"] for h in history] == [0, 2, 4]
    assert [h["band_distance"] for h in history] == pytest.approx([0.4, 0.1, 0.3])
    assert [h["selected"] for h in history] == [False, True, False]
    kept = model.state_dict()
    assert all(torch.equal(kept[k], weights_at_check[1][k]) for k in kept)
    assert not all(torch.equal(kept[k], weights_at_check[2][k]) for k in kept)


def _code_splits():
    """CI-sized data: the generated `add` and `subtract` templates (copying k and the name)."""
    return split_problems(generate_code(60, seed=0, tasks=("add", "subtract")), seed=0,
                          validation_fraction=0.15, test_fraction=0.25)


def test_warm_up_is_deterministic_for_a_seed(warm_up_config):
    splits = _code_splits()
    tok = build_tokenizer()
    config = warm_up_config(max_steps=3, eval_every=3, batch_size=4, lr=1e-3, seed=5,
                            target_pass_low=1.0, max_response_tokens=4)
    runs = []
    for _ in range(2):
        model = build_policy(vocab_size=len(tok), **TINY)
        warm_up(model, tok, splits["train"], splits["validation"][:4], config)
        runs.append(model.model.embed_tokens.weight.detach().clone())
    assert torch.equal(runs[0], runs[1])


def test_base_stage_at_ci_size_raises_held_out_pass_at_1(tmp_path, warm_up_config):
    """The base stage (`make_base_checkpoint`) from random weights on the `compare` task (the
    larger of two numbers): greedy pass@1 on ~100 unseen test problems rises from 0 to >= 0.3.

    Why `compare`, not the code templates: their copy-the-constant skill appears after a number
    of steps that moves with the CPU's rounding (on an Intel Xeon, 2026-11-26: validation 0.25
    at step 1000 and 0.325 at 1500, test 0.0 at 1000), so a CI-sized cap could not hold; here
    the validation target 0.8 was reached at step 1000 (test 0.47), the cap is 1500."""
    splits = split_problems(generate_math(400, seed=0, tasks=("compare",)), seed=0,
                            validation_fraction=0.15, test_fraction=0.25)
    test = splits["test"]
    tok = build_tokenizer()
    untrained = build_policy(vocab_size=len(tok), **TINY)
    engine = HfEngine(untrained, tok, max_concurrent_rollouts="auto")
    before, _ = evaluate_policy(engine, tok, test, n=1, max_new_tokens=48, temperature=0.0,
                                top_p=1.0, seed=0, verify=VerifyConfig(workers=2))
    # CI sizes and a greedy test; no band top or margin, no LR decay, no family shares
    save_policy(untrained, tok, tmp_path / "model")  # what the model stage writes
    config = warm_up_config(start=str(tmp_path / "model"), max_steps=1500, eval_every=100,
                            batch_size=16, lr=1e-2, seed=0, target_pass_low=0.8,
                            eval_per_family=12, test_samples=1, max_response_tokens=48,
                            verify=VerifyConfig(workers=2))
    model, tok, report = make_base_checkpoint(splits["train"], splits["validation"], test, config)
    after = report["test"]["family"]["math"]["pass_at_1"]
    print(json.dumps({"before": before["family"]["math"]["pass_at_1"], "after": after,
                      "steps": report["steps"], "seconds": report["train_seconds"]}))
    assert len(test) >= 90
    assert before["family"]["math"]["pass_at_1"] == 0.0  # random weights write no answer tag
    assert after >= 0.3  # at least 30 points above the untrained model on unseen problems
    assert report["history"][0]["step"] == 0 and report["steps"] <= 1500


def _ci_params(tmp_path) -> ExperimentParams:
    """A few problems and two warm-up steps of the TINY policy; constant LR, equal shares."""
    return ExperimentParams(
        data=DataParams(path=str(tmp_path / "problems"), seed=0, validation_fraction=0.2,
                        test_fraction=0.2, families={"math": {"per_task": 4}, "code": {"per_task": 5},
                                                         "reasoning": {"per_task": 4}}),
        model=ModelParams(**TINY, path=str(tmp_path / "model" / "checkpoint")),
        base=BaseParams(path=str(tmp_path / "base" / "ckpt"), target_pass_high=0.6, max_steps=2,
                        eval_every=2, batch_size=4, lr=1e-3, seed=0, target_pass_low=0.2,
                        eval_per_family=2, test_samples=1, eval_temperature=0.6, eval_top_p=0.95,
                        max_response_tokens=4, band_margin=0.0, warmup_steps=20,
                        min_lr_ratio=1.0, micro_batches=1, reached_share=1.0),
        tracking=TrackingParams(metrics_dir=str(tmp_path / "metrics")))


def _ci_tasks(tmp_path):
    """Run the `data`, `model` and `base` tasks through `.fn()` at a few-problem size; return
    outputs."""
    from tasks.base import train_base
    from tasks.data import build_data
    from tasks.model import make_model

    params = _ci_params(tmp_path)
    data = build_data.fn(params)
    make_model.fn(params)
    base = train_base.fn(params)
    return data, base


def test_data_and_base_tasks_write_splits_checkpoint_and_metrics(tmp_path):
    data, base = _ci_tasks(tmp_path)
    counts = json.loads((tmp_path / "counts.json").read_text())  # beside the splits
    assert counts == data["counts"] and counts["data/train/code"] > 0
    total = sum(counts[f"data/{split}/total"] for split in ("train", "validation", "test"))
    assert data["metrics_path"] == str(tmp_path / "metrics" / f"{tmp_path.name}.json")
    assert json.loads(Path(data["metrics_path"]).read_text()) == {"problems": total}  # headline
    assert (tmp_path / "problems" / "dataset_dict.json").is_file()
    report = json.loads((tmp_path / "base" / "report.json").read_text())
    metrics = report["metrics"]
    # the wall-clock metrics are beside the stage's folder (`brorl.runs.timings`), not in its report
    timings = json.loads((tmp_path / "base.timings.json").read_text())
    assert {**metrics, **{k: v for k, v in timings.items() if k != "history"}} == base["metrics"]
    assert "base/train_seconds" not in metrics and metrics["base/steps"] == 2.0
    assert json.loads((tmp_path / "base.machine.json").read_text()) == conditions()  # beside
    assert [h["step"] for h in timings["history"]] == [0, 2]
    assert {"base/pass_at_1_math", "base/pass_at_1_code", "base/pass_at_1_reasoning",
            "base/in_band"} <= set(metrics)
    assert base["metrics_path"] == str(tmp_path / "metrics" / "base.json")  # base.path's folder
    headline = json.loads(Path(base["metrics_path"]).read_text())  # the score per family
    assert headline == {f: round(metrics[f"base/score_{f}"], 4)
                        for f in ("math", "code", "reasoning")}
    model, _ = load_policy(base["path"])
    assert model.config.hidden_size == TINY["hidden_size"]
    history = report["history"]
    assert [h["step"] for h in history] == [0, 2]


@pytest.mark.slow
def test_data_and_base_flows_run_on_a_prefect_server(tmp_path, monkeypatch):
    from prefect.testing.utilities import prefect_test_harness

    from flows.base import base
    from flows.data import data
    from flows.model import model

    params = str(Path("params/tiny_ci.yaml").resolve())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    sizes = ["data.families.math.per_task=4", "data.families.code.per_task=5",
             "data.families.reasoning.per_task=4", "data.families.instruction=null",
             "base.max_steps=2", "base.eval_every=2", "base.eval_per_family=2",
             f"tracking.metrics_dir={tmp_path / 'metrics'}"]
    with prefect_test_harness(server_startup_timeout=120):
        counts = data(params_path=params, overrides=sizes)["counts"]
        model(params_path=params, overrides=sizes)
        summary = base(params_path=params, overrides=sizes)
    assert json.loads((tmp_path / "metrics/ci_data.json").read_text()) == {
        "problems": sum(n for k, n in counts.items() if k.endswith("/total"))}
    assert set(json.loads((tmp_path / "metrics/ci_base.json").read_text())) == {
        "math", "code", "reasoning"}
    assert load_policy(summary["path"])[0].config.hidden_size == 64  # tiny_ci.yaml's size
    import mlflow

    run = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(summary["mlflow_run_id"])
    assert run.data.metrics["base/steps"] == 2.0 and run.data.params["base.max_steps"] == "2"
