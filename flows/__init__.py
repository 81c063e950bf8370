"""Prefect flows: composition only (load params, open the MLflow run, call tasks, summarise).

Importing the package sets offline, project-local defaults before prefect or mlflow load, so
`dvc repro` and `python -m flows.NAME` behave like `make run` (already-set variables win).
"""

import os
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
_DEFAULTS = {
    "PREFECT_HOME": str(_ROOT / ".cache" / "prefect"),
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DVC_NO_ANALYTICS": "1",
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "TORCH_EXTENSIONS_DIR": str(_ROOT / ".cache" / "torch_extensions"),  # DeepSpeed's JIT ops
}
for _key, _value in _DEFAULTS.items():
    os.environ.setdefault(_key, _value)
Path(os.environ["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)
