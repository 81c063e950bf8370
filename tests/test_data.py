"""Problem data: sources, JSONL loading, deterministic disjoint splits, datasets round-trip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from brorl.data import (
    DataConfig,
    build_problems,
    dedupe,
    load_split,
    make_problem,
    make_splits,
    normalise_prompt,
    save_splits,
    split_counts,
    split_problems,
)
from brorl.families.code import generate_code, load_code_jsonl
from brorl.families.math import generate_math, load_math_jsonl
from brorl.families.reasoning import reasoning_problems
from brorl.params import DataParams, load_params

ROOT = Path(__file__).resolve().parents[1]


def _write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_math_jsonl_reads_answer_or_last_boxed_of_solution(tmp_path):
    path = _write_jsonl(tmp_path / "deepscaler.jsonl", [
        {"problem": "What is 1/2 + 1/4?", "answer": "\\frac{3}{4}"},
        {"problem": "Find x if 2x = 6.", "solution": "So \\boxed{2} no, \\boxed{3}.",
         "type": "Algebra", "level": "Level 1"},
    ])
    first, second = load_math_jsonl(path)
    assert (first.family, first.task, first.answer) == ("math", "deepscaler", "\\frac{3}{4}")
    assert (second.task, second.answer) == ("Algebra", "3")  # the last box wins
    assert second.metadata == {"type": "Algebra", "level": "Level 1"}


def test_math_jsonl_without_answer_names_the_line(tmp_path):
    path = _write_jsonl(tmp_path / "bad.jsonl", [{"problem": "1+1?", "solution": "two"}])
    with pytest.raises(ValueError, match=r"bad.jsonl:1: no `answer`"):
        load_math_jsonl(path)


def test_code_jsonl_reads_tests_and_apps_input_output(tmp_path):
    path = _write_jsonl(tmp_path / "apps.jsonl", [
        {"statement": "Return the sum of a and b.", "signature": "def add(a, b):",
         "tests": ["assert add(1, 2) == 3"], "solution": "def add(a, b):\n    return a + b"},
        {"question": "Double x.", "solutions": json.dumps(["def dbl(x):\n    return 2 * x"]),
         "input_output": json.dumps({"fn_name": "dbl", "inputs": [[1], [5]], "outputs": [2, 10]})},
    ])
    first, second = load_code_jsonl(path)
    assert first.prompt == "Return the sum of a and b.\nSignature: def add(a, b):"
    assert first.tests == ("assert add(1, 2) == 3",)
    assert second.tests == ("assert dbl(*[1]) == 2", "assert dbl(*[5]) == 10")
    for p in (first, second):  # the reference passes its own tests
        exec(p.metadata["solution"] + "\n" + "\n".join(p.tests), {})


def test_code_jsonl_refuses_stdin_programs(tmp_path):
    path = _write_jsonl(tmp_path / "io.jsonl", [
        {"question": "Read n, print n.", "input_output": {"inputs": ["1\n"], "outputs": ["1\n"]}}])
    with pytest.raises(ValueError, match="stdin/stdout"):
        load_code_jsonl(path)


def test_generated_code_references_pass_their_tests():
    problems = generate_code(3, seed=1)
    assert len(problems) == 3 * 7
    for p in problems:
        assert len(p.tests) == 3
        exec(p.metadata["solution"] + "\n" + "\n".join(p.tests), {})


def test_generated_math_answers_are_right():
    for p in generate_math(20, seed=2):
        words = p.prompt.rstrip(".").split()
        if p.task == "compare":  # "Which is larger, a or b?"
            a, b = int(words[3].rstrip(",")), int(words[5].rstrip("?"))
            assert p.answer == str(max(a, b)) and a != b
        elif p.task == "arithmetic":  # "Compute a op b."
            assert str(eval(" ".join(words[1:]))) == p.answer
        elif p.task == "fractions":  # "Reduce 6/8 to lowest terms." -> 3/4, coprime
            num, den = map(int, words[1].split("/"))
            a, b = map(int, p.answer.split("/"))
            assert num * b == den * a and all(a % d or b % d for d in range(2, b + 1))
        else:  # "Solve for x: 3x + 2 = 11." -> 3
            a, b, c = int(words[3][:-1]), int(words[5]), int(words[7])
            sign = 1 if words[4] == "+" else -1
            assert a * int(p.answer) + sign * b == c


def test_reasoning_gym_items_keep_the_scorer_metadata():
    problems = reasoning_problems("chain_sum", size=5, seed=0,
                                  config={"min_terms": 2, "max_terms": 2, "max_digits": 1})
    assert len(problems) == 5 and problems[0].metadata["source_dataset"] == "chain_sum"
    assert all(p.family == "reasoning" and p.answer for p in problems)
    with pytest.raises(ValueError, match="not_a_task"):
        reasoning_problems("not_a_task", size=1, seed=0)


def _config(**families) -> DataConfig:
    """The schema's data settings with only the named families' subsections."""
    return DataConfig.from_params(DataParams(families=families))


def _mixed():
    return build_problems(_config(math={"per_task": 40}, code={"per_task": 10},
                                  reasoning={"per_task": 40}))


def test_splits_are_deterministic_disjoint_and_cover_every_task():
    problems = _mixed()
    a = split_problems(problems, seed=3)
    b = split_problems(list(reversed(problems)), seed=3)  # input order does not matter
    assert {k: [p.id for p in v] for k, v in a.items()} == {k: [p.id for p in v] for k, v in b.items()}
    keys = {name: {normalise_prompt(p.prompt) for p in ps} for name, ps in a.items()}
    assert not keys["train"] & keys["validation"] and not keys["train"] & keys["test"]
    assert not keys["validation"] & keys["test"]
    assert sum(len(v) for v in a.values()) == len(dedupe(problems))
    tasks = {(p.family, p.task) for p in problems}
    for name in ("train", "validation", "test"):
        assert {(p.family, p.task) for p in a[name]} == tasks
    c = split_problems(problems, seed=4)
    assert [p.id for p in c["test"]] != [p.id for p in a["test"]]


def test_split_dedupes_case_and_whitespace_variants():
    p1 = make_problem("math", "t", "Compute 1 + 1.", answer="2")
    p2 = make_problem("math", "t", "  compute 1  +\n1. ", answer="2")
    assert p1.id == p2.id and len(dedupe([p1, p2])) == 1


def test_split_sizes_follow_fractions():
    problems = [make_problem("math", "t", f"Compute {i} + 0.", answer=str(i)) for i in range(100)]
    s = split_problems(problems, seed=0, validation_fraction=0.1, test_fraction=0.2)
    assert [len(s[k]) for k in ("train", "validation", "test")] == [70, 10, 20]
    with pytest.raises(ValueError, match="sum below 1"):
        split_problems(problems, seed=0, validation_fraction=0.5, test_fraction=0.5)


def test_splits_round_trip_through_datasets_folder(tmp_path):
    splits = split_problems(_mixed(), seed=0)
    save_splits(splits, tmp_path / "problems")
    for name, problems in splits.items():
        assert load_split(tmp_path / "problems", name) == problems  # dataclass equality
    with pytest.raises(KeyError, match="no split 'dev'"):
        load_split(tmp_path / "problems", "dev")


def test_code_max_constant_bounds_the_generated_constants():
    # 400 draws per template from k in 1..2 and 4 names: every one of 7 x 2 x 4 = 56 prompts
    problems = build_problems(_config(code={"per_task": 400, "max_constant": 2}))
    assert len(dedupe(problems)) == 56
    assert len(dedupe(build_problems(_config(code={"per_task": 400})))) == 7 * 9 * 4  # k <= 9


def test_the_tiny_params_hold_100_test_instances_per_family():
    # The study's held-out set: >= 300 test instances, >= 100 per family (data only, no training)
    params = load_params(ROOT / "params" / "tiny.yaml")
    counts = split_counts(make_splits(DataConfig.from_params(params.data)))
    assert all(counts[f"test/{f}"] >= 100 for f in ("math", "code", "reasoning")), counts
    assert counts["test/total"] >= 300


def test_code_jsonl_refuses_tests_the_judge_cannot_check_outside_the_sandbox(tmp_path):
    path = _write_jsonl(tmp_path / "odd.jsonl", [
        {"statement": "Return 1.", "tests": ["assert f() == 1"]},
        {"statement": "Return 1.", "tests": ["assert f() == 1", "x = f()\nassert x == 1"]},
    ])
    with pytest.raises(ValueError, match=r"odd.jsonl:2: code test 'x = f\(\)\\nassert x == 1' "
                                         r"has a form the judge cannot check.*write it as"):
        load_code_jsonl(path)
