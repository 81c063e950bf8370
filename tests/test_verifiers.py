"""Verifier truth tables per family, batch order, and failure handling (issue 3, item 3).

Every check goes through `verify_batch`, the entry point reward and evaluation share.
"""

from __future__ import annotations

import json
import os
import random
import re
import sys
import time
from functools import partial
from pathlib import Path

import pytest
import reasoning_gym

from brorl.families import verify_batch
from brorl.types import Problem
from brorl.verifiers import Verdict, VerifyConfig
from brorl.verifiers.workers import judge_answers, map_with_deadline
from tests.process_tree import stat_fields


def math_problem(answer: str) -> Problem:
    return Problem(f"m-{answer}", "math", "generated", "?", answer=answer)


@pytest.mark.parametrize(
    ("reference", "response", "expected"),
    [
        ("0.75", "<answer>0.75</answer>", (1.0, "correct")),
        ("0.75", "<answer>\\frac{3}{4}</answer>", (1.0, "correct")),  # equivalent form
        ("\\frac{3}{4}", "so \\boxed{0.75}", (1.0, "correct")),
        ("3/4", "<answer>\\frac34</answer>", (1.0, "correct")),
        ("-4", "<answer>-4.0</answer>", (1.0, "correct")),
        ("42", "<answer>41</answer>", (0.0, "wrong")),
        ("42", "<answer>forty-two</answer>", (0.0, "wrong")),
        ("42", "<answer>}{</answer>", (0.0, "wrong")),  # malformed: nothing parses
        ("42", "the answer is 42", (0.0, "no_answer")),  # no tag, no box
        ("42", "", (0.0, "no_answer")),
        ("42", "\\boxed{42", (0.0, "no_answer")),  # unclosed box
    ],
)
def test_math_truth_table(reference, response, expected):
    [verdict] = verify_batch([math_problem(reference)], [response], VerifyConfig(workers=1))
    assert (verdict.reward, verdict.reason) == expected


def gym_problems(name: str, size: int) -> list[Problem]:
    data = reasoning_gym.create_dataset(name, size=size, seed=7)
    return [
        Problem(f"{name}-{i}", "reasoning", name, e["question"], answer=e["answer"],
                metadata=e["metadata"])
        for i, e in enumerate(data)
    ]


@pytest.mark.parametrize("name", ["chain_sum", "spell_backward", "leg_counting"])
def test_reasoning_right_answers_score_one_and_missing_tags_zero(name):
    problems = gym_problems(name, 4)
    right = [f"<answer>{p.answer}</answer>" for p in problems]
    bare = [p.answer for p in problems]  # the answer without its tag
    verdicts = verify_batch(problems * 2, right + bare, VerifyConfig(workers=2))
    assert [v.reward for v in verdicts] == [1.0] * 4 + [0.0] * 4
    assert {v.reason for v in verdicts[4:]} == {"no_answer"}


@pytest.mark.parametrize("name", ["count_bits", "basic_arithmetic", "spell_backward"])
def test_reasoning_scorer_works_on_json_round_tripped_metadata(name):
    # stored data turns tuples into lists: the rebuilt scorer must still accept the entry
    problems = [
        Problem(p.id, p.family, p.task, p.prompt, p.answer,
                metadata=json.loads(json.dumps(p.metadata)))
        for p in gym_problems(name, 3)
    ]
    verdicts = verify_batch(problems, [f"<answer>{p.answer}</answer>" for p in problems],
                            VerifyConfig(workers=1))
    assert [v.reward for v in verdicts] == [1.0, 1.0, 1.0]


def test_reasoning_scores_the_extracted_answer_not_the_whole_response():
    [problem] = gym_problems("chain_sum", 1)
    wrong = str(int(problem.answer) + 1)
    # the reference appears in the text, but the tagged answer is wrong
    response = f"maybe {problem.answer}? no: <answer>{wrong}</answer>"
    [verdict] = verify_batch([problem], [response], VerifyConfig(workers=1))
    score = reasoning_gym.get_score_answer_fn("chain_sum")
    entry = {"question": problem.prompt, "answer": problem.answer, "metadata": problem.metadata}
    # the scorer's value for the tagged answer alone; on the whole text it would give credit
    assert verdict.reward == score(wrong, entry) < score(response, entry)


