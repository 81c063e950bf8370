"""Every params file validates; typos and bad values fail with a message naming them."""

from __future__ import annotations

from pathlib import Path

import pytest

from brorl.params import ExperimentParams, ParamsError, load_params

ROOT = Path(__file__).resolve().parents[1]
PIPELINES = sorted((ROOT / "params").glob("pipeline*.yaml"))
"""dvc.yaml's `vars` files: which params file each stage runs, not experiment params."""
PARAMS = sorted(set((ROOT / "params").glob("*.yaml")) - set(PIPELINES))


def test_there_are_params_files():
    assert any(p.name == "simulate.yaml" for p in PARAMS)


@pytest.mark.parametrize("path", PARAMS, ids=lambda p: p.name)
def test_every_params_file_validates(path):
    assert isinstance(load_params(path), ExperimentParams)


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


def test_out_of_range_value_and_cross_field_rule_fail_with_the_fix(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("simulate:\n  lr: -1\n")
    with pytest.raises(ParamsError, match="simulate.lr"):
        load_params(bad)
    bad.write_text("simulate:\n  vocab_size: 100\n  num_correct: 100\n")
    with pytest.raises(ParamsError, match="Lower num_correct or raise vocab_size"):
        load_params(bad)


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
    assert set(stages) == {"data", "base", "prorl_warmup", "prorl", "brorl", "compare"}
    p = {name: load_params(ROOT / s["params"]) for name, s in stages.items()}
    assert Path(p["data"].data.path).parent == Path(stages["data"]["out"])
    assert Path(p["base"].base.path).parent == Path(stages["base"]["out"])
    for arm in ("prorl_warmup", "prorl", "brorl"):
        assert p[arm].train.run_dir == stages[arm]["out"] and p[arm].name == stages[arm]["name"]
        assert p[arm].data.path == p["data"].data.path
    assert p["prorl_warmup"].train.init_checkpoint == p["base"].base.path
    for arm in ("prorl", "brorl"):
        assert p[arm].train.init_checkpoint == f"{stages['prorl_warmup']['out']}/policy"
    assert p["compare"].compare.report_dir == stages["compare"]["out"]
    assert p["compare"].name == stages["compare"]["name"]  # metrics/<name>.json, the stage's metrics
    arms = {name: load_params(ROOT / f) for name, f in p["compare"].compare.arms.items()}
    assert [a.train.run_dir for a in arms.values()] == [stages["prorl"]["out"], stages["brorl"]["out"]]


def test_a_band_margin_that_empties_the_band_is_refused():
    # 0.2 + 0.25 > 0.6 - 0.25: nothing left between the narrowed ends
    with pytest.raises(ParamsError, match="band_margin"):
        load_params(ROOT / "params" / "tiny.yaml", ["base.band_margin=0.25"])
