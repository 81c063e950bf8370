"""Knowledge shrinkage on the live policy (`brorl.train.diagnostics`): probe scoring, the metrics
of a known update, the solved / unsolved split, the first-order decomposition, and a real step."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from brorl.families.math import generate_math
from brorl.families.prompts import render_prompt, render_target
from brorl.params import load_params
from brorl.policy import load_policy
from brorl.train import Direct, Run, RunConfig, Trainer, TrainerConfig
from brorl.train.diagnostics import (
    build_probes,
    change_metrics,
    first_order_split,
    gradient,
    has_reference,
    probe_metrics,
    reference_probs,
    rollout_parts,
    since_start_metrics,
)
from brorl.train.ppo import score_batch
from brorl.train.rollouts import ScoredGroups
from brorl.types import Problem, RolloutBatch
from brorl.verifiers import Verdict, VerifyConfig

ROOT = Path(__file__).resolve().parents[1]


def _manual_probs(model, tokenizer, problem: Problem, temperature: float) -> list[float]:
    """The reference tokens' probabilities by one plain forward (independent of the module)."""
    prompt = tokenizer(render_prompt(problem, tokenizer), add_special_tokens=False)["input_ids"]
    target = tokenizer(render_target(problem), add_special_tokens=False)["input_ids"]
    target = target + [tokenizer.eos_token_id]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + target])).logits[0].double()
    probs = torch.softmax(logits / temperature, dim=-1)
    return [float(probs[len(prompt) - 1 + i, tok]) for i, tok in enumerate(target)]


