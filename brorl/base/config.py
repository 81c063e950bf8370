"""The base stage's settings as one frozen record, and its one conversion from the params.

`BaseConfig.from_params` builds it from the `base` section (with `model.checkpoint`, where the
warm-up starts, the `verify` section, how its samples are judged, and the `generate` section's
engine settings, what samples them); the warm-up
(`brorl.base.supervised.warm_up`) and the stage (`brorl.base.checkpoint.make_base_checkpoint`)
read it. No field has a default: the defaults live
in `brorl.params` only (`BaseParams` documents each field).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from brorl.engines.base import EngineConfig
from brorl.verifiers.config import VerifyConfig

if TYPE_CHECKING:
    from brorl.params import ExperimentParams


@dataclass(frozen=True)
class BaseConfig:
    """The base stage's settings, no defaults (the schema has them): the `base` section's fields
    but `path` (`brorl.params.BaseParams` documents each), `start`, the model stage's
    checkpoint the warm-up begins from (`model.checkpoint`), `verify` and `engine`."""

    start: str
    verify: VerifyConfig
    """How the checks' and the test's samples are judged (the `verify` section)."""
    engine: EngineConfig
    """What samples the checks and the test: the `generate` section's engine settings with the
    hf engine always (`base_engine`: the warm-up trains the very model it samples, which no
    copy in a vLLM engine would follow without a sync per check)."""
    max_steps: int
    eval_every: int
    batch_size: int
    micro_batches: int
    family_shares: dict[str, float] | None
    reached_share: float
    lr: float
    warmup_steps: int
    min_lr_ratio: float
    seed: int
    target_pass_low: float
    target_pass_high: float
    band_margin: float
    eval_per_family: int
    test_samples: int
    eval_temperature: float
    eval_top_p: float
    max_response_tokens: int

    @classmethod
    def from_params(cls, params: ExperimentParams) -> BaseConfig:
        """`start` = `model.checkpoint`, `verify` from the `verify` section, `engine` from the
        `generate` section (the hf engine whatever it names); the rest from `base`
        by name, so a field on one side only is a TypeError. Where to save is the caller's
        (`base.path`)."""
        return cls(start=params.model.checkpoint, verify=VerifyConfig.from_params(params.verify),
                   engine=replace(EngineConfig.from_params(params), kind="hf"),
                   **params.base.model_dump(exclude={"path"}))
