"""Trainer building blocks without DeepSpeed: groups, cursor, log-probs, accumulation, checkpoints."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from brorl.algorithm.losses import LossConfig
from brorl.engines import SamplingConfig
from brorl.engines.hf import HfEngine
from brorl.params import UpdateParams, load_params
from brorl.policy import build_policy, build_tokenizer
from brorl.train import checkpoint as ckpt
from brorl.train.config import TrainerConfig
from brorl.train.ppo import accumulate_mini_batch, response_logprobs, score_batch
from brorl.train.rollouts import ScoredGroups, concat, response_mask
from brorl.train.sampler import PromptSampler, SamplerState, continue_stream, run_record
from brorl.types import Problem
from tests.devices import DEVICES
from tests.tiny_models import ARCHITECTURES, tiny_model

PROBLEMS = [Problem(id=f"p{i}", family="math", task="t", prompt=f"{i}+{i}=", answer=str(2 * i))
            for i in range(10)]
LOSS = LossConfig.from_params(UpdateParams())
"""The schema's loss options (clip band 0.2 / 0.28, truncated TIS at 5, k2 KL)."""


@pytest.fixture(scope="module", params=DEVICES)
def policy(request):
    tokenizer = build_tokenizer()
    model = build_policy(vocab_size=len(tokenizer), hidden_size=64, num_layers=2, num_heads=2,
                         num_kv_heads=1, intermediate_size=128, max_position_embeddings=128)
    return model.to(request.param), tokenizer


@pytest.fixture(scope="module")
def groups(policy):
    """3 prompts x 4 rollouts from the hf engine, with made-up rewards per rollout."""
    model, tokenizer = policy
    engine = HfEngine(model, tokenizer, max_concurrent_rollouts=5)
    batch = engine.generate([p.prompt for p in PROBLEMS[:3]], 4,
                            SamplingConfig(temperature=1.0, top_p=1.0, max_response_tokens=12,
                                           seed=3))
    rewards = torch.tensor([[1.0, 0, 0, 1], [0, 0, 0, 0], [0.5, 1, 0, 0]], dtype=torch.float64)
    reasons = tuple(f"r{i}" for i in range(12))
    return ScoredGroups(tuple(PROBLEMS[:3]), batch, rewards, reasons)


def test_select_then_concat_restores_the_groups(groups):
    first, rest = groups.select(torch.tensor([0])), groups.select(torch.tensor([1, 2]))
    assert first.reasons == ("r0", "r1", "r2", "r3") and rest.problems == tuple(PROBLEMS[1:3])
    joined = concat([first, rest])
    assert joined.problems == groups.problems and joined.reasons == groups.reasons
    assert torch.equal(joined.rewards, groups.rewards)
    assert joined.batch.texts == groups.batch.texts
    mask = response_mask(groups.batch)
    t = joined.batch.response_ids.shape[1]
    assert torch.equal(joined.batch.response_ids[:, :t] * response_mask(joined.batch),
                       groups.batch.response_ids[:, :t] * mask[:, :t])
    assert torch.equal(joined.batch.prompt_index, torch.arange(3).repeat_interleave(4))


def test_scored_groups_reject_mismatched_shapes(groups):
    with pytest.raises(ValueError, match="same 3 groups"):
        ScoredGroups(groups.problems, groups.batch, groups.rewards[:2], groups.reasons)


def test_sampler_is_seeded_resumable_and_covers_each_epoch_once():
    a = PromptSampler(PROBLEMS, seed=1)
    first = a.take(4) + a.take(6)
    assert sorted(p.id for p in first) == sorted(p.id for p in PROBLEMS)  # one epoch, no repeat
    assert [p.id for p in first] != [p.id for p in PROBLEMS]  # shuffled
    state = SamplerState(**vars(a.state))
    after = [p.id for p in a.take(13)]  # crosses into epochs 1 and 2
    b = PromptSampler(PROBLEMS, seed=1, state=state)
    assert [p.id for p in b.take(13)] == after
    assert [p.id for p in PromptSampler(PROBLEMS, seed=2).take(10)] != [p.id for p in first]


def test_trainer_logprobs_equal_the_engines_sampling_logprobs(policy, groups):
    """At top_p = 1 the trainer's log pi(y_t) is the engine's (same model, same temperature)."""
    model, _ = policy
    scored = score_batch(model, groups.batch, temperature=1.0, micro_batch_rollouts=5)
    assert torch.allclose(scored, groups.batch.logprobs, atol=1e-5)
    some = torch.tensor([2, 7])
    partial = score_batch(model, groups.batch, 1.0, 5, rows=some)
    assert torch.equal(partial[some], scored[some]) and partial[[0, 1, 3]].abs().sum() == 0


