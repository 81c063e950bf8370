"""What a known accelerator can do at most: dense bfloat16 FLOP/s and memory bandwidth, from the
vendors' data sheets, for figures such as a decode step's memory floor (`memory_floor_s`).

A device is found by a substring of its name (`torch.cuda.get_device_name`); an unknown device
has no entry (`peak(name)` is None) and a figure that needs one is left out, never guessed.
The SXM and PCIe forms of one chip differ; the table keys the forms that name themselves
(`"H100 PCIe"`) before the chip's plain name, so the first match is the most specific.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DevicePeak:
    """One device's data-sheet peaks."""

    bf16_tflops: float
    """Dense bfloat16 tensor-core TFLOP/s (no structured sparsity)."""
    memory_tbs: float
    """Memory bandwidth, TB/s (1e12 bytes per second)."""


PEAKS: dict[str, DevicePeak] = {
    "H200": DevicePeak(989.0, 4.8),
    "H100 PCIe": DevicePeak(756.0, 2.0),
    "H100 NVL": DevicePeak(835.0, 3.9),
    "H100": DevicePeak(989.0, 3.35),
    "A100-PCIE-40GB": DevicePeak(312.0, 1.56),
    "A100 80GB PCIe": DevicePeak(312.0, 1.94),
    "A100": DevicePeak(312.0, 2.04),
    "L40S": DevicePeak(362.0, 0.864),
    "L4": DevicePeak(121.0, 0.3),
    "RTX 4090": DevicePeak(165.0, 1.01),
}
"""Name substring -> peaks, most specific first (NVIDIA data sheets)."""


def peak(name: str) -> DevicePeak | None:
    """The peaks of the device called `name`; None when no entry's key is part of it."""
    return next((value for key, value in PEAKS.items() if key in name), None)


def memory_floor_s(bytes_read: float, memory_tbs: float) -> float:
    """Seconds to read `bytes_read` once at `memory_tbs`: the least a memory-bound step takes."""
    return bytes_read / (memory_tbs * 1e12)


def resolve_dtype(name: str) -> str:
    """A params dtype with `auto` resolved: bfloat16 where CUDA is present, else float32."""
    if name != "auto":
        return name
    import torch

    return "bfloat16" if torch.cuda.is_available() else "float32"
