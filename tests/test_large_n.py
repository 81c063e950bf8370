"""Large N in bounded memory: an N = 4096 step at CI size, and training on a subset of each group
(`update.train_subset`, PODS' max-variance rule): its params rules, the row selection, and a
trainer update that scores and trains only the chosen B x M rollouts."""

from __future__ import annotations

import math
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest
import torch

from brorl.algorithm.advantages import compute_advantages
from brorl.algorithm.downsample import max_variance_subset
from brorl.params import ParamsError, UpdateParams, load_params
from brorl.policy import build_policy, build_tokenizer, save_policy
from brorl.train import Trainer, TrainerConfig
from brorl.train import trainer as trainer_module
from brorl.train.rollouts import ScoredGroups, select_rollouts
from brorl.types import Problem, RolloutBatch
from brorl.verifiers import Verdict, VerifyConfig
from tests.devices import DEVICES
from tests.test_train import _config, _run, _steps

ROOT = Path(__file__).resolve().parents[1]


# -- params -----------------------------------------------------------------------------------
@pytest.mark.parametrize("m", [1, 16, 40])
def test_a_subset_outside_two_to_n_minus_one_is_refused_naming_the_field(m):
    with pytest.raises(ValueError, match=f"update.train_subset = {m} must be at least 2 and below "
                                         "rollouts_per_prompt = 16"):
        UpdateParams(prompts_per_step=4, rollouts_per_prompt=16, train_subset=m)


def test_a_zero_subset_is_refused_when_params_load():
    with pytest.raises(ParamsError, match="update.train_subset"):
        load_params(ROOT / "params/brorl_ci.yaml", ["update.train_subset=0"])


def test_the_lr_and_the_mini_batches_follow_the_rollouts_trained():
    u = UpdateParams(prompts_per_step=2, rollouts_per_prompt=512, train_subset=64, base_lr=1e-4,
                     base_samples_per_step=128, mini_batches_per_step=4)
    assert (u.samples_per_step, u.trained_per_step) == (1024, 128)  # 2 x 512 made, 2 x 64 trained
    assert u.lr == pytest.approx(1e-4)  # 1e-4 * sqrt(128 / 128)
    assert u.mini_batch_rollouts == 32  # 128 / 4
    full = UpdateParams(prompts_per_step=2, rollouts_per_prompt=512, base_lr=1e-4,
                        base_samples_per_step=128, mini_batches_per_step=4)
    assert full.lr == pytest.approx(1e-4 * math.sqrt(8)) and full.trained_per_step == 1024


def test_b_times_m_must_split_into_the_mini_batches():
    # B * N = 2 * 16 = 32 splits into 4, but B * M = 2 * 3 = 6 does not
    with pytest.raises(ValueError, match="prompts_per_step \\* train_subset = 6 rollouts trained"):
        UpdateParams(prompts_per_step=2, rollouts_per_prompt=16, train_subset=3,
                     mini_batches_per_step=4)


def test_trainer_config_carries_the_subset_and_refuses_a_bad_one():
    params = load_params(ROOT / "params/brorl_ci.yaml", ["update.train_subset=32"])
    config = TrainerConfig.from_params(params)
    assert config.train_subset == 32 and config.lr == pytest.approx(params.update.lr)
    plain = TrainerConfig.from_params(load_params(ROOT / "params/brorl_ci.yaml"))
    assert plain.train_subset is None
    from dataclasses import replace

    with pytest.raises(ValueError, match="update.train_subset"):
        replace(config, train_subset=config.rollouts_per_prompt)


# -- the row selection ------------------------------------------------------------------------
def _groups(b: int, n: int) -> ScoredGroups:
    """b problems x n rollouts with distinct texts, lengths and rewards, prompt-major."""
    rows = b * n
    lengths = torch.tensor([1 + r % 3 for r in range(rows)])
    ids = torch.arange(rows * 3).view(rows, 3) + 10
    ids = torch.where(torch.arange(3)[None, :] < lengths[:, None], ids, 0)
    batch = RolloutBatch(
        prompt_index=torch.arange(b).repeat_interleave(n),
        prompt_ids=tuple((1, 2 + i) for i in range(b)), response_ids=ids,
        response_lengths=lengths, logprobs=-ids.float() / 100,
        texts=tuple(f"t{r}" for r in range(rows)),
        finish_reasons=tuple("stop" if r % 2 else "length" for r in range(rows)),
        rollouts_per_prompt=n)
    problems = tuple(Problem(id=f"p{i}", family="math", task="t", prompt=str(i)) for i in range(b))
    rewards = torch.arange(rows, dtype=torch.float64).view(b, n) / rows
    return ScoredGroups(problems, batch, rewards, tuple(f"r{r}" for r in range(rows)))


