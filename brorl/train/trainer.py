"""The RL trainer: the mechanics of one step (generate, verify, filter, PPO) on DeepSpeed.

A step's parts are public methods that `brorl.train.run.Run` composes (BroRL §3.1, §4.2.1;
the ProRLv2 blog post):
1. `start_collection`, `sample_prompts`, `generate_rollouts`, `verify`: draw prompts from the
   seeded cursor, generate N rollouts each (`brorl.engines`), verify them
   (`brorl.families.verify_batch`); a `Collection` keeps the groups the keep rule passes
   (`brorl.algorithm.filtering.InformativeCollector`), refilling up to `filter_max_draws` rounds,
   never past the rollouts the run has left (`start_collection(max_rollouts)`);
2. `update`: advantages over the kept groups (REINFORCE++-baseline or GRPO), old and reference
   log-probs, then `mini_batches_per_step` PPO mini-batches per epoch, each accumulated from
   micro-batches (at most `micro_batch_rollouts` rows and `max_tokens_per_micro_batch`
   positions, rows packed or bucketed by length: `brorl.train.micro`) and applied with one
   optimizer step; `perf/*` says how busy the device was (`brorl.train.perf`);
3. `end_step`: count the step, reset the reference on schedule (optionally clearing the
   optimizer), sync the engine's weights; `save_checkpoint` when the run says so.
The run (`brorl.train.run`) owns the loop, its stop rules and schedules, and the timings.

Data parallelism: DeepSpeed ZeRO 0-2 over all ranks (gloo on CPU, NCCL on GPU). Every rank draws
the same prompts from the same cursor; with the hf engine each rank generates and verifies its
contiguous share of a draw (`draw_share`) with its own engine, seeded as one process would seed
those rollouts (`SamplingConfig.first_prompt`), and every rank gathers the whole draw
(`gather_groups`), so the filter, the advantages and the update see what one process sees. The
vllm engine is one engine on rank 0, which then generates every draw. Every rank trains on its
share (`rank::world`) of each mini-batch, with the same number of backward calls on every rank.
The loss is normalised by the mini-batch's token count over all ranks and multiplied by the world
size, because DeepSpeed averages gradients over ranks: the update equals one process on the
whole mini-batch.

Exact resume: every random choice comes from (seed, global step, round) or from the saved cursor,
and a checkpoint holds weights, optimizer, scheduler, reference, RNG states, cursor, step, step
offset and the run's state; resuming at step k and running m steps gives the weights and metrics
of k + m steps. Continuation: a fresh run whose `init_checkpoint` holds a `run.json` (and
`continue_stream`) takes its global step as `step_offset` and continues its prompt stream
(`brorl.train.sampler.continue_stream`).

Deliberately ignored: a vLLM engine per rank, ZeRO-3 (whole parameters are needed for the
engine and HF saves), packing rows of different prompts into one sequence, asynchronous
(off-policy) rollouts.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from brorl.algorithm.advantages import compute_advantages, token_advantages
from brorl.algorithm.downsample import max_variance_subset
from brorl.algorithm.filtering import InformativeCollector
from brorl.algorithm.schedule import mini_batch_bounds, reset_plan
from brorl.engines import SamplingConfig, build_engine
from brorl.engines.base import ChunkCallback
from brorl.families import verify_batch
from brorl.families.prompts import render_prompt
from brorl.policy import load_policy
from brorl.train import checkpoint as ckpt
from brorl.train.collection import Collection
from brorl.train.config import TrainerConfig
from brorl.train.micro import MicroBatch
from brorl.train.perf import ModelShape, peak_flops, perf_metrics, plan_totals
from brorl.train.ppo import accumulate_mini_batch, micro_batches, score_batch
from brorl.train.rollouts import ScoredGroups, concat, response_mask
from brorl.train.sampler import PromptSampler, SamplerState, continue_stream, read_run_record
from brorl.train.verification import RewardFn
from brorl.types import Problem, RolloutBatch
from brorl.verifiers import Verdict


def init_distributed() -> tuple[int, int]:
    """(rank, world size), initialising torch.distributed through DeepSpeed if needed.

    Launched by `torchrun` or `deepspeed` (WORLD_SIZE > 1 in the environment), the environment
    names the ranks and the rendezvous. Otherwise this is a world of one on a fresh port of
    127.0.0.1, passed as an explicit `tcp://` address: writing it into MASTER_PORT would leak it
    to child processes, whose own rendezvous then finds that port taken (EADDRINUSE).
    """
    import deepspeed

    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        deepspeed.init_distributed(verbose=False)
        return dist.get_rank(), dist.get_world_size()
    os.environ.setdefault("LOCAL_RANK", "0")  # DeepSpeed's engine reads it
    if not torch.cuda.is_available():
        # DeepSpeed's CPU shared-memory all-reduce only speeds up multi-process collectives;
        # a world of one has none, so skip its JIT build (75 s or more, platform notes).
        import deepspeed.ops

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    from brorl.system.servers import free_port

    deepspeed.init_distributed(verbose=False, auto_mpi_discovery=False, rank=0, world_size=1,
                               init_method=f"tcp://127.0.0.1:{free_port()}")
    return dist.get_rank(), dist.get_world_size()


def shutdown_distributed() -> None:
    """Leave torch.distributed at the end of a process that `init_distributed` joined: the ranks
    meet at a barrier, then each destroys its process group. A rank that exits with its group
    alive can abort in the collective backend's teardown (SIGABRT, "terminate called without an
    active exception"), which the launcher reports as a failed run."""
    if not dist.is_initialized():
        return
    if dist.get_world_size() > 1:
        dist.barrier()
    dist.destroy_process_group()


