"""A real-model probe of BroRL's mechanism: do hard train prompts hide pass rates below 1/16?

BroRL's case for many rollouts per prompt (BroRL §3, §4.2.4) rests on prompts the policy solves
with a probability p in (0, 1/16): N = 16 rollouts find no correct one in most groups
((1-p)^16 > 1/e), N = 512 almost always find some. This probe measures whether a start policy has
such prompts, with generation only (no training), in minutes on a CPU:

1. Take `ProbeConfig.prompts` train prompts of the params' data in a seeded random order
   (`numpy.random.default_rng(seed)`; never validation or test).
2. Screen each at `screen_samples` rollouts (the training sampling of `params.generate`: its
   temperature, top-p and `max_response_tokens`); a rollout is correct at
   `filter.correct_reward` (the binary keep rule's threshold).
3. The hard prompts are those solved at most `hard_max_solves` times in the screen; the first
   `max_hard` of them (in the screened order) get `full_samples - screen_samples` more rollouts,
   so each is estimated from `full_samples` tries, the screen's included.
4. The record: the settings, each prompt's counts, the histogram of the probed prompts' pass rates
   (`brorl.study.pool.histogram`), how many lie in (0, 1/screen_samples), how many the screen saw
   unsolved yet the full count solved, and the mean over probed prompts of the share of groups
   the larger N rescues (`rescued`) and of the keep rate at both N (`keep_rate`).

The rollouts and their judgement are the pool's (`brorl.study.pool.solve_counter`: the hf engine
at the training sampling). Deliberately ignored: confidence intervals per prompt (a
count of 1 in 512 is the finding, not its precision), per-family quotas, the prompts the screen
finds easy (they keep the screen's counts only).

    python -m brorl.study.probe    (params/smollm2.yaml's checkpoint and data; writes
                                    metrics/study_probe.json, prints `render`'s table)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from brorl.runs.files import atomic_write_text
from brorl.study.pool import EDGES, histogram, keep_rate, rescued, solve_counter

if TYPE_CHECKING:
    from brorl.params import ExperimentParams

DEFAULT_PARAMS = "params/smollm2.yaml"
DEFAULT_OUT = "metrics/study_probe.json"


@dataclasses.dataclass(frozen=True)
class ProbeConfig:
    """The probe's sizes (module docstring); the defaults are BroRL's two N."""

    prompts: int = 64
    """Train prompts screened, drawn in a seeded random order (fewer if the split is smaller)."""
    max_hard: int = 16
    """Most hard prompts that get `full_samples` (the first ones in the screened order)."""
    seed: int = 0
    """Seed of the prompt order and (times 1_000_003) of the rollouts, as `pool.estimate`'s."""
    screen_samples: int = 16
    """Rollouts per prompt in the screen: the ProRL arm's N (BroRL §4.2.4, Table 2)."""
    full_samples: int = 512
    """Rollouts per hard prompt in all, the screen's included: BroRL's N (BroRL §4.2.4)."""
    hard_max_solves: int = 1
    """A prompt is hard when the screen solves it at most this many times (p about 1/16 or less)."""

    def __post_init__(self) -> None:
        if not 0 < self.screen_samples < self.full_samples:
            raise ValueError(
                f"probe: screen_samples ({self.screen_samples}) must be above 0 and below "
                f"full_samples ({self.full_samples}): the hard prompts get full_samples - "
                "screen_samples more rollouts. Raise full_samples or lower screen_samples.")
        if self.prompts < 1 or self.max_hard < 0 or self.hard_max_solves < 0:
            raise ValueError("probe: prompts must be at least 1, max_hard and hard_max_solves at "
                             "least 0.")


def probe(params: ExperimentParams, checkpoint: Path | str,
          config: ProbeConfig = ProbeConfig()) -> dict[str, Any]:
    """Screen, then probe the hard prompts of the policy at `checkpoint` (module docstring);
    returns the JSON-ready record (`render` shows it)."""
    from brorl.data import load_split

    started = time.perf_counter()
    train = load_split(Path(params.data.path), "train")
    order = np.random.default_rng(config.seed).permutation(len(train))[:config.prompts]
    problems = [train[i] for i in order]
    count = solve_counter(params, Path(checkpoint))
    seed = config.seed * 1_000_003
    screen = count(problems, config.screen_samples, seed)
    screen_seconds = time.perf_counter() - started
    hard = np.flatnonzero(screen <= config.hard_max_solves)
    probed = hard[:config.max_hard]
    solves, tries = screen.copy(), np.full(len(problems), config.screen_samples)
    if len(probed):
        solves[probed] += count([problems[i] for i in probed],
                                config.full_samples - config.screen_samples, seed + 500_000)
        tries[probed] = config.full_samples
    return summarise(problems, screen, solves, tries, hard, probed, config,
                     {"screen": screen_seconds, "total": time.perf_counter() - started})


