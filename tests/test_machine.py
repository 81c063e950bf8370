"""The machine's conditions written with each run (`brorl.runs.machine`): what they hold, that they
hold no clock (a rerun on one machine writes the same bytes), that a run writes them beside its
folder, in no output's hash; and that the files git tracks hold no clock either."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from brorl.runs import machine
from brorl.runs.timings import is_timing
from brorl.train.report import eval_csv, summary_record, write_summary

ROOT = Path(__file__).resolve().parents[1]
CONFIG = """PyTorch built with:
  - Intel(R) oneAPI Math Kernel Library Version 2024.2-Product Build 20240605 for Intel(R) 64
  - Intel(R) MKL-DNN v3.12.0 (Git Hash 80afa71049cd69a3df32adcccb623b12cd7baa22)
"""


def _keys(value, prefix=""):
    if isinstance(value, dict):
        for key, inner in value.items():
            yield prefix + key
            yield from _keys(inner, prefix + key + "/")


def test_conditions_say_what_decides_the_floats(monkeypatch):
    monkeypatch.setenv("MKL_CBWR", "AVX2,STRICT")
    threads = torch.get_num_threads()
    record = machine.conditions()
    assert record["intra_op_threads"] == threads
    assert record["variables"]["MKL_CBWR"] == "AVX2,STRICT"
    assert record["packages"]["torch"] == torch.__version__
    assert record["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert set(record["cpu_flags"]) <= set(machine.CPU_FLAGS)
    assert record["verify_clock"] in ("wall less CPU waits", "wall")
    torch.set_num_threads(1 if threads > 1 else 2)
    try:
        assert machine.conditions()["intra_op_threads"] != threads
    finally:
        torch.set_num_threads(threads)


def test_conditions_are_the_same_bytes_each_time_and_hold_no_timing():
    first = json.dumps(machine.conditions(), sort_keys=True)
    assert json.dumps(machine.conditions(), sort_keys=True) == first
    assert [key for key in _keys(machine.conditions()) if is_timing(key)] == []


def test_math_library_versions_come_from_torchs_build_summary():
    assert machine.math_libraries(CONFIG) == {"mkl": "2024.2-Product", "onednn": "v3.12.0"}
    assert machine.math_libraries("") == {"mkl": None, "onednn": None}


def test_a_runs_summary_and_its_machine_record_beside_it(tmp_path):
    summary = {"name": "r", "steps": 3, "train_seconds": 1.5, "rollouts": 48,
               "checkpoint": str(tmp_path / "out" / "checkpoints" / "step_000003"),
               "policy": str(tmp_path / "out" / "policy"), "history": [{"seconds": 1.0}]}
    (tmp_path / "out").mkdir()
    write_summary(tmp_path / "out", summary, [{"step": 1}], tmp_path)
    record = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert record == summary_record(summary, [{"step": 1}], tmp_path)
    assert "train_seconds" not in record and record["history"] == [{"step": 1}]
    assert (record["checkpoint"], record["policy"]) == ("out/checkpoints/step_000003",
                                                        "out/policy")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["summary.json"]  # no clock
    beside = machine.machine_path(tmp_path / "out")
    assert beside == tmp_path / "out.machine.json"
    assert json.loads(beside.read_text()) == machine.conditions()


def test_git_and_dvc_ignore_the_machine_record():
    """Never in an output's hash: a machine that reproduces the results leaves dvc.lock as is."""
    for name in (".gitignore", ".dvcignore"):
        assert "*" + machine.SUFFIX in (ROOT / name).read_text().split(), name


def test_the_plot_file_git_tracks_holds_no_clock():
    """`plots/<arm>/eval.csv` is committed: two runs of the same scores write the same text,
    however long their evaluations took."""
    def rows(seconds):
        family = {"score": 0.5, "pass_at_1": 0.25}
        return [{"step": s, "rollouts": 16 * s, "seconds": seconds * s, "split": "test",
                 "scores": {"family": {"math": family, "code": family}}} for s in (0, 4)]

    text = eval_csv(rows(1.0))
    assert text == eval_csv(rows(97.3))
    assert text.splitlines()[0].split(",")[:3] == ["step", "rollouts", "split"]