def test_change_metrics_by_hand():
    before = torch.tensor([[0.5, 0.2, 0.9], [0.1, 0.0, 0.0]])
    after = torch.tensor([[0.6, 0.1, 0.9], [0.4, 0.7, 0.0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])  # 4 tokens; padding ignored
    m = change_metrics(before, after, mask, "x")
    assert m["x/q_pos"] == pytest.approx((0.6 + 0.1 + 0.9 + 0.4) / 4)
    assert m["x/q_pos_delta"] == pytest.approx((0.1 - 0.1 + 0.0 + 0.3) / 4)
    assert m["x/pct_improved"] == pytest.approx(50.0)  # 0.5->0.6 and 0.1->0.4 rose; 0.9 did not
    assert m["x/worst_drop"] == pytest.approx(-0.1)
    assert m["x/tokens"] == 4.0
    assert change_metrics(before, after, torch.zeros_like(mask), "x") == {}
    start = torch.tensor([[0.7, 0.0, 0.5], [0.4, 0.0, 0.0]])
    cumulative = since_start_metrics(start, after, mask, "x")
    assert cumulative == {"x/pct_improved_since_start": pytest.approx(50.0),
                          "x/worst_drop_since_start": pytest.approx(-0.1)}


def test_probe_probabilities_match_a_plain_forward_and_a_uniform_update_is_known(easy_base):
    model, tokenizer = load_policy(easy_base)
    problems = generate_math(6, seed=3, tasks=("compare",))
    probes = build_probes(problems, tokenizer)
    assert len(probes) == 6 and probes.batch.rollouts_per_prompt == 1
    before = reference_probs(model, probes, 1.2, micro_batch_rollouts=4)
    for row, problem in enumerate(problems):
        manual = _manual_probs(model, tokenizer, problem, 1.2)
        length = int(probes.batch.response_lengths[row])
        assert length == len(manual)
        assert before[row, :length].tolist() == pytest.approx(manual, rel=1e-4)
        assert before[row, length:].abs().sum() == 0  # padding stays 0
    # an update with a known effect: zero output weights make every token 1/V
    after_model = copy.deepcopy(model)
    with torch.no_grad():
        after_model.get_output_embeddings().weight.zero_()
    after = reference_probs(after_model, probes, 1.2, micro_batch_rollouts=4)
    uniform = 1.0 / after_model.config.vocab_size
    mask = probes.mask
    assert torch.allclose(after[mask], torch.full_like(after[mask], uniform))
    m = probe_metrics(probes, before, after, "diag/heldout", start=before)
    b = before[mask].double()
    assert m["diag/heldout/q_pos"] == pytest.approx(uniform)
    assert m["diag/heldout/q_pos_delta"] == pytest.approx(uniform - float(b.mean()), rel=1e-5)
    improved = 100 * float((b < uniform).double().mean())
    assert m["diag/heldout/pct_improved"] == pytest.approx(improved)
    assert m["diag/heldout/worst_drop"] == pytest.approx(uniform - float(b.max()), rel=1e-5)
    assert m["diag/heldout/probes"] == 6.0
    assert m["diag/heldout_math/q_pos"] == pytest.approx(uniform)  # one family: the same set
    assert m["diag/heldout/worst_drop_since_start"] == m["diag/heldout/worst_drop"]


def test_probes_skip_problems_without_a_reference():
    code = Problem(id="c", family="code", task="t", prompt="p", tests=("assert f(1) == 1",))
    math = Problem(id="m", family="math", task="t", prompt="p", answer="3")
    assert not has_reference(code) and has_reference(math)
    assert has_reference(replace(code, metadata={"solution": "def f(x):\n    return x"}))


def _batch(model, tokenizer, problems: list[Problem], n: int, seed: int) -> RolloutBatch:
    """n random responses per problem, their engine log-probs the trainer's own (TIS ratio 1)."""
    gen = torch.Generator().manual_seed(seed)
    prompts = [tuple(tokenizer(render_prompt(p, tokenizer), add_special_tokens=False)["input_ids"])
               for p in problems]
    rows, width = len(problems) * n, 6
    ids = torch.randint(4, model.config.vocab_size, (rows, width), generator=gen)
    lengths = torch.randint(3, width + 1, (rows,), generator=gen)
    batch = RolloutBatch(
        prompt_index=torch.arange(len(problems)).repeat_interleave(n), prompt_ids=tuple(prompts),
        response_ids=ids, response_lengths=lengths, logprobs=torch.zeros(rows, width),
        texts=tuple("" for _ in range(rows)), finish_reasons=tuple("stop" for _ in range(rows)),
        rollouts_per_prompt=n, pad_id=0)
    return replace(batch, logprobs=score_batch(model, batch, 1.0, 8))


def test_the_decomposition_sums_to_the_first_order_change_and_predicts_a_small_step(easy_base):
    """correct + incorrect = the first-order change of the whole loss (linearity of the split);
    a plain gradient step of a small size changes the probes' Q_pos by about that much."""
    model, tokenizer = load_policy(easy_base)
    model.train()
    problems = generate_math(3, seed=5, tasks=("compare",))
    batch = _batch(model, tokenizer, problems, n=4, seed=0)
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]],
                           dtype=torch.float64)
    groups = ScoredGroups(tuple(problems), batch, rewards, tuple("x" for _ in range(12)))
    config = replace(TrainerConfig.from_params(load_params(ROOT / "params/tiny_ci.yaml")),
                     temperature=1.0, micro_batch_rollouts=5)
    probes = build_probes(generate_math(4, seed=9, tasks=("compare",)), tokenizer)

    def q_pos(m) -> torch.Tensor:
        from brorl.train.ppo import response_logprobs

        logp, _ = response_logprobs(m, probes.batch, torch.arange(len(probes)), 1.0)
        mask = probes.mask[:, : logp.shape[1]]
        return (logp.exp() * mask).sum() / mask.sum()

    reference = copy.deepcopy(model).eval()
    parts = rollout_parts(model, reference, groups, config)
    lr = 1e-3
    split = first_order_split(model, lambda: q_pos(model), parts, lr)
    assert set(split) == {"correct", "incorrect", "first_order"}
    assert split["correct"] != 0 and split["incorrect"] != 0
    params = [p for p in model.parameters() if p.requires_grad]
    whole = gradient(params, lambda backward: [run(backward) for run in parts.values()])
    grad_f = gradient(params, lambda backward: backward(q_pos(model)))
    direct = -lr * sum(float((a.double() * b.double()).sum()) for a, b in zip(grad_f, whole))
    assert split["correct"] + split["incorrect"] == pytest.approx(direct, rel=1e-6)
    assert split["first_order"] == pytest.approx(direct, rel=1e-6)
    # the realised change of a plain step of size 3e-4 each way: its odd part (the central
    # difference, second-order terms cancelled) is the first-order prediction (one-sided steps
    # of this tiny model still carry 14% of curvature at 1e-4, measured)
    lr = 3e-4
    predicted = first_order_split(model, lambda: q_pos(model), parts, lr)["first_order"]
    moved = {sign: copy.deepcopy(model) for sign in (-1, 1)}
    with torch.no_grad():
        for sign, m in moved.items():
            for p, g in zip([p for p in m.parameters() if p.requires_grad], whole):
                p -= sign * lr * g
        realised = (float(q_pos(moved[1])) - float(q_pos(moved[-1]))) / 2
    assert realised == pytest.approx(predicted, rel=0.05)