def test_scoring_prefills_each_prompt_once_across_micro_batches(policy, groups, monkeypatch):
    """3 prompts x 4 rows in micro-batches of 3: prompts 0 and 1 straddle two micro-batches
    each, yet each prompt is prefilled once (one call per prompt as it first appears), and the
    log-probs equal those of one micro-batch holding every row."""
    import brorl.train.ppo as ppo

    model, _ = policy
    whole = score_batch(model, groups.batch, 1.0, 12)
    calls, real = [], ppo.prefill

    def counting(model, prompts, device):
        calls.append(len(prompts))
        return real(model, prompts, device)

    monkeypatch.setattr(ppo, "prefill", counting)
    split = score_batch(model, groups.batch, 1.0, 3)
    assert calls == [1, 1, 1]  # micro-batches hold prompts {0}, {0, 1}, {1}, {2}
    assert torch.allclose(split, whole, atol=1e-5)


def _ids(problems) -> list[str]:
    return [p.id for p in problems]


def _round_trip(record: dict) -> dict:
    return json.loads(json.dumps(record))  # as run.json stores it


def test_continuing_with_the_same_seed_takes_up_the_saved_cursor_exactly():
    warm = PromptSampler(PROBLEMS, seed=1)
    warm.take(7)
    record = _round_trip(run_record(1, 5, warm.state, "data/problems", len(PROBLEMS)))
    offset, state = continue_stream(record, seed=1, problems=len(PROBLEMS))
    assert offset == 5
    assert _ids(PromptSampler(PROBLEMS, 1, state).take(13)) == _ids(warm.take(13))


def test_another_seed_draws_the_unseen_rest_of_the_epoch_first_then_its_own_epochs():
    warm = PromptSampler(PROBLEMS, seed=1)
    seen = set(_ids(warm.take(4)))
    record = _round_trip(run_record(1, 3, warm.state, "data/problems", len(PROBLEMS)))
    _, state = continue_stream(record, seed=2, problems=len(PROBLEMS))
    arm = PromptSampler(PROBLEMS, 2, state)
    rest = _ids(arm.take(6))
    assert set(rest) == {p.id for p in PROBLEMS} - seen  # the 6 unseen, none of the 4 again
    assert rest != _ids(warm.take(6))  # in an order of its own seed
    own = PromptSampler(PROBLEMS, 2, SamplerState(epoch=1)).take(10)
    assert _ids(arm.take(10)) == _ids(own)  # then seed 2's own epoch 1


def test_a_continued_stream_resumes_exactly_and_continues_again():
    warm = PromptSampler(PROBLEMS, seed=1)
    warm.take(4)
    _, state = continue_stream(_round_trip(run_record(1, 3, warm.state, "d", 10)), 2, 10)
    arm = PromptSampler(PROBLEMS, 2, state)
    arm.take(3)  # 3 of the epoch's 6 unseen
    saved = _round_trip(vars(arm.state))  # what a checkpoint holds
    resumed = PromptSampler(PROBLEMS, 2, SamplerState(**saved))
    left = _ids(arm.take(3))
    assert _ids(resumed.take(3)) == left
    # a third run (seed 3) continuing the arm's end-of-run record mid-epoch draws its 3 unseen
    arm = PromptSampler(PROBLEMS, 2, SamplerState(**saved))
    _, state = continue_stream(_round_trip(run_record(2, 9, arm.state, "d", 10)), 3, 10)
    assert sorted(_ids(PromptSampler(PROBLEMS, 3, state).take(3))) == sorted(left)


def test_a_continuation_over_another_problem_list_is_refused():
    record = run_record(1, 3, SamplerState(0, 4), "outputs/data/problems", 2074)
    with pytest.raises(ValueError, match="continue_stream: false"):
        continue_stream(record, seed=1, problems=len(PROBLEMS))




def _grads_after(model, groups, micro: int, count: int | None = None) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    batch = groups.batch
    mask = response_mask(batch)
    adv = (groups.rewards - groups.rewards.mean(1, keepdim=True)).float().reshape(-1, 1) * mask
    with torch.no_grad():
        old = score_batch(model, batch, 1.0, 64) - 0.05 * mask  # ratios != 1: clipping is live
    rows = torch.tensor([0, 3, 5, 6, 8, 9, 11])
    accumulate_mini_batch(
        model, lambda loss: loss.backward(), batch, rows, advantages=adv, old_logp=old,
        engine_logp=old + 0.1 * mask, ref_logp=old, temperature=1.0, micro_batch_rollouts=micro,
        normaliser=float(mask[rows].sum()), num_micro_batches=count,
        loss=replace(LOSS, kl_coef=0.1, tis_cap=1.05))
    return [p.grad.clone() for p in model.parameters()]