def test_reasoning_keeps_the_scorers_continuous_partial_credit():
    [problem] = gym_problems("chain_sum", 1)
    # chain_sum's scorer gives len(answer)/len(response) when the answer is a substring
    response = f"<answer>x{problem.answer}</answer>"
    [verdict] = verify_batch([problem], [response], VerifyConfig(workers=1))
    expected = len(problem.answer) / (len(problem.answer) + 1)
    assert verdict == Verdict(pytest.approx(expected), "partial")


def test_reasoning_scorers_are_built_once_per_task(monkeypatch):
    """Two verify calls over two tasks build each task's scorer once, with the same verdicts."""
    import reasoning_gym

    from brorl.families import reasoning

    built, real = [], reasoning_gym.get_score_answer_fn

    def counting(name):
        built.append(name)
        return real(name)

    monkeypatch.setattr(reasoning_gym, "get_score_answer_fn", counting)
    getattr(reasoning._scorer, "cache_clear", lambda: None)()  # a fresh cache either side
    problems = gym_problems("chain_sum", 2) + gym_problems("spell_backward", 2)
    answers = [f"<answer>{p.answer}</answer>" for p in problems]
    first = verify_batch(problems, answers, VerifyConfig(workers=1))
    second = verify_batch(problems, answers, VerifyConfig(workers=1))
    assert sorted(built) == ["chain_sum", "spell_backward"]
    assert first == second and all(v.reward == 1.0 for v in first)
    getattr(reasoning._scorer, "cache_clear", lambda: None)()  # a fresh cache either side


def test_unknown_reasoning_task_gives_zero_with_an_error_reason():
    problem = Problem("x", "reasoning", "no_such_task", "?", answer="1")
    [verdict] = verify_batch([problem], ["<answer>1</answer>"], VerifyConfig(workers=1))
    assert verdict.reward == 0.0 and verdict.reason.startswith("error:")


def code_problem() -> Problem:
    tests = tuple(f"assert f({x}) == {x * x}" for x in (0, 1, 2, 3))
    return Problem("sq", "code", "square", "Write f(x) = x * x.", tests=tests)


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("```python\ndef f(x):\n    return x * x\n```", (1.0, "correct")),
        ("```python\ndef f(x):\n    return x + x\n```", (0.5, "partial")),  # 0 and 2 pass: 2/4
        ("```python\ndef f(x):\n    return 2 ** x\n```", (0.25, "partial")),  # only f(2)=4: 1/4
        ("```python\ndef f(x):\n    return -1\n```", (0.0, "wrong")),
        ("```python\ndef f(x) return x\n```", (0.0, "syntax_error")),
        ("```python\nraise ValueError('top level')\n```", (0.0, "runtime_error")),
        ("```python\nimport os\nos._exit(0)\n```", (0.0, "runtime_error")),  # early exit earns 0
        ("```python\nprint('ok ok ok')\n```", (0.0, "wrong")),  # printing earns nothing
        ("def f(x):\n    return x * x", (0.0, "no_answer")),  # no fence
        ("", (0.0, "no_answer")),
    ],
)
def test_code_truth_table(response, expected):
    [verdict] = verify_batch([code_problem()], [response], VerifyConfig(workers=1))
    assert (verdict.reward, verdict.reason) == expected


def test_mixed_batch_keeps_order_under_parallelism():
    gym = gym_problems("chain_sum", 6)
    items = [(p, f"<answer>{p.answer}</answer>", 1.0) for p in gym[:3]]
    items += [(p, "<answer>nope</answer>", 0.0) for p in gym[3:]]
    items += [(math_problem(str(n)), f"\\boxed{{{n + k}}}", float(k == 0))
              for n in range(6) for k in (0, 1)]
    square = "```python\ndef f(x):\n    return x * x\n```"
    items += [(code_problem(), square, 1.0), (code_problem(), "no code", 0.0)] * 2
    random.Random(0).shuffle(items)
    problems, responses, expected = zip(*items)
    verdicts = verify_batch(list(problems), list(responses), VerifyConfig(workers=2))
    assert [v.reward for v in verdicts] == list(expected)


