"""The base checkpoint: the tiny policy warmed up until it is middling, not solved.

The paper continues RL from a checkpoint that plateaued under ProRLv2 (BroRL Table 1 baseline row,
§4.2.1). On CPU our stand-in is the tiny Qwen2 of the model stage (`brorl.model`), warmed up by
teacher forcing
(`brorl.base.supervised.warm_up`). Validation scores each family with the RL reward's own
verifiers, one sample per problem at the test's temperature and top-p, so the stopping rule and
the reported band measure the same thing; training stops once every family's pass@1 reaches
`target_pass_low` (default 0.2), or at `max_steps`. Stopping at the low end of the 20-60% band
leaves room for RL. `BaseConfig.from_params` is the stage's one conversion from the schema.
The report's wall-clock figures are kept apart from what the stage's output holds (`split_report`,
`brorl.runs.timings`): the same weights give the same `report.json`.

Paper: BroRL §4.2.1, Table 1 (plateaued starting point).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from brorl.base.config import BaseConfig
from brorl.base.supervised import base_engine, warm_up
from brorl.evaluation.protocol import sample_per_family
from brorl.evaluation.scoring import evaluate_policy
from brorl.policy import load_policy
from brorl.runs.timings import split_timings
from brorl.types import Problem


def make_base_checkpoint(train: Sequence[Problem], validation: Sequence[Problem],
                         test: Sequence[Problem], config: BaseConfig
                         ) -> tuple[object, object, dict]:
    """Load the model stage's checkpoint `config.start`, warm it up, score it.

    The warm-up (`warm_up`) stops and selects on validation with the band [target_pass_low,
    target_pass_high] narrowed by `band_margin` at each end: room for validation noise, so the
    held-out scores land inside the band itself.

    Returns (model, tokenizer, report); the report holds the warm-up history, the steps trained
    and the step whose weights were kept (`selected_step`, see `warm_up`), the held-out test
    scores of those weights (pass@1 from `test_samples` samples at `eval_temperature`, BroRL
    App. D protocol) and the seconds of warm-up (validation checks included) and of the test.
    """
    c = config
    model, tokenizer = load_policy(c.start)
    started = time.perf_counter()
    history = warm_up(model, tokenizer, train,
                      sample_per_family(validation, c.eval_per_family, c.seed), c)
    train_seconds = time.perf_counter() - started
    scores, _ = evaluate_policy(base_engine(model, tokenizer, c), tokenizer, test,
                                n=c.test_samples, k_values=(1,),
                                max_new_tokens=c.max_response_tokens,
                                temperature=c.eval_temperature, top_p=c.eval_top_p, seed=c.seed,
                                verify=c.verify)
    report = {"history": history, "test": scores, "steps": history[-1]["step"],
              "selected_step": next(h["step"] for h in history if h["selected"]),
              "train_seconds": train_seconds,
              "test_seconds": time.perf_counter() - started - train_seconds}
    return model, tokenizer, report


def split_report(report: dict) -> tuple[dict, dict]:
    """(the report without wall-clock figures, which `report.json` holds; those figures, which
    `<out>.timings.json` holds: `train_seconds`, `test_seconds` and `history`, each check's step
    and `seconds`). Everything else in the report follows from the inputs and the seed."""
    stable, timings = split_timings(report)
    stable["history"] = [split_timings(h)[0] for h in report["history"]]
    timings["history"] = [{"step": h["step"], **split_timings(h)[1]} for h in report["history"]]
    return stable, timings
