"""A run folder's files without torch (`brorl/runs/folder.py`): the params record a resume compares,
the `latest` pointer, and the copy of the record each committed checkpoint carries."""

from __future__ import annotations

import json

import pytest

from brorl.params import load_params
from brorl.runs import folder as run_files
from brorl.runs.files import atomic_write_text
from brorl.train import checkpoint as ckpt

CI = "params/prorl_ci.yaml"


def test_only_the_stop_rules_schedules_and_places_may_change_on_resume():
    base = load_params(CI).model_dump(mode="json")
    resumable = ["train.steps=3", "train.max_rollouts=64", "train.max_seconds=60",
                 "train.eval_every=1", "train.checkpoint_every=1", "train.keep_checkpoints=5",
                 "train.save_rollouts=false", "train.run_dir=elsewhere",
                 "train.checkpoint_dir=elsewhere/ck", "tracking.experiment=other"]
    moved = load_params(CI, resumable).model_dump(mode="json")
    assert run_files.changed_params(base, moved) == []
    other = load_params(CI, ["train.algorithm=brorl", "update.rollouts_per_prompt=32",
                             "train.seed=1"]).model_dump(mode="json")
    assert run_files.changed_params(base, other) == [
        ("train.algorithm", "prorl", "brorl"), ("train.seed", 0, 1),
        ("update.rollouts_per_prompt", 16, 32)]


def test_a_key_only_one_side_holds_is_not_compared():
    """A knob added to the schema after a checkpoint was written: its record lacks the key."""
    assert run_files.changed_params({"train": {"steps": 1}}, {"train": {"steps": 1, "new": 2},
                                                           "section": {"knob": 3}}) == []
    assert run_files.changed_params({"a": {"b": [1, 2]}}, {"a": {"b": [1, 3]}}) == [
        ("a.b", [1, 2], [1, 3])]


def test_a_committed_checkpoint_carries_the_record_of_the_run_that_wrote_it(tmp_path):
    root = tmp_path / "ck"
    run_files.record_params(root, {"name": "first"})
    for step, name in ((1, "first"), (2, "second")):
        if name == "second":  # a run with other params opened on the same folder
            run_files.record_params(root, {"name": "second"})
        staged = ckpt.staging_dir(root, step)
        staged.mkdir(parents=True)
        ckpt.write_state(staged, {"step": step})
        ckpt.commit(root, step, keep=2)
    assert run_files.recorded_params(root / "step_000001") == {"name": "first"}
    assert run_files.recorded_params(root / "step_000002") == {"name": "second"}
    assert run_files.latest_checkpoint(root) == root / "step_000002"
    (root / "step_000002" / run_files.PARAMS_FILE).write_text("[1]")
    with pytest.raises(run_files.CheckpointError, match="not a params record"):
        run_files.recorded_params(root / "step_000002")


def test_a_pointer_to_a_missing_checkpoint_falls_back_or_refuses_never_starts_over(tmp_path):
    root = tmp_path / "ck"
    assert run_files.latest_checkpoint(root) is None  # no folder: a fresh run
    atomic_write_text(root / run_files.LATEST_FILE, "step_000002\n")
    with pytest.raises(run_files.CheckpointError, match="names step_000002, which is not a "
                                                        "complete checkpoint, and no other"):
        run_files.latest_checkpoint(root)
    (root / "step_000001").mkdir()
    (root / "step_000001" / run_files.STATE_FILE).write_text(json.dumps({"step": 1}))
    assert run_files.latest_checkpoint(root) == root / "step_000001"
    assert run_files.pointed(root) == "step_000002"


def test_atomic_write_leaves_the_old_file_when_the_write_fails(tmp_path):
    path = tmp_path / "deep" / "file.json"
    atomic_write_text(path, "old\n")
    with pytest.raises(TypeError):
        atomic_write_text(path, None)  # type: ignore[arg-type]
    assert path.read_text() == "old\n" and [p.name for p in path.parent.iterdir()] == ["file.json"]
    assert oct(path.stat().st_mode & 0o777) == "0o644"


def test_a_checkpoint_without_a_params_record_has_none_to_compare(tmp_path):
    """A checkpoint written before the record existed (`brorl.runs.legacy.params_unrecorded`)."""
    folder = tmp_path / "step_000001"
    folder.mkdir()
    assert run_files.recorded_params(folder) is None
    (folder / run_files.PARAMS_FILE).write_text('{"name": "first"}')
    assert run_files.recorded_params(folder) == {"name": "first"}