def test_length_mismatch_is_a_caller_bug():
    with pytest.raises(ValueError, match="one response per problem"):
        verify_batch([math_problem("1")], [], VerifyConfig(workers=1))


def test_empty_batch():
    assert verify_batch([], []) == []


def _slow_or_dying(folder: Path, x: float) -> float:
    """Sleep `x` seconds, with a marker in `folder` when the sleep begins (holding the
    worker's pid) and one when it ends; a negative `x` kills the worker instead."""
    if x < 0:
        os._exit(3)  # the worker dies mid-share
    (folder / f"began-{x}").write_text(str(os.getpid()))
    time.sleep(x)
    (folder / f"ended-{x}").touch()
    return x


def test_deadline_workers_time_out_hung_items_and_survive_dead_workers(tmp_path):
    items = [0.0, 30.0, 0.0, -1.0, 0.0, 0.0]
    outcomes = map_with_deadline(partial(_slow_or_dying, tmp_path), items, workers=2,
                                 timeout_s=1.0)
    assert outcomes[1] == ("timeout", None)
    assert outcomes[3] == ("error", "worker process died")
    assert [outcomes[i] for i in (0, 2, 4, 5)] == [("ok", 0.0)] * 4
    # the hung item's worker was killed and reaped before its 30 s sleep ended: the call
    # returned at the item's time-out, not after the sleep
    assert not (tmp_path / "ended-30.0").exists()
    began = tmp_path / "began-30.0"  # absent only if it was killed before it began
    assert not began.exists() or stat_fields(int(began.read_text())) is None


def _judge_in_worker(item: tuple[Problem, str]) -> Verdict:
    problem, answer = item
    return Verdict(float(answer == problem.answer), f"pid {os.getpid()}")


def test_answers_are_judged_once_per_distinct_pair_and_none_without_a_worker(monkeypatch):
    import brorl.verifiers.workers as workers

    a, b = math_problem("1"), math_problem("2")
    problems = [a, a, b, a, b, a]
    answers = ["1", None, "1", "1", None, "3"]
    sent = []
    real = workers.map_with_deadline
    monkeypatch.setattr(workers, "map_with_deadline",
                        lambda check, items, **kw: sent.append(list(items)) or real(check, items, **kw))
    verdicts = judge_answers(_judge_in_worker, problems, answers, workers=1, timeout_s=5.0)
    assert sent == [[(a, "1"), (b, "1"), (a, "3")]]  # distinct (problem, answer) pairs, in order
    assert [v.reward for v in verdicts] == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    assert verdicts[1] == verdicts[4] == Verdict(0.0, "no_answer")
    assert verdicts[0] == verdicts[3] and verdicts[0].reason != f"pid {os.getpid()}"  # forked
    sent.clear()
    assert judge_answers(_judge_in_worker, [a, b], [None, None], workers=1, timeout_s=5.0) == \
        [Verdict(0.0, "no_answer")] * 2
    assert sent == []  # nothing to judge: no worker forked


def test_math_check_that_hangs_gives_timeout(monkeypatch, tmp_path):
    import brorl.families.math as math_verifier

    math_verifier._warm_up()  # the parent's own warm-up runs the real check, once per process
    ended = tmp_path / "ended"  # written by the check if its 30 s sleep ever ends
    monkeypatch.setattr(math_verifier, "math_equal",
                        lambda ref, ans: time.sleep(30) or ended.touch())
    [verdict] = verify_batch([math_problem("1")], ["<answer>1</answer>"],
                              VerifyConfig(timeout_s=0.5))
    assert verdict == Verdict(0.0, "timeout")
    assert not ended.exists()  # the verdict came at the time-out: the check was killed


