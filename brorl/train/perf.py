"""Throughput of the trainer's forwards: FLOPs from the model's shape, MFU against a peak.

A forward over a position costs 2 FLOPs per weight of the transformer body, 2 per weight of the LM
head at the positions whose logits are used, and 4 x layers x attention width per key it attends
(the QK^T and AV products); a backward costs twice the forward (the usual 6 x parameters x tokens
for training, 2 x for a forward alone). Only real positions count (`brorl.train.micro.MicroBatch`:
its `valid`, `attended` and `predicted`), so padding lowers the MFU instead of inflating it.
The peak is `train.peak_tflops` when set, else the device's data-sheet bfloat16 peak
(`brorl.system.devices`); on a device with neither (a CPU) the MFU is left out, never guessed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from brorl.system.devices import peak
from brorl.train.micro import MicroBatch

TRAIN_FACTOR = 3
"""Forward + backward FLOPs over forward FLOPs."""


@dataclass(frozen=True)
class ModelShape:
    """What the FLOP count needs of a model."""

    body_params: int
    """Weights a position multiplies by outside the LM head and the embedding lookup."""
    head_params: int
    """Weights of the LM head (vocabulary x hidden)."""
    layers: int
    attention_width: int
    """Query heads x head dim."""

    @classmethod
    def of(cls, model: torch.nn.Module) -> ModelShape:
        """The shape of a transformers causal LM (tied or untied head)."""
        config = model.config
        embedding = model.get_input_embeddings().weight
        head = model.get_output_embeddings().weight
        total = sum(p.numel() for p in model.parameters())
        untied = 0 if head is embedding else head.numel()
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(body_params=total - embedding.numel() - untied, head_params=head.numel(),
                   layers=config.num_hidden_layers, attention_width=heads * head_dim)


def forward_flops(shape: ModelShape, micro_batches: Iterable[MicroBatch]) -> float:
    """FLOPs of one forward over the real positions of `micro_batches`."""
    total = 0.0
    for micro in micro_batches:
        total += 2.0 * shape.body_params * micro.valid + 2.0 * shape.head_params * micro.predicted \
            + 4.0 * shape.layers * shape.attention_width * micro.attended
    return total


def peak_flops(device: torch.device, override_tflops: float | None) -> float | None:
    """FLOP/s at 100% MFU: `override_tflops` (train.peak_tflops), else the CUDA device's data-sheet
    bfloat16 peak; None where neither is known."""
    if override_tflops is not None:
        return override_tflops * 1e12
    if device.type != "cuda":
        return None
    known = peak(torch.cuda.get_device_name(device))
    return None if known is None else known.bf16_tflops * 1e12


def plan_totals(shape: ModelShape, update: list[MicroBatch],
                scoring: list[MicroBatch]) -> dict[str, float]:
    """Sums over one rank's micro-batches that the step's `perf/*` need (summed over ranks before
    `perf_metrics`, so every rank reports the same figures)."""
    return {"computed": float(sum(m.computed for m in update) + sum(m.computed for m in scoring)),
            "valid": float(sum(m.valid for m in update) + sum(m.valid for m in scoring)),
            "update_flops": TRAIN_FACTOR * forward_flops(shape, update),
            "score_flops": forward_flops(shape, scoring)}


def perf_metrics(totals: dict[str, float], update_s: float, scoring_s: float,
                 trained_tokens: float, peak: float | None, devices: int = 1) -> dict[str, float]:
    """The step's `perf/*` metrics from `plan_totals` (over all `devices`): trained tokens per
    second of update, the share of computed positions that are padding (update and scoring), and
    the MFU of the update and of scoring where the peak (per device) is known."""
    computed, valid = totals["computed"], totals["valid"]
    out = {"perf/tokens_per_s": trained_tokens / update_s if update_s > 0 else 0.0,
           "perf/padding_share": (computed - valid) / computed if computed else 0.0}
    if peak is not None:
        if update_s > 0:
            out["perf/mfu"] = totals["update_flops"] / (update_s * peak * devices)
        if scoring_s > 0:
            out["perf/score_mfu"] = totals["score_flops"] / (scoring_s * peak * devices)
    return out