def test_collection_records_every_drawn_prompt_with_whether_it_was_solved(easy_base, tmp_path):
    from brorl.algorithm.filtering import InformativeCollector
    from brorl.train.collection import Collection

    model, tokenizer = load_policy(easy_base)
    problems = generate_math(3, seed=5, tasks=("compare",))
    batch = _batch(model, tokenizer, problems, n=4, seed=1)
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]],
                           dtype=torch.float64)
    collection = Collection(InformativeCollector(3, 1), 4, None)
    collection.add(ScoredGroups(tuple(problems), batch, rewards, tuple("x" for _ in range(12))))
    collected = collection.finish()
    assert collected.groups is not None and collected.groups.num_groups == 1  # only the mixed one
    assert collected.drawn == ((problems[0], True), (problems[1], False), (problems[2], True))


def _tiny_run(easy_base: Path, problems, tmp_path: Path, reward_fn, **diagnostics) -> Run:
    params = load_params(ROOT / "params/tiny_ci.yaml")
    config = replace(TrainerConfig.from_params(params), init_checkpoint=str(easy_base),
                     checkpoint_dir=str(tmp_path / "ckpt"), prompts_per_step=3,
                     rollouts_per_prompt=4, lr=1e-3, mini_batches_per_step=1,
                     micro_batch_rollouts=12, temperature=1.0, max_response_tokens=12,
                     filter_max_draws=1, verify=VerifyConfig(workers=1))
    run_config = RunConfig.from_params(params, ROOT)
    run_config = replace(run_config, run_dir=str(tmp_path / "run"), steps=10**6,
                         eval_every=10**6, checkpoint_every=1, save_rollouts=False,
                         diagnostics=replace(run_config.diagnostics, **diagnostics))
    trainer = Trainer(config, problems, reward_fn=reward_fn)
    return Run(trainer, run_config, {}, generate_math(4, seed=11, tasks=("compare",)))


class _SlowDiagnosticsClock:
    """`time` for brorl.train.run and brorl.train.diagnostics: the real clock, plus `PROBE_S`
    seconds for each probe scoring (`Shrinkage._probs`), as if the diagnostics were slow."""

    PROBE_S = 1000.0

    def __init__(self) -> None:
        import time

        self.real, self.offset, self.probes = time.perf_counter, 0.0, 0

    def perf_counter(self) -> float:
        return self.real() + self.offset

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from brorl.train import diagnostics, run

        real_probs = diagnostics.Shrinkage._probs

        def slow_probs(shrinkage, model, probes):
            self.offset += self.PROBE_S
            self.probes += 1
            return real_probs(shrinkage, model, probes)

        monkeypatch.setattr(diagnostics.Shrinkage, "_probs", slow_probs)
        monkeypatch.setattr(run, "time", self)
        monkeypatch.setattr(diagnostics, "time", self)