def test_gradients_do_not_depend_on_the_micro_batch_split(policy, groups):
    model, _ = policy
    model.train()
    whole = _grads_after(model, groups, micro=64)
    assert sum(float(g.abs().sum()) for g in whole) > 0
    for micro, count in ((1, None), (3, None), (2, 6)):  # (2, 6): two empty micro-batches
        split = _grads_after(model, groups, micro, count)
        for a, b in zip(whole, split):
            assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)
    model.zero_grad(set_to_none=True)
    model.eval()
    with pytest.raises(ValueError, match="need 3 micro-batches"):
        _grads_after(model, groups, micro=3, count=2)


def test_micro_batches_take_a_mini_batchs_rows_grouped_by_prompt(policy, groups, monkeypatch):
    """Shuffled rows of 3 groups of 4, micro-batches of 4: each micro-batch prefills one prompt
    (rows of a prompt go together), and every row is trained once."""
    import brorl.train.ppo as ppo

    model, _ = policy
    batch = groups.batch
    calls, real = [], ppo.prefill

    def counting(model, prompts, device):
        calls.append(len(prompts))
        return real(model, prompts, device)

    monkeypatch.setattr(ppo, "prefill", counting)
    seen = []
    monkeypatch.setattr(ppo, "policy_loss", lambda logp, *a, **k: (logp.sum() * 0, {"n": 1.0}))
    real_logprobs = ppo.micro_logprobs

    def recording(model, batch, micro, *args, **kwargs):
        seen.append(micro.rows.tolist())
        return real_logprobs(model, batch, micro, *args, **kwargs)

    monkeypatch.setattr(ppo, "micro_logprobs", recording)
    rows = torch.randperm(12, generator=torch.Generator().manual_seed(3))
    zeros = torch.zeros(batch.response_ids.shape)
    metrics = accumulate_mini_batch(
        model, lambda loss: None, batch, rows, advantages=zeros, old_logp=zeros,
        engine_logp=None, ref_logp=None, temperature=1.0, micro_batch_rollouts=4,
        normaliser=1.0, loss=LOSS)
    assert calls == [1, 1, 1] and metrics == {"n": 3.0}
    assert sorted(r for micro in seen for r in micro) == list(range(12))
    assert all(len({int(batch.prompt_index[r]) for r in micro}) == 1 for micro in seen)


def test_a_positive_advantage_raises_its_responses_log_probability(policy, groups):
    """One SGD step on the PPO loss moves log pi up where A > 0 and down where A < 0."""
    model, _ = policy
    import copy

    model = copy.deepcopy(model).train()
    batch = groups.batch
    mask = response_mask(batch)
    adv = torch.tensor([1.0, -1.0] * 6).reshape(-1, 1) * mask
    old = score_batch(model, batch, 1.0, 64)
    rows = torch.arange(12)
    accumulate_mini_batch(model, lambda loss: loss.backward(), batch, rows, advantages=adv,
                          old_logp=old, engine_logp=None, ref_logp=None, temperature=1.0,
                          micro_batch_rollouts=4, normaliser=float(mask.sum()), loss=LOSS)
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.05 * p.grad
    new = score_batch(model, batch, 1.0, 64)
    change = ((new - old) * mask).sum(1)
    assert (change[0::2] > 0).all() and (change[1::2] < 0).all(), change


def test_response_logprobs_carry_gradients_and_zero_padding(policy, groups):
    model, _ = policy
    logp, entropy = response_logprobs(model, groups.batch, torch.arange(12), 1.2, with_entropy=True)
    assert logp.requires_grad and entropy is not None
    mask = response_mask(groups.batch)[:, : logp.shape[1]]
    assert (logp[~mask] == 0).all() and (entropy[~mask] == 0).all() and (logp[mask] < 0).all()


def test_checkpoint_commit_points_latest_and_prunes(tmp_path):
    root = tmp_path / "ck"
    for step in (1, 2, 3):
        staged = ckpt.staging_dir(root, step)
        staged.mkdir(parents=True)
        ckpt.write_state(staged, {"step": step})
        ckpt.commit(root, step, keep=2)
    assert sorted(p.name for p in root.glob("step_*")) == ["step_000002", "step_000003"]
    assert (root / "latest").read_text().strip() == "step_000003"
    assert ckpt.latest_checkpoint(root) == root / "step_000003"
    ckpt.staging_dir(root, 4).mkdir()  # a crash while writing step 4: nothing changes
    assert ckpt.latest_checkpoint(root) == root / "step_000003"
    with pytest.raises(RuntimeError, match="not fully written"):
        ckpt.commit(root, 4, keep=2)
    (root / "latest").write_text("step_000009\n")  # a pointer to a missing folder falls back
    assert ckpt.latest_checkpoint(root) == root / "step_000003"
    assert json.loads((root / "step_000003" / ckpt.STATE_FILE).read_text()) == {"step": 3}


