"""The `update` and `filter` params sections: the LR rule from an overlay, validation, Literals."""

from __future__ import annotations

import math
import subprocess
import sys
from typing import get_args

import pytest

from brorl.params import ExperimentParams, FilterParams, ParamsError, UpdateParams, load_params
from brorl.params.rl import AdvantageEstimator, KeepRule, KLEstimator, TISMode


def test_brorl_overlay_scales_lr_by_sqrt8_and_keeps_mini_batch_count(tmp_path):
    (tmp_path / "prorl.yaml").write_text("update:\n  base_lr: 2.0e-6\n")
    (tmp_path / "brorl.yaml").write_text(
        "extends: prorl.yaml\nupdate:\n  prompts_per_step: 128\n  rollouts_per_prompt: 512\n"
    )
    prorl = load_params(tmp_path / "prorl.yaml").update
    brorl = load_params(tmp_path / "brorl.yaml").update
    assert (prorl.samples_per_step, brorl.samples_per_step) == (8192, 65536)  # 512x16, 128x512
    assert prorl.lr == 2e-6
    assert brorl.lr == pytest.approx(2e-6 * math.sqrt(8))  # 5.657e-6
    assert brorl.mini_batches_per_step == prorl.mini_batches_per_step == 4
    assert (prorl.mini_batch_rollouts, brorl.mini_batch_rollouts) == (2048, 16384)  # 8192/4, 65536/4


def test_defaults_are_the_prorlv2_values():
    u = ExperimentParams().update
    assert (u.clip_eps_low, u.clip_eps_high, u.kl_estimator) == (0.2, 0.28, "k2")
    assert u.advantage_estimator == "reinforce_pp_baseline" and not u.reset_optimizer_on_reference_reset
    assert ExperimentParams().filter.max_draws == 10


def test_each_variant_field_is_typed_by_its_one_alias():
    """The schema declares each variant set once; the algorithm's functions and records are
    typed by the same alias (`brorl.params.rl`)."""
    fields = UpdateParams.model_fields
    assert fields["advantage_estimator"].annotation is AdvantageEstimator
    assert fields["kl_estimator"].annotation is KLEstimator
    assert fields["tis_mode"].annotation is TISMode
    assert FilterParams.model_fields["keep_rule"].annotation is KeepRule
    assert get_args(KLEstimator) == ("k1", "k2", "k3")


def test_misspelt_key_and_bad_values_fail(tmp_path):
    (tmp_path / "typo.yaml").write_text("update:\n  clip_eps_hi: 0.3\n")
    with pytest.raises(ParamsError, match="clip_eps_hi: unknown key"):
        load_params(tmp_path / "typo.yaml")
    with pytest.raises(ValueError, match="pick a divisor of the rollouts trained, B \\* N"):
        UpdateParams(prompts_per_step=3, rollouts_per_prompt=3, mini_batches_per_step=4)
    with pytest.raises(ValueError, match="tis_min"):
        UpdateParams(tis_min=6.0)
    with pytest.raises(ValueError, match="wrong_reward"):
        FilterParams(wrong_reward=1.0)


def test_params_and_algorithm_import_no_orchestration_and_params_no_torch():
    code = (
        "import sys, brorl.params; assert 'torch' not in sys.modules, 'params pulled torch';"
        "import brorl.algorithm.advantages, brorl.algorithm.filtering, brorl.algorithm.losses,"
        " brorl.algorithm.schedule;"
        "bad = [m for m in ('prefect', 'mlflow', 'dvc') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
