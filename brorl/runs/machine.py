"""What besides the seed and the params can change a run's numbers: the machine's conditions,
written with each run as `<out>.machine.json` beside its output (`outputs/prorl.machine.json`
beside a training run's folder, `outputs/base.machine.json` beside the base stage's), so that two
results can be told apart by what made them.

A training step's floats depend on the order in which sums are rounded, which the math libraries
choose by the CPU's instruction set (torch's own kernels by `ATEN_CPU_CAPABILITY`, MKL's by
`MKL_ENABLE_INSTRUCTIONS` and `MKL_CBWR`, oneDNN's by `ONEDNN_MAX_CPU_ISA`) and, for MKL unless
`MKL_CBWR` says STRICT, by the number of threads: a different last bit in one step changes what
is sampled later, then every score. `brorl.system.environment` pins those paths by default and `make
run` the thread count (the spread they remove: `benchmarks/reproducibility.py`, in
docs/benchmarks.md); this record says what held: the versions of Python and of the libraries that
compute or score, the CPU and the instruction sets that matter, torch's kernel path and thread
count, the variables that steer them, the GPU if one is used, and the verifiers' time-limit
clock (`brorl.verifiers.clock`: load-independent where the kernel keeps run delays).

Every field is the same for every run of one command on one machine (no clock, no host name,
no process id). Beside the output, never inside it, like its timings (`brorl.runs.timings`):
`.gitignore` and `.dvcignore` list `*.machine.json`, so the record is in no output's hash. A
machine (or thread count) that reproduces the results then writes the same outputs, the same
`dvc.lock` and leaves the checkout clean, while the record still says what each run had. MLflow
keeps a copy with the run's other artifacts.
Deliberately ignored: the kernel, the C library and the compiler torch was built with (its
version stands for them); per-core differences of a heterogeneous CPU.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import platform
import re
from pathlib import Path
from typing import Any

from brorl.runs.files import atomic_write_text

SUFFIX = ".machine.json"
"""What `machine_path` appends to an output's name (listed in .gitignore and .dvcignore)."""

PACKAGES = ("torch", "transformers", "tokenizers", "numpy", "math-verify", "sympy",
            "reasoning-gym", "vllm")
"""The libraries whose version can change a float, a sample or a verdict."""

VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS",
             "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "CUBLAS_WORKSPACE_CONFIG")
"""The environment variables that choose a kernel path or a thread count (None: unset)."""

CPU_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16",
             "amx_tile", "asimd", "sve")
"""The instruction sets that decide which kernels the libraries pick (x86 and Arm)."""


def conditions() -> dict[str, Any]:
    """The record (module docstring); imports torch."""
    import torch

    from brorl.verifiers.clock import available

    return {
        "python": platform.python_version(),
        "packages": {name: _version(name) for name in PACKAGES},
        "cpu": cpu_model(),
        "cpu_flags": [flag for flag in CPU_FLAGS if flag in cpu_flags()],
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "intra_op_threads": torch.get_num_threads(),
        "math_libraries": math_libraries(torch.__config__.show()),
        "variables": {name: os.environ.get(name) for name in VARIABLES},
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "verify_clock": "wall less CPU waits" if available() else "wall",
    }


def machine_path(out: str | Path) -> Path:
    """`<out>.machine.json`: beside the output `out`, never inside it."""
    out = Path(out)
    return out.with_name(out.name + SUFFIX)


def write_machine(out: str | Path) -> Path:
    """Write this process's `conditions()` as the record of output `out`, atomically; its
    path."""
    path = machine_path(out)
    atomic_write_text(path, json.dumps(conditions(), indent=1, sort_keys=True) + "\n")
    return path


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def _cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def cpu_model() -> str:
    """The CPU's model name (`/proc/cpuinfo`), else what `platform` says."""
    found = re.search(r"^(?:model name|Model|CPU part)\s*:\s*(.+)$", _cpuinfo(), re.M)
    return found.group(1).strip() if found else platform.processor() or platform.machine()


def cpu_flags() -> set[str]:
    """The instruction-set flags of the first CPU (`flags` on x86, `Features` on Arm)."""
    found = re.search(r"^(?:flags|Features)\s*:\s*(.+)$", _cpuinfo(), re.M)
    return set(found.group(1).split()) if found else set()


def math_libraries(config: str) -> dict[str, str | None]:
    """MKL's and oneDNN's versions from torch's build summary (`torch.__config__.show()`)."""
    mkl = re.search(r"Math Kernel Library Version (\S+)", config)
    onednn = re.search(r"(?:MKL-DNN|oneDNN) (v\S+)", config)
    return {"mkl": mkl.group(1) if mkl else None, "onednn": onednn.group(1) if onednn else None}