def test_repeated_pairs_are_judged_once(monkeypatch):
    """N rollouts of one prompt often repeat: each distinct (problem, response) is verified once."""
    import brorl.families as verifiers

    seen: list[int] = []
    real = verifiers._verify_family

    def counting(family, indices, problems, responses, options):
        seen.extend(indices)
        return real(family, indices, problems, responses, options)

    monkeypatch.setattr(verifiers, "_verify_family", counting)
    a, b = math_problem("3"), math_problem("4")
    responses = ["\\boxed{3}", "\\boxed{3}", "\\boxed{5}", "\\boxed{3}", "\\boxed{4}"]
    verdicts = verify_batch([a, a, a, b, b], responses, VerifyConfig(workers=1))
    assert [v.reward for v in verdicts] == [1.0, 1.0, 0.0, 0.0, 1.0]
    assert sorted(seen) == [0, 2, 3, 4]


def test_math_answers_reach_sympys_eval_based_parser_only_as_number_literals(monkeypatch, tmp_path):
    """math-verify's plain-expression extraction runs sympy's `parse_expr` (an `eval`) on answer
    text: the verifier uses LaTeX extraction only, whose parser hands sympy nothing but the
    number literals its lexer matched (`sympy.Number("0.75")`). The tripwire replaces
    `parse_expr` under every name a loaded module holds it by (sympy's, latex2sympy2's copy,
    math-verify's, and math-verify's cached wrapper) and lets only such a literal through."""
    import latex2sympy2_extended.latex2sympy2  # noqa: F401 - holds a copy of parse_expr
    import math_verify.parser
    import sympy.parsing.sympy_parser as sympy_parser

    marker = tmp_path / "parse_expr_called"
    number = re.compile(r"[0-9]+(\.[0-9]*)?|\.[0-9]+")

    def tripwire(original):
        def checked(expr, *args, **kwargs):  # the forked workers inherit it
            if type(expr) is str and number.fullmatch(expr):
                return original(expr, *args, **kwargs)
            marker.write_text(str(expr))  # a call on anything else leaves the marker
            raise AssertionError("parse_expr called on answer text")
        return checked

    watched = (sympy_parser.parse_expr, math_verify.parser.parse_expr_cached)
    patched = set()
    for module_name, module in list(sys.modules.items()):
        for name, value in list(getattr(module, "__dict__", {}).items()):
            if any(value is fn for fn in watched):
                monkeypatch.setattr(module, name, tripwire(value))
                patched.add(f"{module_name}.{name}")
    assert {"sympy.parsing.sympy_parser.parse_expr", "sympy.parse_expr",
            "latex2sympy2_extended.latex2sympy2.parse_expr", "math_verify.parser.parse_expr",
            "math_verify.parser.parse_expr_cached"} <= patched
    # the last one closes the verifier's \\boxed{} around it: math-verify's default would hand
    # its middle to parse_expr
    answers = ["3/4", "0.75", "x**2 + 1", "__import__('os').getcwd()", "2^10", "-4.0",
               "} 1+1 \\boxed{"]
    verdicts = verify_batch([math_problem("0.75")] * len(answers),
                            [f"<answer>{a}</answer>" for a in answers], VerifyConfig(workers=1))
    assert [v.reward for v in verdicts] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert not marker.exists()


def test_reasoning_tasks_whose_scorer_evaluates_text_are_refused():
    from brorl.families.reasoning import (
        DEFAULT_REASONING_TASKS,
        evaluating_call,
        reasoning_problems,
    )

    assert evaluating_call("countdown") == "CountdownDataset.score_answer calls parse_expr"
    assert evaluating_call("bitwise_arithmetic").endswith("verify_solution calls eval")  # a helper
    assert [evaluating_call(t) for t in DEFAULT_REASONING_TASKS] == [None] * 3
    with pytest.raises(ValueError, match="'countdown' is refused: its scorer evaluates"):
        reasoning_problems("countdown", size=1, seed=0)
    problem = Problem("c", "reasoning", "countdown", "?", answer="1+2",
                      metadata={"source_dataset": "countdown"})
    [verdict] = verify_batch([problem], ["<answer>__import__('os')</answer>"],
                             VerifyConfig(workers=1))
    assert verdict.reward == 0.0 and "refused" in verdict.reason
