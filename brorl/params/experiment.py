"""`ExperimentParams`: the root of the schema, one field per pipeline section.

Plain configs are built beside what reads them (`TrainerConfig.from_params`,
`SimConfig.from_params`, `DataConfig.from_params`, `BaseConfig.from_params`); this package never
imports them, so a default lives here only. Rules that tie two sections together are checked
here (`_check_sections`).
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from pydantic import Field, ValidationError, model_validator

from brorl.params.data import BaseParams, DataParams, ModelParams
from brorl.params.rl import FilterParams, GenerateParams, UpdateParams, VerifyParams
from brorl.params.run import CompareParams, DiagnosticsParams, TrackingParams, TrainParams
from brorl.params.section import Section
from brorl.params.study import StudyParams
from brorl.params.theory import SimulateParams


class ExperimentParams(Section):
    """One experiment: every section of the pipeline. Unset sections keep their defaults."""

    name: str = "experiment"
    """Short experiment name, used in run names and output folders."""
    simulate: SimulateParams = SimulateParams()
    data: DataParams = Field(default_factory=DataParams)
    model: ModelParams = ModelParams()
    base: BaseParams = BaseParams()
    update: UpdateParams = UpdateParams()
    filter: FilterParams = FilterParams()
    generate: GenerateParams = GenerateParams()
    verify: VerifyParams = VerifyParams()
    train: TrainParams = TrainParams()
    diagnostics: DiagnosticsParams = DiagnosticsParams()
    compare: CompareParams = CompareParams()
    tracking: TrackingParams = TrackingParams()
    study: StudyParams = StudyParams()

    def output_label(self, folder: str) -> str:
        """A run's own name for its DVC metrics file and plot folder, from the folder it writes
        (`<tracking.metrics_dir>/<label>.json`): the folder under `tracking.output_dir`, `/` as
        `_` (`outputs/prorl` -> `prorl`, `outputs/ci/compare` -> `ci_compare`), else the folder's
        own name. Two runs writing different folders never share it, whatever their params files
        are called (`-S compare.report_dir=...` cannot overwrite another run's metrics)."""
        path, out = PurePosixPath(folder), PurePosixPath(self.tracking.output_dir)
        try:
            parts = path.relative_to(out).parts
        except ValueError:
            parts = (path.name,)
        return "_".join(parts) or self.name

    @property
    def run_label(self) -> str:
        """The training run's label: `output_label` of its `train.run_dir`."""
        return self.output_label(self.train.run_dir)

    @property
    def data_label(self) -> str:
        """The data stage's label: `output_label` of the folder holding `data.path`."""
        return self.output_label(str(PurePosixPath(self.data.path).parent))

    @property
    def model_label(self) -> str:
        """The model stage's label: `output_label` of the folder holding `model.path`."""
        return self.output_label(str(PurePosixPath(self.model.path).parent))

    @property
    def base_label(self) -> str:
        """The base stage's label: `output_label` of the folder holding `base.path`."""
        return self.output_label(str(PurePosixPath(self.base.path).parent))

    @property
    def compare_label(self) -> str:
        """The comparison's label: `output_label` of its `compare.report_dir`."""
        return self.output_label(self.compare.report_dir)

    @property
    def study_label(self) -> str:
        """The study's label: `output_label` of its `study.out_dir`."""
        return self.output_label(self.study.out_dir)

    @model_validator(mode="before")
    @classmethod
    def _report_in_own_folder(cls, data: Any) -> Any:
        """An unset `compare.report_dir` becomes `<tracking.output_dir>/<name>/compare`."""
        if not isinstance(data, dict):
            return data
        compare, tracking = data.get("compare") or {}, data.get("tracking") or {}
        if isinstance(compare, dict) and isinstance(tracking, dict) \
                and compare.get("report_dir") is None:
            out = tracking.get("output_dir", TrackingParams.model_fields["output_dir"].default)
            name = data.get("name", cls.model_fields["name"].default)
            if isinstance(out, str) and isinstance(name, str):  # else their checks name them
                data = {**data, "compare": {**compare, "report_dir": f"{out}/{name}/compare"}}
        return data

    @model_validator(mode="after")
    def _check_sections(self) -> ExperimentParams:
        if self.update.tis_mode != "none" and self.generate.top_p < 1:
            raise ValueError(
                f"update.tis_mode = {self.update.tis_mode!r} needs generate.top_p = 1 (got "
                f"{self.generate.top_p}): the trainer scores log-probs without top-p, so the "
                "engine->trainer ratio would be the nucleus mass, not an off-policy correction; "
                "set generate.top_p: 1.0 or update.tis_mode: none.")
        for name, arm in self.study.arms.items():  # each arm's runs' update section, now
            try:
                UpdateParams.model_validate({**self.update.model_dump(), **arm.update})
            except ValidationError as err:
                why = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'update'}: "
                                f"{e['msg'].removeprefix('Value error, ')}" for e in err.errors())
                raise ValueError(f"study.arms.{name}.update {arm.update}: {why}") from None
        return self