def test_arms_differ_only_in_batch_shape_and_lr():
    """params/brorl.yaml = params/prorl.yaml with B/4 prompts, N=512, lr x sqrt(8) (BroRL
    §4.2.1)."""
    prorl, brorl = load_params("params/prorl.yaml"), load_params("params/brorl.yaml")
    a, b = TrainerConfig.from_params(prorl), TrainerConfig.from_params(brorl)
    assert b.prompts_per_step * 4 == a.prompts_per_step
    assert (a.rollouts_per_prompt, b.rollouts_per_prompt) == (16, 512)
    assert b.lr == pytest.approx(a.lr * 8**0.5)
    assert a.mini_batches_per_step == b.mini_batches_per_step
    different = {k for k in vars(a) if getattr(a, k) != getattr(b, k)}
    # first_round and rollouts_cap follow N (N / 4, 4 N) but act only with allocation: adaptive
    assert different == {"prompts_per_step", "rollouts_per_prompt", "lr", "checkpoint_dir",
                         "first_round", "rollouts_cap"}
    assert a.allocation == b.allocation == "fixed"
    # compare: each file's default report folder follows its name; a run never reads it
    same = {"name", "update", "train", "compare"}
    assert brorl.model_dump(exclude=same) == prorl.model_dump(exclude=same)
    assert brorl.compare.model_dump(exclude={"report_dir"}) == \
        prorl.compare.model_dump(exclude={"report_dir"})


def test_rollouts_round_trip_through_parquet(groups, tmp_path):
    from datasets import Dataset

    from brorl.train.rollouts import save_groups

    path = save_groups(groups, tmp_path / "r" / "step_000001_draw0.parquet")
    table = Dataset.from_parquet(str(path))
    assert len(table) == 12 and table["problem_id"][:5] == ["p0"] * 4 + ["p1"]
    assert table["reward"] == groups.rewards.reshape(-1).tolist()
    lengths = groups.batch.response_lengths.tolist()
    assert [len(x) for x in table["response_ids"]] == lengths
    assert table["response_ids"][5] == groups.batch.response_ids[5, : lengths[5]].tolist()
    assert not list(path.parent.glob(".*"))  # no temporary file left


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_shared_prompt_scoring_equals_one_forward_per_row_and_runs_each_prompt_once(
        architecture, monkeypatch):
    """Prompts of different lengths (prefilled together, left-padded), rows of three groups in
    shuffled order: log-probs, entropy and gradients equal a plain forward of each row's
    prompt + response alone; Qwen2 and Llama prefill each prompt once, GPT-2 (not covered by
    the shared prefix) runs every row whole."""
    import brorl.train.ppo as ppo

    tokenizer = build_tokenizer()
    model = tiny_model(architecture, len(tokenizer))
    prompts = ["7+8=", "12+30+5=", "1="]
    batch = HfEngine(model, tokenizer, max_concurrent_rollouts=4).generate(
        prompts, 3, SamplingConfig(temperature=1.0, top_p=1.0, max_response_tokens=9, seed=5))
    rows = torch.tensor([4, 0, 8, 2, 6, 1])  # groups 1, 0, 2, 0, 2, 0
    prefills = []
    real = ppo.prefill

    def counting(model, prompts, device):
        prefills.append([tuple(ids) for ids in prompts])
        return real(model, prompts, device)

    monkeypatch.setattr(ppo, "prefill", counting)
    model.zero_grad()
    logp, entropy = response_logprobs(model, batch, rows, 0.8, with_entropy=True)
    (logp.sum() + entropy.sum()).backward()
    shared = [p.grad.clone() for p in model.parameters()]
    if architecture == "gpt2":
        assert prefills == []
    else:  # one padded pass over the three distinct prompts, each once
        assert len(prefills) == 1 and sorted(prefills[0]) == sorted(set(batch.prompt_ids))

    model.zero_grad()
    total = 0.0
    for i, r in enumerate(rows.tolist()):
        prompt = list(batch.prompt_ids[int(batch.prompt_index[r])])
        length = int(batch.response_lengths[r])
        ids = torch.tensor([prompt + batch.response_ids[r, :length].tolist()])
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / 0.8
        ref = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt):, None])[:, 0]
        assert torch.allclose(logp[i, :length].detach(), ref.detach(), atol=1e-5)
        assert (logp[i, length:] == 0).all()
        probs = torch.softmax(logits, -1)
        ent = -(probs * torch.log_softmax(logits, -1)).sum(-1)
        assert torch.allclose(entropy[i, :length].detach(), ent.detach(), atol=1e-5)
        total = total + ref.sum() + ent.sum()
    total.backward()
    for got, want in zip(shared, (p.grad for p in model.parameters())):
        # float32 rounding of sums whose terms reach the largest entry (about 40 here)
        assert torch.allclose(got, want, atol=2e-6 * float(want.abs().max()), rtol=1e-4)