def draw_seed(seed: int, step: int, draw: int) -> int:
    """The sampling seed of refill round `draw` of step `step` (distinct for every pair)."""
    return (seed * 1_000_003 + step * 1_009 + draw) % (2**31 - 1)


def deepspeed_config(config: TrainerConfig) -> dict[str, Any]:
    """DeepSpeed's config: ZeRO stage, precision, clipping; the trainer owns accumulation."""
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,  # one step() per mini-batch, any micro count
        "gradient_clipping": config.max_grad_norm,
        "zero_optimization": {"stage": config.zero_stage},
        "bf16": {"enabled": config.dtype == "bfloat16"},
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
        "zero_allow_untested_optimizer": True,
    }


class Trainer:
    """ProRL / BroRL training of a causal LM on verifiable problems (see the module docstring)."""

    def __init__(self, config: TrainerConfig, problems: Sequence[Problem], *,
                 reward_fn: RewardFn | None = None, resume: bool = True) -> None:
        import deepspeed

        self.config = config
        self.rank, self.world = init_distributed()
        ckpt.seed_rngs(config.seed, self.rank)  # what a checkpoint saves of the global RNGs
        self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) \
            if torch.cuda.is_available() else torch.device("cpu")
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # NCCL's object collectives use the current device
        self.reward_fn = reward_fn or partial(verify_batch, config=config.verify)
        self.resumed_from = ckpt.latest_checkpoint(config.checkpoint_dir) if resume else None
        start = self.resumed_from / "policy" if self.resumed_from else Path(config.init_checkpoint)
        model, self.tokenizer = load_policy(start, device=self.device)
        # The reference loads as the policy does, from the checkpoint it was saved in or from
        # the start: one load path, so a resumed run scores its KL exactly as the run it resumes.
        reference = self.resumed_from / "reference" if self.resumed_from else start
        self.reference, _ = load_policy(reference, device=self.device)
        self.reference.requires_grad_(False).eval()
        optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr,
                                      betas=config.adam_betas, eps=config.adam_eps,
                                      weight_decay=config.weight_decay)
        warmup = config.warmup_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler,
            config=deepspeed_config(config))
        self.shape = ModelShape.of(model)
        """The policy's shape, for the FLOPs of `perf/mfu` (`brorl.train.perf`)."""
        self.step_count = 0
        self.step_offset = 0
        """Global step of the run this one continues (`run.json` of `init_checkpoint`), or 0."""
        self.resumed_state: dict[str, Any] = {}
        """The resumed checkpoint's `run` record (`save_checkpoint(run_state=...)`), or {}."""
        sampler_state = SamplerState()
        if self.resumed_from:
            self.engine.load_checkpoint(str(self.resumed_from / "deepspeed"), tag="state",
                                        load_optimizer_states=True, load_lr_scheduler_states=True)
            state = ckpt.read_state(self.resumed_from)
            self.step_count, self.resumed_state = state["step"], state.get("run", {})
            self.step_offset = state.get("step_offset", 0)
            sampler_state = SamplerState(**state["sampler"])
            ckpt.load_rng(self.resumed_from, self.rank)
        elif config.continue_stream and (record := read_run_record(start)) is not None:
            self.step_offset, sampler_state = continue_stream(record, config.seed, len(problems))
        self.sampler = PromptSampler(problems, config.seed, sampler_state)
        self.rollout_engine = None
        if self.rank < self.generating_ranks:
            self.rollout_engine = build_engine(
                config.engine, model=self.engine.module, tokenizer=self.tokenizer,
                model_path=start, max_model_len=self.engine.module.config.max_position_embeddings)

    @property
    def model(self) -> torch.nn.Module:
        """The policy being trained (DeepSpeed's module)."""
        return self.engine.module

    @property
    def global_step(self) -> int:
        """Steps done counting the run this one continues (`step_offset + step_count`): the step
        every per-step seed derives from, so a continuation never replays its start's seeds."""
        return self.step_offset + self.step_count

    # -- 1. rollouts ------------------------------------------------------------------------
    def sample_prompts(self, count: int) -> list[Problem]:
        """The next `count` problems from the seeded cursor."""
        return self.sampler.take(count)

    @property
    def generating_ranks(self) -> int:
        """Ranks that generate: all of them with the hf engine, rank 0 alone with vllm."""
        return self.world if self.config.engine.kind == "hf" else 1

    def draw_share(self, count: int) -> tuple[int, int]:
        """This rank's prompts `[lo, hi)` of a draw of `count`: contiguous shares in rank order,
        their sizes differing by at most one (empty on a rank that does not generate)."""
        ranks = self.generating_ranks
        if self.rank >= ranks:
            return count, count
        base, extra = divmod(count, ranks)
        lo = self.rank * base + min(self.rank, extra)
        return lo, lo + base + (self.rank < extra)

    def generate_rollouts(self, problems: Sequence[Problem], draw: int, n: int | None = None, *,
                          first_prompt: int = 0, on_chunk: ChunkCallback | None = None
                          ) -> RolloutBatch:
        """`n` (default N) rollouts per problem from the current policy, seeded by (step, draw)
        and, for a rank's share, its first prompt's place in the draw; `on_chunk` hears of
        finished rows (`brorl.train.verification.ChunkVerifier`)."""
        if self.rollout_engine is None:
            raise RuntimeError(f"rank {self.rank} has no engine: with generate.engine "
                               f"{self.config.engine.kind!r} only rank 0 generates.")
        sampling = SamplingConfig(
            temperature=self.config.temperature, top_p=self.config.top_p,
            max_response_tokens=self.config.max_response_tokens,
            seed=draw_seed(self.config.seed, self.global_step, draw), first_prompt=first_prompt)
        prompts = [render_prompt(p, self.tokenizer) for p in problems]
        return self.rollout_engine.generate(prompts, n or self.config.rollouts_per_prompt,
                                            sampling, on_chunk=on_chunk)

    def verify(self, problems: Sequence[Problem], batch: RolloutBatch,
               verdicts: Sequence[Verdict] | None = None) -> ScoredGroups:
        """Rewards `[b, N]` of a batch: `verdicts` (one per row, prompt-major) or, without them,
        the reward function's (the family verifiers)."""
        n = batch.rollouts_per_prompt
        if verdicts is None:
            verdicts = self.reward_fn([p for p in problems for _ in range(n)], batch.texts)
        rewards = torch.tensor([v.reward for v in verdicts], dtype=torch.float64).view(-1, n)
        return ScoredGroups(tuple(problems), batch, rewards, tuple(v.reason for v in verdicts))

    def gather_groups(self, groups: ScoredGroups | None) -> ScoredGroups:
        """The whole draw on every rank: each rank's share (None: it had none), joined in rank
        order, which is the draw's prompt order (`draw_share`)."""
        if self.world == 1 and groups is not None:
            return groups
        parts: list[ScoredGroups | None] = [None] * self.world
        dist.all_gather_object(parts, groups)
        return concat([p for p in parts if p is not None])

    def start_collection(self, max_rollouts: int | None = None) -> Collection:
        """An empty dynamic-sampling collection for this step (see `Collection`). With
        `max_rollouts` (the run's remaining budget) no draw brings more than floor(max_rollouts
        / N) prompts in all, so the step never spends past the budget."""
        c = self.config
        max_groups = None if max_rollouts is None else max_rollouts // c.rollouts_per_prompt
        return Collection(InformativeCollector(
            c.prompts_per_step, c.filter_max_draws if c.filter_enabled else 1,
            oversample=c.filter_oversample, correct_reward=c.correct_reward,
            wrong_reward=c.wrong_reward, keep_uniform=not c.filter_enabled,
            keep_rule=c.keep_rule, max_groups=max_groups), c.rollouts_per_prompt,
            (c.first_round, c.rollouts_cap) if c.allocation == "adaptive" else None)

    def broadcast(self, value: Any) -> Any:
        """Rank 0's `value` on every rank (a world of one returns it as is)."""
        if self.world == 1:
            return value
        holder = [value]
        dist.broadcast_object_list(holder, src=0)
        return holder[0]

    # -- 2. the update ----------------------------------------------------------------------
    def _permutations(self, rows: int) -> list[torch.Tensor]:
        gen = torch.Generator().manual_seed(draw_seed(self.config.seed, self.global_step, 10_007))
        return [torch.randperm(rows, generator=gen) for _ in range(self.config.epochs_per_step)]

    def update(self, groups: ScoredGroups) -> dict[str, float]:
        """PPO on the kept groups: `epochs_per_step` x `mini_batches_per_step` optimizer steps.

        With `train_subset` M, each group first keeps its M rollouts of largest reward variance
        (PODS, `max_variance_subset`): advantages, scoring and training see only those rows.
        """
        config = self.config
        started = time.perf_counter()
        if config.train_subset is not None:
            chosen = max_variance_subset(groups.rewards, config.train_subset)
            groups = groups.select_rollouts(chosen)
        batch = groups.batch
        mask = response_mask(batch)
        valid = groups.valid  # padded groups (adaptive allocation): train on the real rows only
        advantages = compute_advantages(groups.rewards, config.advantage_estimator, valid)
        token_adv = token_advantages(advantages, mask).float()
        real = groups.valid_mask().reshape(-1).nonzero().flatten()
        perms = [real[perm] for perm in self._permutations(real.numel())]
        plan = [[perm[lo:hi] for lo, hi in mini_batch_bounds(len(perm), config.mini_batches_per_step)]
                for perm in perms]
        mine = torch.cat([mb[self.rank :: self.world] for epoch in plan for mb in epoch]).unique()
        self.model.eval()
        tokens = config.max_tokens_per_micro_batch
        scored: list[MicroBatch] = []
        scoring = time.perf_counter()
        old_logp = score_batch(self.model, batch, config.temperature, config.micro_batch_rollouts,
                               mine, max_tokens=tokens, on_plan=scored.extend)
        ref_logp = None
        if config.loss.kl_coef > 0:
            ref_logp = score_batch(self.reference, batch, config.temperature,
                                   config.micro_batch_rollouts, mine, max_tokens=tokens,
                                   on_plan=scored.extend)
        score_seconds = time.perf_counter() - scoring
        self.model.train()
        training = time.perf_counter()
        sums: dict[str, float] = {}
        grad_norms, steps, trained = [], 0, []
        for epoch in plan:
            for mb in epoch:
                share = mb[self.rank :: self.world]
                parts = [micro_batches(self.model, batch, mb[rank :: self.world],
                                       config.micro_batch_rollouts, tokens)
                         for rank in range(self.world)]  # every rank's, for an equal count
                trained.extend(parts[self.rank])
                metrics = accumulate_mini_batch(
                    self.model, partial(self.engine.backward, scale_wrt_gas=False), batch, share,
                    advantages=token_adv, old_logp=old_logp, engine_logp=batch.logprobs,
                    ref_logp=ref_logp, temperature=config.temperature,
                    micro_batch_rollouts=config.micro_batch_rollouts,
                    normaliser=float(mask[mb].sum()), loss_scale=float(self.world),
                    num_micro_batches=max(map(len, parts)), max_tokens=tokens,
                    parts=parts[self.rank], loss=config.loss)
                self.engine.step()
                steps += 1
                grad_norms.append(float(self.engine.get_global_grad_norm() or 0.0))
                for key, value in self._all_reduce(metrics).items():
                    sums[key] = sums.get(key, 0.0) + value
        train_seconds = time.perf_counter() - training
        self.model.eval()
        out = {key: value / steps for key, value in sums.items()}
        out.update(perf_metrics(  # summed over ranks: every rank reports the same figures
            self._all_reduce(plan_totals(self.shape, trained, scored)), train_seconds,
            score_seconds, trained_tokens=float(mask[real].sum()) * config.epochs_per_step,
            peak=peak_flops(next(self.model.parameters()).device, config.peak_tflops),
            devices=self.world))
        out.update({
            "update/optimizer_steps": float(steps),
            "update/grad_norm": sum(grad_norms) / len(grad_norms),
            "update/lr": float(self.scheduler.get_last_lr()[0]),
            "update/advantage_abs_mean": float(advantages.abs()[groups.valid_mask()].mean()),
            "update/reward_mean": float(groups.rewards[groups.valid_mask()].mean()),
            "update/trained_rollouts": float(real.numel()),
            "update/seconds": time.perf_counter() - started,
            "update/score_seconds": score_seconds,
        })
        return out

    def _all_reduce(self, metrics: dict[str, float]) -> dict[str, float]:
        """Sum each rank's share of the mini-batch metrics (keys are equal on every rank)."""
        if self.world == 1:
            return metrics
        keys = sorted(metrics)
        values = torch.tensor([metrics[k] for k in keys], dtype=torch.float64)
        dist.all_reduce(values)
        return dict(zip(keys, values.tolist()))

    # -- 3. after the update ----------------------------------------------------------------
    def after_update(self) -> dict[str, float]:
        """Reference reset / optimizer clear on schedule; push the weights to the engine."""
        plan = reset_plan(self.step_count, self.config.reference_reset_every,
                          self.config.reset_optimizer_on_reference_reset)
        if plan.reset_reference:
            self.reference.load_state_dict(self.model.state_dict())
        if plan.reset_optimizer:
            inner = getattr(self.optimizer, "optimizer", self.optimizer)
            inner.state.clear()
        if self.rollout_engine is not None:
            self.rollout_engine.sync_weights(self.model)
        return {"reference/reset": float(plan.reset_reference),
                "reference/optimizer_reset": float(plan.reset_optimizer)}

    def end_step(self, metrics: dict[str, float]) -> dict[str, float]:
        """Close the step: count it, reset the reference on schedule, sync the engine."""
        metrics = dict(metrics)
        metrics["update/skipped"] = 0.0 if "update/optimizer_steps" in metrics else 1.0
        self.step_count += 1
        metrics.update(self.after_update())
        metrics["train/step"] = float(self.step_count)
        return metrics

    # -- checkpoints ------------------------------------------------------------------------
    def save_checkpoint(self, run_state: dict[str, Any] | None = None) -> Path:
        """Write `step_<step>/` atomically on all ranks (see `brorl.train.checkpoint`), with
        `run_state` (the run's counters and records, `brorl.train.state.RunState`) inside it."""
        root = Path(self.config.checkpoint_dir)
        staged = ckpt.staging_dir(root, self.step_count)
        if self.rank == 0:
            if staged.exists():
                shutil.rmtree(staged)
            staged.mkdir(parents=True)
        self._barrier()
        self.engine.save_checkpoint(str(staged / "deepspeed"), tag="state", save_latest=False)
        ckpt.save_rng(staged, self.rank)
        self._barrier()
        final = root / ckpt.step_name(self.step_count)
        if self.rank == 0:
            self.model.save_pretrained(staged / "policy")
            self.tokenizer.save_pretrained(staged / "policy")
            self.reference.save_pretrained(staged / "reference")
            self.tokenizer.save_pretrained(staged / "reference")
            ckpt.write_state(staged, {"step": self.step_count, "step_offset": self.step_offset,
                                      "run": run_state or {}, "world_size": self.world,
                                      "sampler": vars(self.sampler.state)})
            final = ckpt.commit(root, self.step_count, self.config.keep_checkpoints)
        self._barrier()
        return final

    def _barrier(self) -> None:
        if self.world > 1:
            dist.barrier()


def parameter_digest(model: torch.nn.Module) -> str:
    """A hash of every parameter's bytes (equal weights, equal digest), for rank checks."""
    import hashlib

    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()