def test_selecting_rollouts_keeps_m_per_group_prompt_major():
    groups = _groups(b=2, n=4)
    picked = groups.select_rollouts(torch.tensor([[0, 3], [1, 2]]))
    # rows 0, 3 of prompt 0 and rows 4 + 1, 4 + 2 of prompt 1
    assert picked.batch.texts == ("t0", "t3", "t5", "t6")
    assert picked.reasons == ("r0", "r3", "r5", "r6")
    assert picked.batch.rollouts_per_prompt == 2 and picked.problems == groups.problems
    assert picked.batch.prompt_index.tolist() == [0, 0, 1, 1]
    assert picked.batch.prompt_ids == groups.batch.prompt_ids
    assert picked.rewards.tolist() == [[0 / 8, 3 / 8], [5 / 8, 6 / 8]]
    assert picked.batch.response_lengths.tolist() == [1, 1, 3, 1]  # 1 + row % 3
    assert picked.batch.response_ids.shape == (4, 3)  # trimmed to the longest kept (3)
    assert torch.equal(picked.batch.response_ids[2], groups.batch.response_ids[5])
    assert torch.equal(picked.batch.logprobs[1, :1], groups.batch.logprobs[3, :1])
    assert picked.batch.finish_reasons == ("length", "stop", "stop", "length")


def test_selecting_rollouts_refuses_an_index_of_the_wrong_shape_or_range():
    batch = _groups(b=2, n=4).batch
    with pytest.raises(ValueError, match="one row per prompt"):
        select_rollouts(batch, torch.tensor([[0, 1]]))
    with pytest.raises(ValueError, match=r"must be in 0\.\.3"):
        select_rollouts(batch, torch.tensor([[0, 4], [1, 2]]))


# -- the trainer ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def random_base(tmp_path_factory) -> Path:
    """A random-weight tiny policy (the CI model's shape): its rollouts cost little to make."""
    tokenizer = build_tokenizer()
    model = build_policy(vocab_size=len(tokenizer), hidden_size=64, num_layers=2, num_heads=2,
                         num_kv_heads=1, intermediate_size=128, max_position_embeddings=128)
    path = tmp_path_factory.mktemp("random") / "base"
    save_policy(model, tokenizer, path)
    return path


def _needs(device: str) -> None:
    """The Trainer picks CUDA whenever it is present: there, its `cuda` case is the run."""
    if device == "cpu" and torch.cuda.is_available():
        pytest.skip("the Trainer runs on CUDA on this machine: see the test's cuda case")


def _graded(problems, responses) -> list[Verdict]:
    """A deterministic graded reward in {0, 1/6, ..., 1} from the response's characters."""
    return [Verdict((sum(map(ord, r)) % 7) / 6, "graded") for r in responses]


@pytest.mark.parametrize("device", DEVICES)
def test_an_update_on_a_subset_scores_and_trains_exactly_the_max_variance_b_times_m(
        device, random_base, tmp_path, monkeypatch):
    _needs(device)
    b, n, m = 2, 32, 4
    config = _config(random_base, tmp_path / "ck", prompts_per_step=b, rollouts_per_prompt=n,
                     train_subset=m, mini_batches_per_step=2, max_response_tokens=6)
    problems = [Problem(id=f"p{i}", family="math", task="t", prompt=f"{i}+1=", answer=str(i + 1))
                for i in range(b)]
    trainer = Trainer(config, problems, reward_fn=_graded, resume=False)
    assert trainer.device.type == device
    groups = trainer.verify(problems, trainer.generate_rollouts(problems, 0))
    chosen = groups.select_rollouts(max_variance_subset(groups.rewards, m))
    scored: list[tuple[str, ...]] = []
    original = trainer_module.score_batch

    def spy(model, batch, *args, **kwargs):
        scored.append(batch.texts)
        return original(model, batch, *args, **kwargs)

    monkeypatch.setattr(trainer_module, "score_batch", spy)
    metrics = trainer.update(groups)
    assert metrics["update/trained_rollouts"] == b * m and metrics["update/optimizer_steps"] == 2
    # old and reference log-probs were scored on the chosen rows only (kl_coef > 0)
    assert scored == [chosen.batch.texts, chosen.batch.texts]
    # advantages and the reward mean are the subset's, not the whole groups'
    subset_adv = compute_advantages(chosen.rewards, "reinforce_pp_baseline")
    assert metrics["update/advantage_abs_mean"] == pytest.approx(float(subset_adv.abs().mean()))
    assert metrics["update/reward_mean"] == pytest.approx(float(chosen.rewards.mean()))
    full_adv = compute_advantages(groups.rewards, "reinforce_pp_baseline")
    assert abs(float(full_adv.abs().mean()) - float(subset_adv.abs().mean())) > 0.05
    # the max-variance M have a larger reward spread than the whole group
    assert (chosen.rewards.var(dim=1, unbiased=False) >= groups.rewards.var(dim=1, unbiased=False)
            ).all()


