"""The process environment every entry point runs with: offline, no telemetry, project-local caches.

The one home of these defaults. Nothing is set at import: each entry point (the `brorl` command,
`python -m commands.server`, `python -m commands.deploy`, `python -m brorl.train`, `python -m
commands.mlflow_ui`, the test suite's conftest) calls `apply_defaults()` first, before
prefect, mlflow, transformers or vLLM load; a variable already set wins. Child processes (the
Prefect and MLflow servers, `dvc repro` and its stages) inherit them, so `make run`, `dvc repro`
and `brorl <stage>` run alike. Creating folders is left to what writes into them. The caches
live in the `.cache` folder of the checkout the command runs in (`brorl.system.checkout`), not of the
one the code is installed from.

It also pins the CPU kernel paths a run's floats take (`FLOAT_PATHS`, on x86): MKL's AVX2 code
path in its strict reproducibility mode (`MKL_CBWR`: the same bits at any thread count) and
torch's AVX2 kernels (`ATEN_CPU_CAPABILITY`), so that a CPU with AVX-512 computes as one with
AVX2 only, and the supervised base stage gives the same weights at 1 and 2 threads (the RL update
still rounds a few sums by thread count: `make run` fixes the count, `RUN_THREADS` in the
Makefile; `benchmarks/reproducibility.py` measures the spread, `brorl.runs.machine` records what
held). Set either variable to choose another path (`MKL_CBWR=AUTO ATEN_CPU_CAPABILITY=avx512`:
each library's fastest here, whose results then vary by machine).

It also holds the Prefect settings that decide orchestration overhead (measured by
`benchmarks/prefect_overhead.py`) and that an environment variable can say;
`commands.server.PIPELINE_SERVER` and `flows.prefect_settings` hold the server-only ones and
the one no variable can carry.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from brorl.system.checkout import find_root

CACHES = {"PREFECT_HOME": "prefect", "HF_HOME": "hf", "TORCH_EXTENSIONS_DIR": "torch_extensions",
          "VLLM_CACHE_ROOT": "vllm"}
"""The cache folders, each under `<checkout>/.cache` (`brorl.system.checkout`) unless set."""

FLOAT_PATHS = {"MKL_CBWR": "AVX2,STRICT", "ATEN_CPU_CAPABILITY": "avx2"}
"""On x86: the kernel paths of every run unless set (module docstring). Read by MKL and torch
when they first compute, so they must be set before: every entry point applies them first."""

X86 = ("x86_64", "AMD64", "i686", "i386")


def defaults(environ: Mapping[str, str] | None = None, root: Path | None = None) -> dict[str, str]:
    """Every default, the caches under `root` (default: the checkout, `brorl.system.checkout.find_root`,
    looked for only when `environ` lacks one of them: a `CheckoutError` outside any), the Prefect
    paths under the PREFECT_HOME `environ` sets (else `<root>/.cache/prefect`)."""
    environ = os.environ if environ is None else environ
    if root is None and not CACHES.keys() <= environ.keys():
        root = find_root(environ)
    caches = {key: environ[key] if root is None else str(root / ".cache" / folder)
              for key, folder in CACHES.items()}
    home = Path(environ.get("PREFECT_HOME") or caches["PREFECT_HOME"])
    return {
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",  # 10-30 s on 2 busy cores
        # Prefect 3.7 defaults these three to ~/.prefect whatever PREFECT_HOME says (the server
        # warns "Unable to write to memo_store.toml"); the memo store also spares later server
        # starts the block auto-registration.
        "PREFECT_SERVER_MEMO_STORE_PATH": str(home / "memo_store.toml"),
        "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(home / "storage"),
        "PREFECT_LOGGING_CONFIG_PATH": str(home / "logging.yml"),
        # Task-run states reach the server as events: record them (and persist the events) in one
        # transaction per flush instead of one per event, which on SQLite collides with the API's
        # writes ("database is locked", a 2 s client retry each). Flushed every 5 s and at shutdown.
        "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "1000",
        "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_READ_BATCH_SIZE": "1000",
        "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_BATCH_SIZE": "1000",
        "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_READ_BATCH_SIZE": "1000",
        "DO_NOT_TRACK": "true",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        # every MLflow run brorl opens logs CPU, memory (and GPU) use, one sample each 10 s
        # (`tracking.system_metrics`); false turns it off
        "MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING": "true",
        "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL": "10",
        "DVC_NO_ANALYTICS": "1",
        "HF_HUB_OFFLINE": "1",  # every model and tokenizer is a local folder
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HOME": caches["HF_HOME"],
        "TOKENIZERS_PARALLELISM": "false",
        "TORCH_EXTENSIONS_DIR": caches["TORCH_EXTENSIONS_DIR"],  # DeepSpeed's JIT ops
        "VLLM_CACHE_ROOT": caches["VLLM_CACHE_ROOT"],
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine in the trainer's process
        **(FLOAT_PATHS if platform.machine() in X86 else {}),
    }


def with_defaults(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of `environ` (default: this process's) with every unset default filled in."""
    environ = os.environ if environ is None else environ
    return {**defaults(environ), **environ}


def apply_defaults(environ: MutableMapping[str, str] | None = None) -> None:
    """Set every default `environ` (default: `os.environ`) lacks; set values are kept."""
    environ = os.environ if environ is None else environ
    for key, value in defaults(environ).items():
        environ.setdefault(key, value)