def test_a_real_step_logs_the_diagnostics_outside_training_time(easy_base, easy_split, tmp_path,
                                                                monkeypatch):
    def alternating(problems, responses):  # rollout i correct iff i is odd: every group mixed
        return [Verdict(float(i % 2), "x") for i in range(len(problems))]

    def second_unsolved(problems, responses):  # groups of 4: group 1 all wrong, others mixed
        return [Verdict(0.0 if i // 4 == 1 else float(i % 2), "x") for i in range(len(problems))]

    run = _tiny_run(easy_base, easy_split.train, tmp_path / "a", alternating, decompose=True)
    clock = _SlowDiagnosticsClock()
    clock.install(monkeypatch)
    m = run.step(Direct())
    monkeypatch.undo()
    assert m["diag/heldout/probes"] == 4.0 and m["diag/heldout/tokens"] > 0
    assert 0 < m["diag/heldout/q_pos"] < 1 and m["diag/heldout/q_pos_delta"] != 0
    assert m["diag/solved/probes"] == 3.0 and m["diag/unsolved/probes"] == 0.0
    assert "diag/unsolved/q_pos" not in m
    assert m["diag/decompose/first_order"] == pytest.approx(
        m["diag/decompose/correct"] + m["diag/decompose/incorrect"])
    # the clock ran PROBE_S further for each probe scoring (before and after the update): the
    # diagnostics took that long, the update stage did not
    slow = clock.probes * clock.PROBE_S
    assert clock.probes >= 2 and slow <= m["time/diagnostics"] < slow + clock.PROBE_S
    assert 0 < m["time/ppo_update"] < clock.PROBE_S  # its wall time minus the diagnostics'
    assert m["train/seconds"] == pytest.approx(sum(m[f"time/{s}"] for s in (
        "sample_prompts", "generate_rollouts", "verify", "filter", "ppo_update")))
    assert m["train/seconds"] < clock.PROBE_S  # training time never counts them
    start = run.state.probe_start
    assert start is not None and len(start) == m["diag/heldout/tokens"]
    # a resumed run restores the start probabilities from its checkpoint
    resumed = _tiny_run(easy_base, easy_split.train, tmp_path / "a", alternating, decompose=True)
    assert resumed.state.probe_start == start
    assert torch.equal(resumed.shrinkage.start[resumed.shrinkage.heldout.mask],
                       torch.tensor(start, dtype=torch.float32))
    # solved and unsolved drawn prompts, split (the unsolved group is dropped by the filter but
    # still probed); with a cap of 1 per class
    split = _tiny_run(easy_base, easy_split.train, tmp_path / "b", second_unsolved)
    m = split.step(Direct())
    assert (m["diag/solved/probes"], m["diag/unsolved/probes"]) == (2.0, 1.0)
    assert {"diag/solved/q_pos", "diag/unsolved/q_pos", "diag/unsolved/worst_drop"} <= set(m)
    assert not any(k.startswith("diag/decompose/") for k in m)  # off unless asked
    capped = _tiny_run(easy_base, easy_split.train, tmp_path / "c", second_unsolved,
                       step_probes=1)
    m = capped.step(Direct())
    assert (m["diag/solved/probes"], m["diag/unsolved/probes"]) == (1.0, 1.0)


def test_diagnostics_change_no_training_result(easy_base, easy_split, tmp_path):
    """Forward passes only: the weights after a step are the same with and without them."""
    def alternating(problems, responses):
        return [Verdict(float(i % 2), "x") for i in range(len(problems))]

    from brorl.train import parameter_digest

    on = _tiny_run(easy_base, easy_split.train, tmp_path / "on", alternating)
    on.step(Direct())
    off = _tiny_run(easy_base, easy_split.train, tmp_path / "off", alternating, enabled=False)
    metrics = off.step(Direct())
    assert off.shrinkage is None and not any(k.startswith("diag/") for k in metrics)
    assert parameter_digest(on.trainer.model) == parameter_digest(off.trainer.model)