@pytest.mark.parametrize("device", DEVICES)
def test_a_step_of_4096_rollouts_per_prompt_trains_each_rollout_by_its_own_reward(
        device, random_base, tmp_path):
    """Real hf generation (chunks of 256), graded rewards (every group has a spread, so every
    rollout has an advantage), the filter off, PPO in 4 mini-batches of 32 micro-batches.

    Row mapping end to end: each rollout's text is its own tokens, its reward its own text's,
    the trainer's log-probs its engine log-probs row by row (TIS weights 1), and the update moves
    each rollout's log-probability in the direction of its own advantage: over the 4,096 rows the
    correlation of the change with the advantage is far above what a shuffled mapping gives
    (about 0 +- 0.016)."""
    from brorl.policy.tokens import decode_responses
    from brorl.train.ppo import score_batch
    from brorl.train.rollouts import response_mask

    _needs(device)
    b, n = 1, 4096
    config = _config(random_base, tmp_path / "ck", prompts_per_step=b, rollouts_per_prompt=n,
                     max_response_tokens=8, micro_batch_rollouts=128, mini_batches_per_step=4,
                     filter_enabled=False, verify=VerifyConfig(workers=2))
    config = replace(config, engine=replace(config.engine, max_concurrent_rollouts=256))
    problems = [Problem(id="p0", family="math", task="t", prompt="2+3=", answer="5")]
    run = _run(config, problems, tmp_path / "run", checkpoint_every=100, reward_fn=_graded)
    trainer, seen = run.trainer, []
    assert trainer.device.type == device
    real_update = trainer.update

    def update(groups):  # each row's log-probability under the policy before and after
        score = partial(score_batch, trainer.model, groups.batch, config.temperature, 128)
        before = score()
        out = real_update(groups)
        seen.append((groups, before, score()))
        return out

    trainer.update = update
    [metrics] = _steps(run, 1)
    assert metrics["generate/rollouts"] == b * n
    assert trainer.rollout_engine.last_peak_rows == 256  # never more rows decoded at once
    assert metrics["filter/groups_kept"] == b and metrics["update/skipped"] == 0.0
    assert metrics["update/trained_rollouts"] == b * n and metrics["update/optimizer_steps"] == 4
    [(groups, before, after)] = seen
    batch = groups.batch
    lengths = batch.response_lengths.tolist()
    assert list(batch.texts) == decode_responses(
        trainer.tokenizer, [row[:k].tolist() for row, k in zip(batch.response_ids, lengths)])
    assert groups.rewards.flatten().tolist() == [v.reward for v in _graded(None, batch.texts)]
    assert metrics["verify/reward_mean"] == pytest.approx(float(groups.rewards.mean()))
    assert 0.1 < float(groups.rewards.std()) and metrics["update/advantage_abs_mean"] > 0.1
    mask = response_mask(batch)
    assert float((before - batch.logprobs)[mask].abs().max()) < 1e-4  # scored row by row
    assert metrics["update/tis_weight_mean"] == pytest.approx(1.0, abs=1e-4)
    advantages = compute_advantages(groups.rewards, config.advantage_estimator).flatten()
    change = ((after - before) * mask).sum(dim=1).double()  # each rollout's log-prob change
    corr = float(torch.corrcoef(torch.stack([change, advantages]))[0, 1])
    assert corr > 0.1, corr  # 0.32 on an Intel Xeon; a shuffled mapping: 0 +- 0.016
