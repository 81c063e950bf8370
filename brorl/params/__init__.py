"""Experiment parameters: the one pydantic schema of brorl, and the YAML loader.

Every experiment is one `ExperimentParams`, read from a YAML file under `params/`. A file may
start with `extends: other.yaml` or a list of files (paths relative to it): those are loaded
first, in order, and this file's keys are deep-merged over them, so the CI-sized files and the
ProRL/BroRL arms are small overlays. `key.sub=value` overrides (the CLI's `-S`) apply last.
Unknown keys fail, naming the file and the key; so do values out of range.

Sections are named after the pipeline stages. Each field's docstring gives its unit and, where the
value comes from a source, that source's own section: the BroRL paper's ("BroRL §4.2.1", "BroRL
Table 1") or the baseline's (ProRL, arXiv 2505.24864; the ProRLv2 blog post; NeMo-RL's ProRLv2
example config); "our choice" where no source fixes it (docs/algorithm.md lists them).
This package is the only one that knows the schema: brorl functions take plain arguments, and
each stage's plain config is built by one `from_params` beside it (`TrainerConfig`, `SimConfig`,
`DataConfig`, `BaseConfig`). The package imports none of them (nor torch): the defaults live
here only, so a mapping that misses a field fails loudly.

Modules: `loading` (files, overrides, errors), `theory` (`simulate`), `data` (`data`, `model`,
`base`), `rl` (`update`, `filter`, `generate`, `verify`), `run` (`train`, `diagnostics`, `compare`,
`tracking`), `experiment` (the root).
"""

from __future__ import annotations

from brorl.params.data import BaseParams, DataParams, ModelParams
from brorl.params.experiment import ExperimentParams
from brorl.params.loading import (
    ParamsError,
    apply_override,
    compare_arms,
    load_params,
    read_yaml_tree,
    same_named,
)
from brorl.params.rl import FilterParams, GenerateParams, UpdateParams, VerifyParams
from brorl.params.run import CompareParams, DiagnosticsParams, TrackingParams, TrainParams
from brorl.params.theory import SimulateParams

__all__ = [
    "BaseParams",
    "CompareParams",
    "DataParams",
    "DiagnosticsParams",
    "ExperimentParams",
    "FilterParams",
    "GenerateParams",
    "ModelParams",
    "ParamsError",
    "SimulateParams",
    "TrackingParams",
    "TrainParams",
    "UpdateParams",
    "VerifyParams",
    "apply_override",
    "compare_arms",
    "load_params",
    "read_yaml_tree",
    "same_named",
]
