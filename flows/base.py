"""Flow `base`: the middling base checkpoint (`python -m flows.base --params FILE`).

Composition only: load params, call the `base` task on the `data` stage's output, return its
summary. No MLflow run yet (the project's tracking helpers are not in place); metrics go to
`metrics/base.json` for DVC and the warm-up history to `<base.path>/../report.json`.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from brorl.params import load_params
from flows.entry import run_flow_cli
from tasks.base import train_base

METRICS = "metrics/base.json"


@flow(name="base")
def base(params_path: str, overrides: list[str] | None = None) -> dict[str, Any]:
    """Warm the tiny policy of the `model` section up with the `base` section's knobs."""
    params = load_params(params_path, overrides or [])
    m, b = params.model, params.base
    model_config = {"hidden_size": m.hidden_size, "num_layers": m.num_layers,
                    "num_heads": m.num_heads, "num_kv_heads": m.num_kv_heads,
                    "intermediate_size": m.intermediate_size,
                    "max_position_embeddings": m.max_position_embeddings,
                    "tie_word_embeddings": m.tie_word_embeddings, "seed": m.seed}
    return train_base(
        data_path=params.data.path, path=b.path, metrics_path=METRICS,
        target_pass_high=b.target_pass_high, model_config=model_config, max_steps=b.max_steps,
        eval_every=b.eval_every, batch_size=b.batch_size, lr=b.lr, seed=b.seed,
        target_pass_low=b.target_pass_low, eval_per_family=b.eval_per_family,
        test_samples=b.test_samples, eval_temperature=b.eval_temperature,
        eval_top_p=b.eval_top_p, max_response_tokens=b.max_response_tokens,
    )


if __name__ == "__main__":
    run_flow_cli(base)
