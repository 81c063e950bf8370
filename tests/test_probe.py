"""The hard-prompt probe (`brorl.study.probe`): its record by hand from made-up counts, a real probe
of the warmed-up tiny policy at CI sizes (who gets the full count, the hard set, determinism), and
the command's one-line answer to a missing checkpoint or data folder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from brorl.params import load_params
from brorl.study.probe import ProbeConfig, main, probe, summarise

ROOT = Path(__file__).resolve().parents[1]
TINY_CI = ROOT / "params" / "tiny_ci.yaml"
SMALL = ProbeConfig(prompts=12, max_hard=12, screen_samples=4, full_samples=32)


def _params(data: Path):
    """tiny_ci on the easy split, sampled as easy_base was warmed up (24 tokens)."""
    return load_params(TINY_CI, [f"data.path={data}", "generate.max_response_tokens=24",
                                 "generate.temperature=1.0"])


def test_the_record_counts_the_probed_prompts_by_hand():
    problems = [SimpleNamespace(id=f"q{i}", family="math", task="compare") for i in range(5)]
    config = ProbeConfig(prompts=5, max_hard=3, screen_samples=16, full_samples=512)
    screen = np.array([0, 1, 9, 0, 0])  # hard: 0, 1, 3, 4; probed: the first three of them
    solves = np.array([4, 1, 9, 64, 0])
    tries = np.array([512, 512, 16, 512, 16])
    record = summarise(problems, screen, solves, tries, np.array([0, 1, 3, 4]),
                       np.array([0, 1, 3]), config, {"screen": 1.0, "total": 2.0})
    # probed p = 4/512, 1/512, 64/512 = 1/128, 1/512, 1/8
    assert (record["hard"], record["probed"], record["rollouts"]) == (4, 3, 1568)
    counts = {row["bin"]: row["count"] for row in record["histogram"]}
    assert counts["(0, 0.001953]"] == 1 and counts["(0.001953, 0.01562]"] == 1
    assert counts["(0.0625, 0.25]"] == 1 and sum(counts.values()) == 3
    assert record["below_one_in_screen"] == 2  # 1/128 and 1/512 lie below 1/16, 1/8 does not
    assert record["unsolved_in_screen_solved_later"] == 2  # q0 and q3: 0 of 16, then 4 and 64
    p = np.array([4, 1, 64]) / 512
    assert record["rescued_mean_n16_n512"] == pytest.approx(
        np.mean((1 - p) ** 16 - (1 - p) ** 512))
    assert record["keep_rate_n16"] == pytest.approx(np.mean(1 - p ** 16 - (1 - p) ** 16))
    assert [q["hard"] for q in record["prompts"]] == [True, True, False, True, True]


def test_a_screen_as_large_as_the_full_count_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="Raise full_samples or lower screen_samples"):
        ProbeConfig(screen_samples=16, full_samples=16)


def test_hard_prompts_get_the_full_count_and_the_others_keep_the_screen(easy_base, easy_data):
    record = probe(_params(easy_data), easy_base, SMALL)
    rows = record["prompts"]
    hard = [q for q in rows if q["screen_solves"] <= SMALL.hard_max_solves]
    assert [q["hard"] for q in rows] == [q in hard for q in rows]
    assert 0 < len(hard) < len(rows), rows  # the warmed-up policy solves some prompts, not all
    assert record["hard"] == len(hard) and record["probed"] == len(hard)  # max_hard = all 12
    for q in rows:
        assert q["tries"] == (SMALL.full_samples if q["hard"] else SMALL.screen_samples)
        assert q["screen_solves"] <= q["solves"] <= q["tries"]
        if not q["hard"]:
            assert q["solves"] == q["screen_solves"]
    assert sum(row["count"] for row in record["histogram"]) == record["hard"]
    assert record["rollouts"] == sum(q["tries"] for q in rows)
    assert len({q["id"] for q in rows}) == SMALL.prompts


def test_only_the_first_hard_prompts_are_probed_and_a_seed_repeats_its_record(
        easy_base, easy_data):
    config = ProbeConfig(prompts=8, max_hard=1, screen_samples=4, full_samples=16, seed=3)
    first, again = (probe(_params(easy_data), easy_base, config) for _ in range(2))
    assert first["seconds"] and {**first, "seconds": None} == {**again, "seconds": None}
    hard = [q for q in first["prompts"] if q["hard"]]
    assert first["probed"] == min(1, len(hard))
    assert [q["tries"] for q in hard] == [16] + [4] * (len(hard) - 1)
    other = probe(_params(easy_data), easy_base, ProbeConfig(
        prompts=8, max_hard=1, screen_samples=4, full_samples=16, seed=4))
    assert [q["id"] for q in other["prompts"]] != [q["id"] for q in first["prompts"]]


def test_a_missing_checkpoint_is_one_line_naming_it_and_the_command_that_makes_it(tmp_path):
    out = tmp_path / "probe.json"
    missing = tmp_path / "no_checkpoint"
    done = subprocess.run(
        [sys.executable, "-m", "brorl.study.probe", "--params", str(TINY_CI),
         "--checkpoint", str(missing), "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert str(missing) in lines[0] and "brorl model --params" in lines[0]
    assert not out.exists()


def test_a_missing_data_folder_names_the_data_stage(easy_base, tmp_path, capsys):
    missing = tmp_path / "no_data"
    code = main(["--params", str(TINY_CI), "-S", f"data.path={missing}",
                 "--checkpoint", str(easy_base), "--out", str(tmp_path / "probe.json")])
    err = capsys.readouterr().err
    assert code == 2 and str(missing) in err and "brorl data --params" in err
    assert not (tmp_path / "probe.json").exists()


def test_the_command_writes_the_record_and_prints_the_table(easy_base, easy_data, tmp_path,
                                                            capsys):
    out = tmp_path / "probe.json"
    code = main(["--params", str(TINY_CI), "-S", f"data.path={easy_data}",
                 "-S", "generate.max_response_tokens=24", "--checkpoint", str(easy_base),
                 "--out", str(out), "--prompts", "3", "--max-hard", "1"])
    record = json.loads(out.read_text())
    assert code == 0 and record["screened"] == 3 and record["probed"] <= 1
    assert record["checkpoint"] == str(easy_base)
    text = capsys.readouterr().out
    assert "| prompts |" in text and "screened 3 train prompts at N = 16" in text
