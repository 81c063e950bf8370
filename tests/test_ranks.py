"""Generation on every rank: two processes (gloo, CPU) run `brorl.train.Run` steps; each rank
generates and verifies its share of every draw with its own hf engine, and the kept groups are
gathered for the filter and the update. Checked against one process on the same params."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.multiprocessing as mp

from brorl.system.servers import free_port
from brorl.verifiers import Verdict

ROOT = Path(__file__).resolve().parents[1]
STEPS = 2


def _reward(problems, responses) -> list[Verdict]:
    """A deterministic binary reward from the response's characters (mixed groups, so the
    filter keeps some and refills)."""
    return [Verdict(float(sum(map(ord, r)) % 3 == 0), "parity") for r in responses]


def _steps(folder: Path) -> dict:
    """`STEPS` steps of the run in `folder` on this process's rank: the problem ids of its share
    of every draw (empty when it had none), the parameter digest after every step, and more.
    Rank 0 saves every gathered draw under `run/rollouts/`; each rank saves its final weights
    as `weights_rank<r>.pt`."""
    from brorl.params import load_params
    from brorl.train import Direct, Run, parameter_digest

    params = load_params(ROOT / "params" / "prorl_ci.yaml", [
        f"data.path={folder.parent / 'data'}", f"train.init_checkpoint={folder.parent / 'base'}",
        f"train.checkpoint_dir={folder / 'ck'}", f"train.run_dir={folder / 'run'}",
        "update.prompts_per_step=5", "update.rollouts_per_prompt=4", "filter.max_draws=3",
        "generate.max_response_tokens=8", "generate.max_concurrent_rollouts=6",
        "train.eval_every=1000", "train.checkpoint_every=1000", "train.save_rollouts=true",
        "verify.workers=1"])
    run = Run.open(params, ROOT, resume=False, reward_fn=_reward)
    draws: list[list[str]] = []

    class Recording(Direct):
        """Runs in place, noting the problems of each share the rank generates."""

        def stage(self, run, method, *args):
            out = super().stage(run, method, *args)
            if method is Run.generate_rollouts:
                draws.append([p.id for p in out.value.problems])
            return out

    digests, kept = [], []
    for _ in range(STEPS):
        metrics = run.step(Recording())
        digests.append(parameter_digest(run.trainer.model))
        kept.append(metrics["filter/groups_kept"])
    torch.save({k: v.detach().clone() for k, v in run.trainer.model.state_dict().items()},
               folder / f"weights_rank{run.trainer.rank}.pt")
    return {"draws": draws, "digests": digests, "kept": kept, "rollouts": run.state.rollouts,
            "world": run.trainer.world}


def _worker(rank: int, world: int, port: int, folder: str) -> None:
    """Rank `rank` of `world` (gloo): `_steps`, written to `<folder>/rank<r>.json`."""
    os.environ.update(OMP_NUM_THREADS="1", LOCAL_RANK=str(rank), RANK=str(rank),
                      WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    import deepspeed.ops

    # gloo's all-reduce is enough here; DeepSpeed's shared-memory op would JIT-build first
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    from brorl.train.trainer import shutdown_distributed

    record = _steps(Path(folder))
    (Path(folder) / f"rank{rank}.json").write_text(json.dumps(record))
    shutdown_distributed()


def _two_ranks_beside_one(folder: Path) -> tuple[list[dict], dict]:
    """Two spawned ranks in `folder / "two"`, and meanwhile this process, a world of one, in
    `folder / "one"`: the ranks' records and this process's."""
    (folder / "two").mkdir()
    ranks = mp.start_processes(_worker, args=(2, free_port(), str(folder / "two")), nprocs=2,
                               start_method="spawn", join=False)
    one = _steps(folder / "one")
    while not ranks.join():
        pass
    return [json.loads((folder / "two" / f"rank{r}.json").read_text()) for r in range(2)], one


def _rollout_tables(run_dir: Path) -> dict[str, list[dict]]:
    """Every draw a run saved (`run_dir/rollouts/*.parquet`, by file name): its rows."""
    import pyarrow.parquet as pq

    return {f.name: pq.read_table(f).to_pylist()
            for f in sorted((run_dir / "rollouts").glob("*.parquet"))}


def test_two_ranks_generate_disjoint_shares_of_one_process_draws_and_keep_equal_weights(
        tmp_path):
    from brorl.data import save_splits
    from brorl.families.math import generate_math
    from brorl.policy import build_policy, build_tokenizer, save_policy

    problems = generate_math(30, seed=0, tasks=("compare",))
    save_splits({"train": problems[:20], "validation": problems[20:25], "test": problems[25:]},
                tmp_path / "data")
    tokenizer = build_tokenizer()
    save_policy(build_policy(vocab_size=len(tokenizer), hidden_size=64, num_layers=2,
                             num_heads=2, num_kv_heads=1, intermediate_size=128,
                             max_position_embeddings=128), tokenizer, tmp_path / "base")
    two, one = _two_ranks_beside_one(tmp_path)
    assert one["world"] == 1 and [r["world"] for r in two] == [2, 2]
    # the ranks made the same engine calls; in each, rank 0 took the first prompts of the draw,
    # rank 1 the rest (5 prompts: 3 + 2; a refill of 1: 1 + 0): no prompt twice, none missed
    assert len(two[0]["draws"]) == len(two[1]["draws"]) == len(one["draws"]) > STEPS
    for whole, first, second in zip(one["draws"], two[0]["draws"], two[1]["draws"]):
        assert first + second == whole and not set(first) & set(second)
        assert len(first) - len(second) in (0, 1)
    # the rollouts themselves: every draw the ranks gathered (rank 0's share, then rank 1's;
    # rank 0 saved it) is the one process's draw row for row: problem, rollout index, response
    # text and token ids, finish reason, reward. Each rank seeds a row by its place in the whole
    # draw, so rank 1's rows are the ones one process made there. Log-probabilities come from
    # batches of another shape (3 or 2 prompts, not 5): equal up to float32 rounding (measured
    # 5e-7 on values near -4.6, where one float32 step is 5e-7)
    gathered = _rollout_tables(tmp_path / "two" / "run")
    whole = _rollout_tables(tmp_path / "one" / "run")
    assert list(gathered) == list(whole) and len(whole) == len(one["draws"])
    for (name, rows), ids in zip(whole.items(), one["draws"]):
        assert list(dict.fromkeys(r["problem_id"] for r in rows)) == ids, name
        for got, want in zip(gathered[name], rows, strict=True):
            logprobs = torch.tensor(got.pop("logprobs")), torch.tensor(want.pop("logprobs"))
            assert got == want, name
            assert torch.allclose(*logprobs, rtol=0, atol=1e-5), name
    # each step trained on the groups one process keeps, and both ranks hold the same weights
    assert two[0]["kept"] == two[1]["kept"] == one["kept"] and min(one["kept"]) > 0
    assert two[0]["rollouts"] == two[1]["rollouts"] == one["rollouts"]
    assert two[0]["digests"] == two[1]["digests"]
    assert len(set(two[0]["digests"])) == STEPS  # every step changed them
    # ...and those are the one process's weights. Not bit for bit: the ranks sum their halves
    # of each gradient apart and all-reduce them, a different float32 summation order (measured
    # 9e-8, about one float32 step at |w| <= 1). 1e-6 is ten times that and 1/50 of the learning
    # rate (5.6e-5), about what one Adam update moves a weight: a step trained on other
    # rollouts stands out
    one_weights = torch.load(tmp_path / "one" / "weights_rank0.pt")
    for r in range(2):
        weights = torch.load(tmp_path / "two" / f"weights_rank{r}.pt")
        assert weights.keys() == one_weights.keys()
        for key, want in one_weights.items():
            assert torch.allclose(weights[key], want, rtol=0, atol=1e-6), (r, key)
