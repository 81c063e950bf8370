"""The base stage: supervised warm-up of the tiny policy to a middling checkpoint (BroRL §4.2.1,
Table 1).

`config` holds the stage's settings (`BaseConfig`); `checkpoint` builds, warms up and scores the
policy of one experiment (`make_base_checkpoint`; `split_report` keeps its wall-clock figures
apart); `supervised` holds the warm-up itself (batches,
micro-batches, the LR schedule, the validation stopping rule and selection).
"""

from __future__ import annotations

from brorl.base.checkpoint import make_base_checkpoint, split_report
from brorl.base.config import BaseConfig
from brorl.base.supervised import (
    IGNORE,
    WarmUpState,
    band_distance,
    base_engine,
    batch_loss_backward,
    collate,
    encode_pairs,
    family_weights,
    length_sorted_chunks,
    lr_at,
    round_shares,
    start_warm_up,
    train_steps,
    warm_up,
)

__all__ = [
    "IGNORE",
    "BaseConfig",
    "WarmUpState",
    "band_distance",
    "base_engine",
    "batch_loss_backward",
    "collate",
    "encode_pairs",
    "family_weights",
    "length_sorted_chunks",
    "lr_at",
    "make_base_checkpoint",
    "round_shares",
    "split_report",
    "start_warm_up",
    "train_steps",
    "warm_up",
]
