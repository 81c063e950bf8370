"""Flow `base`: the middling base checkpoint (`python -m flows.base --params FILE`).

Composition only: load params, call the `base` task on the `data` stage's output (checkpoint
at `base.path`, metrics at `<tracking.metrics_dir>/base.json` for DVC, the warm-up history at
`<base.path>/../report.json`), record them in one MLflow run, return the summary.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from brorl.params import load_params
from flows.entry import run_flow_cli
from tasks import tracking
from tasks.base import log_base, train_base


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
    result = train_base(
        data_path=params.data.path, path=b.path,
        metrics_path=str(tracking.ROOT / params.tracking.metrics_dir / "base.json"),
        target_pass_high=b.target_pass_high, model_config=model_config, max_steps=b.max_steps,
        eval_every=b.eval_every, batch_size=b.batch_size, lr=b.lr, seed=b.seed,
        warmup_steps=b.warmup_steps, min_lr_ratio=b.min_lr_ratio, micro_batches=b.micro_batches,
        family_shares=b.family_shares, reached_share=b.reached_share,
        target_pass_low=b.target_pass_low, band_margin=b.band_margin,
        eval_per_family=b.eval_per_family,
        test_samples=b.test_samples, eval_temperature=b.eval_temperature,
        eval_top_p=b.eval_top_p, max_response_tokens=b.max_response_tokens,
    )
    uri = tracking.resolve_tracking_uri(params.tracking.tracking_uri)
    logged = {"name": params.name, **params.model_dump(mode="json", include={"model", "base"})}
    run_id = log_base(logged, result, params.tracking.experiment, uri)
    return {**result, "mlflow_run_id": run_id}


if __name__ == "__main__":
    run_flow_cli(base)