def summarise(problems, screen: np.ndarray, solves: np.ndarray, tries: np.ndarray,
              hard: np.ndarray, probed: np.ndarray, config: ProbeConfig,
              seconds: dict[str, float]) -> dict[str, Any]:
    """The record of `probe` from its counts (`[len(problems)]` each; `hard` and `probed` index
    them)."""
    small, large = config.screen_samples, config.full_samples
    p = solves[probed] / large
    mean = (lambda x: float(np.mean(x)) if len(x) else float("nan"))
    is_hard = set(hard.tolist())
    return {
        "settings": dataclasses.asdict(config),
        "prompts": [{"id": q.id, "family": q.family, "task": f"{q.family}/{q.task}",
                     "screen_solves": int(screen[k]), "solves": int(solves[k]),
                     "tries": int(tries[k]), "hard": k in is_hard}
                    for k, q in enumerate(problems)],
        "screened": len(problems), "hard": len(hard), "probed": len(probed),
        "edges": list(EDGES), "histogram": histogram(p),
        "below_one_in_screen": int(((p > 0) & (p < 1 / small)).sum()),
        "unsolved_in_screen_solved_later": int(((screen[probed] == 0)
                                                & (solves[probed] > 0)).sum()),
        f"rescued_mean_n{small}_n{large}": mean(rescued(p, small, large)),
        f"keep_rate_n{small}": mean(keep_rate(p, small)),
        f"keep_rate_n{large}": mean(keep_rate(p, large)),
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
        "rollouts": int(tries.sum()),
    }


def render(record: dict[str, Any]) -> str:
    """A short markdown summary of a `probe` record: the probed prompts' histogram at the full
    count, then the headline counts."""
    s = record["settings"]
    small, large = s["screen_samples"], s["full_samples"]
    bins = [row["bin"] for row in record["histogram"]]
    counts = [str(row["count"]) for row in record["histogram"]]
    lines = [
        f"Pass rates of the {record['probed']} probed hard prompts at N = {large} "
        f"(hard: at most {s['hard_max_solves']} of {small} in the screen):", "",
        "| p | " + " | ".join(bins) + " |", "|---" * (len(bins) + 1) + "|",
        "| prompts | " + " | ".join(counts) + " |", "",
        f"- screened {record['screened']} train prompts at N = {small}; hard {record['hard']}, "
        f"probed {record['probed']}",
        f"- probed with p in (0, 1/{small}): {record['below_one_in_screen']}",
        f"- 0 of {small} in the screen, solved at least once in {large}: "
        f"{record['unsolved_in_screen_solved_later']}",
        f"- mean chance a group is all-wrong at N = {small} but not at {large}: "
        f"{record[f'rescued_mean_n{small}_n{large}']:.3f}",
        f"- mean keep rate: N = {small} {record[f'keep_rate_n{small}']:.3f}, "
        f"N = {large} {record[f'keep_rate_n{large}']:.3f}",
    ]
    if "seconds" in record:  # a record without its wall-clock figures (the study's report)
        lines.append(f"- {record['rollouts']} rollouts in {record['seconds']['total']:.0f} s "
                     f"(screen {record['seconds']['screen']:.0f} s)")
    return "\n".join(lines)


def _missing(params: ExperimentParams, params_path: str, checkpoint: Path) -> str | None:
    """The one-line error for a missing checkpoint or data folder, naming the command that makes
    it; None when both are there."""
    if not (checkpoint / "config.json").is_file():
        return (f"no checkpoint at {checkpoint} (no config.json): make it with "
                f"`brorl model --params {params_path}`, or pass --checkpoint")
    if not Path(params.data.path).is_dir():
        return (f"no data folder at {params.data.path}: make it with "
                f"`brorl data --params {params_path}`")
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m brorl.study.probe",
                                     description=__doc__.split("\n")[0])
    defaults = ProbeConfig()
    parser.add_argument("--params", default=DEFAULT_PARAMS, help="params YAML file")
    parser.add_argument("-S", "--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a params key (repeatable)")
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="policy folder (default: the params' model.path)")
    parser.add_argument("--out", type=Path, default=Path(DEFAULT_OUT), help="the JSON record")
    parser.add_argument("--prompts", type=int, default=defaults.prompts)
    parser.add_argument("--max-hard", type=int, default=defaults.max_hard)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    args = parser.parse_args(argv)
    from brorl.params import ParamsError, load_params
    from brorl.system.environment import apply_defaults

    apply_defaults()
    try:
        params = load_params(args.params, args.set)
        config = ProbeConfig(prompts=args.prompts, max_hard=args.max_hard, seed=args.seed)
    except (ParamsError, ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    checkpoint = args.checkpoint or Path(params.model.path)
    problem = _missing(params, args.params, checkpoint)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    record = probe(params, checkpoint, config)
    record["params"], record["checkpoint"] = args.params, str(checkpoint)
    atomic_write_text(args.out, json.dumps(record, indent=1) + "\n")
    print(render(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
