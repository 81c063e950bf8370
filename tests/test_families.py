"""A problem family is one module plus a params subsection (docs/families.md).

The registry (`brorl.families`) finds the built-in families by name and a family outside brorl by
the module its subsection names; everything family-specific (data, prompts, verification,
scoring, the comparison's Table 1) reads it. The proof: a toy family written into a temporary
package, never named by any file of the project, runs through data, a training step,
evaluation and the comparison table.
"""

from __future__ import annotations

import json
import textwrap
import warnings
from pathlib import Path

import pytest

from brorl.families import BUILTIN, ProblemFamily, family, load, ordered, verify_batch
from brorl.params import DataParams, ParamsError, load_params

ROOT = Path(__file__).resolve().parents[1]

TOY = textwrap.dedent('''
    """A toy family: say whether a number is even or odd."""

    import random
    from collections.abc import Sequence

    from pydantic import NonNegativeInt

    from brorl.data.records import make_problem
    from brorl.families import FamilyParams, ProblemFamily
    from brorl.verifiers import Verdict


    class ParityParams(FamilyParams):
        per_task: NonNegativeInt = 40
        """Numbers drawn."""

        def size(self) -> int:
            return self.per_task


    def build(section, seed):
        rng = random.Random(f"parity/{seed}")
        numbers = [rng.randint(0, 99) for _ in range(section.per_task)]
        return [make_problem("parity", "even_odd", f"Is {n} even or odd?",
                             answer="even" if n % 2 == 0 else "odd") for n in numbers]


    def extract(text):
        words = text.strip().split()
        return words[-1].strip(".").lower() if words else None


    class ParityVerifier:
        def __init__(self, config):
            self.config = config

        def verify(self, problems, responses):
            return [Verdict(1.0, "correct") if extract(r) == p.answer else Verdict(0.0, "wrong")
                    for p, r in zip(problems, responses)]


    FAMILY = ProblemFamily(
        name="parity", title="Parity", params=ParityParams, build=build,
        instruction="Answer with one word.", example=("Is 100 even or odd?", "even"),
        extract=extract, target=lambda p: p.answer, verifier=ParityVerifier,
        headline="pass_at_1")
''')
ONLY_TOY = ["data.families.math=null", "data.families.code=null", "data.families.reasoning=null",
            "data.families.instruction=null",
            "data.families.parity={module: toyfam.parity, per_task: 60}"]


@pytest.fixture()
def toy_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The toy family's module `toyfam.parity`, importable for this test only."""
    package = tmp_path / "pkgs" / "toyfam"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "parity.py").write_text(TOY)
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    monkeypatch.delitem(__import__("brorl.families").families._REGISTRY, "parity", raising=False)
    return "toyfam.parity"


def test_every_built_in_family_is_found_by_name_and_complete():
    for name in BUILTIN:
        fam = family(name)
        assert isinstance(fam, ProblemFamily) and fam.name == name
        assert fam.instruction and all(fam.example) and fam.headline in ("pass_at_1",
                                                                          "reward_mean")
        assert fam.params().size() >= 0
    assert ordered({"zeta", "reasoning", "math", "alpha"}) == ["math", "reasoning", "alpha",
                                                                "zeta"]


def test_a_family_outside_brorl_needs_its_module_named_and_a_family_record_in_it(
        toy_package, tmp_path):
    with pytest.raises(ValueError, match="name the module that defines it in "
                                         "data.families.parity.module"):
        DataParams(families={"parity": {}})
    (tmp_path / "pkgs" / "toyfam" / "empty.py").write_text("")
    with pytest.raises(ValueError, match="defines no FAMILY named 'other'"):
        load("other", "toyfam.empty")
    section = DataParams(families={"parity": {"module": toy_package, "per_task": 3}})
    assert section.families["parity"].size() == 3


def test_a_bad_family_subsection_is_one_line_naming_the_key(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("data:\n  families:\n    math: {per_tsk: 3}\n")
    with pytest.raises(ParamsError, match=r"data.families: math.per_tsk: Extra inputs"):
        load_params(path)


def test_the_old_flat_data_keys_still_load_with_a_note_naming_the_new_ones():
    with pytest.warns(FutureWarning, match="data.families.math.per_task"):
        data = DataParams(math_per_task=5, code_jsonl=["a.jsonl"], reasoning_per_task=0)
    assert data.families["math"].per_task == 5 and data.families["code"].jsonl == ["a.jsonl"]
    assert data.families["reasoning"].per_task == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert DataParams(families={"math": {"per_task": 5}}) == DataParams.model_validate(
            {"families": {"math": {"per_task": 5}}})


def test_a_toy_family_runs_through_data_a_training_step_evaluation_and_the_comparison(
        toy_package, tmp_path):
    from brorl.data import DataConfig, make_splits, save_splits
    from brorl.evaluation.compare import ArmResult, table1
    from brorl.policy import build_policy, build_tokenizer, save_policy
    from brorl.train.run import Direct, Run

    out = tmp_path / "run"
    params = load_params(ROOT / "params" / "prorl_ci.yaml", [
        *ONLY_TOY, f"data.path={tmp_path / 'data'}", f"train.init_checkpoint={tmp_path / 'policy'}",
        f"train.run_dir={out}", f"train.checkpoint_dir={out / 'ck'}", "train.max_rollouts=64",
        "train.eval_per_family=4", "verify.workers=1", "generate.max_response_tokens=8",
        f"tracking.metrics_dir={tmp_path / 'metrics'}", f"tracking.plots_dir={tmp_path / 'plots'}"])
    splits = make_splits(DataConfig.from_params(params.data))
    assert {p.family for s in splits.values() for p in s} == {"parity"}
    save_splits(splits, params.data.path)
    tokenizer = build_tokenizer()
    save_policy(build_policy(vocab_size=len(tokenizer), hidden_size=32, num_layers=1, num_heads=2,
                             num_kv_heads=1, intermediate_size=64, max_position_embeddings=128),
                tokenizer, tmp_path / "policy")

    summary = Run.open(params, ROOT, resume=False).train(Direct())
    assert summary["steps"] == 1 and summary["rollouts"] == 64  # one step of 4 prompts x 16
    assert summary["history"][0]["verify/reward_mean"] >= 0
    rows = [json.loads(x) for x in (out / "evals.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    assert all(set(r["scores"]["family"]) == {"parity"} for r in rows)
    assert all(set(r["families"]) == {"parity"} and len(r["problem_ids"]) == 4 for r in rows)
    table = table1([ArmResult.load("prorl", out)], timings=False)
    assert "| Parity pass@1 |" in table and len(table.splitlines()) == 4  # header, rule, 2 rows


def test_verify_batch_judges_each_problem_by_its_own_familys_verifier(toy_package):
    from brorl.data import DataConfig, build_problems

    config = DataConfig.from_params(DataParams(families={
        "parity": {"module": toy_package, "per_task": 2}, "math": {"per_task": 1}}))
    problems = build_problems(config)
    assert [p.family for p in problems] == ["parity", "parity"] + ["math"] * 4
    responses = [f"It is {p.answer}." if p.family == "parity" else f"<answer>{p.answer}</answer>"
                 for p in problems]
    assert [v.reward for v in verify_batch(problems, responses)] == [1.0] * 6
    assert [v.reward for v in verify_batch(problems, ["no"] * 6)] == [0.0] * 6
