"""The instruction-following family (brorl/families/instruction.py): every constraint kind judged
right and wrong through its verifier, trivial and hostile responses scored 0 (each beside the
proof that IFEval's checker alone would reward it), every generated problem's ideal response
scored 1, deterministic builds, and the registry finding the family."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time

import pytest

from brorl.data.records import make_problem
from brorl.families import family, verify_batch
from brorl.families import instruction as ins
from brorl.verifiers.config import VerifyConfig
from brorl.verifiers.verdict import Verdict

CONFIG = VerifyConfig(workers=2, timeout_s=5.0)
REQUEST = "Write a sentence about the sea."

CASES = {
    "lowercase": ({}, "the sea is wide and deep. we often talk about it.",
                  "The sea is wide and deep. We often talk about it."),
    "uppercase": ({}, "THE SEA IS WIDE AND DEEP. WE OFTEN TALK ABOUT IT.",
                  "THE SEA IS WIDE AND DEEP. We often talk about it."),
    "no_comma": ({}, "The sea is wide and deep.", "The sea is wide, deep and blue."),
    "max_words": ({"relation": "less than", "num_words": 10}, "The sea is wide and deep.",
                  "The sea is wide and deep and it goes on and on for miles."),  # 6; 14 words
    "min_words": ({"relation": "at least", "num_words": 8},
                  "The sea is wide and deep and very blue today.", "The sea is wide."),  # 10; 4
    "end_phrase": ({"end_phrase": "That is all."}, "The sea is wide. That is all.",
                   "That is all. The sea is wide."),
    "quotation": ({}, '"The sea is wide."', "The sea is wide."),
    "include_keyword": ({"keywords": ["blue"]}, "The sea is wide and blue.",
                        "The sea is wide and deep."),
    "forbidden_word": ({"forbidden_words": ["rocket"]}, "The sea is wide.",
                       "A rocket flew over the sea."),
    "keyword_frequency": ({"keyword": "blue", "frequency": 2, "relation": "at least"},
                          "Blue sky and blue sea.", "The sea is blue."),
    "first_word": ({"num_paragraphs": 1, "nth_paragraph": 1, "first_word": "today"},
                   "Today the sea is calm.", "The sea is calm today."),
    "bullets": ({"num_bullets": 2}, "The sea:\n* it is wide\n* it is deep",
                "The sea:\n* it is wide\n* it is deep\n* it is blue"),
    "title": ({}, "<<Sea song>>\nThe sea is wide.", "Sea song\nThe sea is wide."),
    "postscript": ({"postscript_marker": "P.S."}, "The sea is wide.\nP.S. Thanks.",
                   "The sea is wide. Thanks."),
    "placeholders": ({"num_placeholders": 2}, "Meet [name] at [place] by the sea.",
                     "Meet [name] by the sea."),
    "paragraphs": ({"num_paragraphs": 2}, "The sea is wide.\n***\nIt is deep.",
                   "The sea is wide. It is deep."),
    "highlights": ({"num_highlights": 2}, "The sea is *wide* and *deep*.",
                   "The sea is *wide* and deep."),
}
"""Kind -> (checker kwargs, a response that follows it, one that does not)."""


def problem_of(kind: str, kwargs: dict, request: str = REQUEST, topic: str = "the sea"):
    """A problem of one constraint, its prompt in IFEval's words, as `build` makes them."""
    ids = [ins.KINDS[k] for k in kind.split("+")]
    kwargs_list = [kwargs] if "+" not in kind else kwargs
    texts = [ins._checker(i, kw)[1] for i, kw in zip(ids, kwargs_list)]
    return make_problem("instruction", kind, " ".join([request, *texts]), metadata={
        "instruction_id_list": ids, "kwargs": kwargs_list, "kinds": kind.split("+"),
        "topic": topic})


def rewards(problems, responses) -> list[float]:
    return [v.reward for v in ins.InstructionVerifier(CONFIG).verify(problems, responses)]


def test_the_cases_cover_every_constraint_kind():
    assert set(CASES) == set(ins.KINDS)


@pytest.mark.parametrize("kind", sorted(CASES))
def test_each_kind_rewards_the_response_that_follows_it_and_not_the_one_that_breaks_it(kind):
    kwargs, good, bad = CASES[kind]
    problem = problem_of(kind, kwargs)
    assert rewards([problem, problem], [good, bad]) == [1.0, 0.0]


def test_a_combination_needs_every_constraint():
    problem = problem_of("no_comma+end_phrase", [{}, {"end_phrase": "That is all."}])
    assert rewards([problem] * 3, ["The sea is wide. That is all.",  # both followed
                                   "The sea is wide, deep. That is all.",  # a comma
                                   "The sea is wide."]) == [1.0, 0.0, 0.0]  # no end phrase


def _ifeval_alone(problem, response: str) -> bool:
    """IFEval's own judgement, without the family's gate: the weak judge of the hacks below."""
    ins._warm_up()
    meta = problem.metadata
    return all(ins._checker(i, kw)[0].check_following(response)
               for i, kw in zip(meta["instruction_id_list"], meta["kwargs"]))


HACKS = [
    ("no_comma", {}, ""),  # empty: nothing to break
    ("forbidden_word", {"forbidden_words": ["rocket"]}, " \n\t "),
    ("max_words", {"relation": "less than", "num_words": 10}, "..."),
    ("no_comma", {}, "!!! ??? ..."),
    ("quotation", {}, '""'),
    ("quotation", {}, '"' * 50),
    ("lowercase", {}, "1 2 3 \u00b5"),  # langdetect reads no language: IFEval counts it followed
    ("lowercase", {}, "the sea"),  # only the prompt's words
    ("include_keyword", {"keywords": ["blue"]}, "ECHO"),  # the prompt itself
    ("end_phrase", {"end_phrase": "That is all."}, "That is all."),  # only the required phrase
    ("no_comma", {}, "DESCRIPTION"),  # the constraint's own text, its commas dropped
    ("include_keyword", {"keywords": ["blue"]}, "ECHO The sea is blue."),  # echo, then an answer
    ("min_words", {"relation": "at least", "num_words": 8}, "HUGE"),
    ("no_comma", {}, "xqv tolpa zrenk."),  # random letters, what an untrained policy writes
    ("max_words", {"relation": "less than", "num_words": 10}, "Bread is warm."),  # off topic
]
"""(kind, kwargs, response) that IFEval's checker alone passes; ECHO stands for the prompt,
DESCRIPTION for the constraint's text without commas, HUGE for a valid answer past the cap. The
last two never mention the request's topic (the sea)."""


def _hack_response(problem, response: str) -> str:
    description = problem.prompt.removeprefix(REQUEST).strip()
    return (response.replace("ECHO", problem.prompt)
            .replace("DESCRIPTION", description.replace(",", ""))
            .replace("HUGE", "The sea is wide and deep. " * (ins.MAX_RESPONSE_CHARS // 20)))


@pytest.mark.parametrize("kind,kwargs,response", HACKS)
def test_trivial_echoed_and_huge_responses_get_nothing_though_ifeval_alone_passes_them(
        kind, kwargs, response):
    problem = problem_of(kind, kwargs)
    response = _hack_response(problem, response)
    assert _ifeval_alone(problem, response.strip())  # the positive control: a real hack
    assert rewards([problem], [response]) == [0.0]


def test_responses_that_are_not_strings_get_an_error_verdict_not_a_raise():
    problem = problem_of("no_comma", {})
    junk = [None, 5, b"the sea is wide", ["the sea is wide"]]
    verdicts = ins.InstructionVerifier(CONFIG).verify([problem] * 5, [*junk, "The sea is wide."])
    assert [v.reward for v in verdicts] == [0.0] * 4 + [1.0]
    assert all(v.reason.startswith("error:TypeError") for v in verdicts[:4])


def test_a_checker_failure_is_an_error_verdict():
    good = problem_of("no_comma", {})
    broken = make_problem("instruction", "no_comma", "Write a line about ice. No commas.",
                          metadata={"instruction_id_list": ["no:such_checker"], "kwargs": [{}]})
    wrong_args = make_problem("instruction", "bullets", "Write a line about fog. Two bullets.",
                              metadata={"instruction_id_list": [ins.KINDS["bullets"]],
                                        "kwargs": [{"bullets": 2}]})
    verdicts = ins.InstructionVerifier(CONFIG).verify([broken, wrong_args, good],
                                                      ["Cold ice.", "Grey fog.", "Warm sand by the sea."])
    assert [v.reward for v in verdicts] == [0.0, 0.0, 1.0]
    assert verdicts[0].reason.startswith("error:") and verdicts[1].reason.startswith("error:")


def test_a_check_that_hangs_times_out(monkeypatch):
    monkeypatch.setattr(ins, "_check", lambda item: time.sleep(60))
    verdicts = ins.InstructionVerifier(VerifyConfig(workers=1, timeout_s=0.5)).verify(
        [problem_of("no_comma", {})], ["The sea is wide."])
    assert verdicts == [Verdict(0.0, "timeout")]


def test_extract_takes_the_whole_response_stripped():
    assert [ins.extract(t) for t in ["", " \n ", "  The sea.\n"]] == [None, None, "The sea."]


ALL_PAIRS = tuple(list(ins.KINDS) + [f"{a}+{b}" for a, b in itertools.combinations(ins.KINDS, 2)
                                     if not ins._conflict([a, b])])
"""Every kind alone and every pair IFEval allows together (149 tasks)."""


@pytest.mark.parametrize("params", [ins.InstructionParams(),
                                    ins.InstructionParams(per_task=4, tasks=ALL_PAIRS)],
                         ids=["default", "all_pairs"])
def test_the_ideal_response_of_every_generated_problem_scores_one(params):
    problems = ins.build(params, seed=0)
    assert len(problems) == params.size()
    targets = [ins.target(p) for p in problems]
    assert [ins.extract(t) for t in targets] == targets  # already in the form extract returns
    verdicts = verify_batch(problems, targets, CONFIG)
    assert [(p.task, t) for p, t, v in zip(problems, targets, verdicts) if v.reward != 1] == []


def test_build_is_deterministic_for_a_seed_and_differs_across_seeds():
    params = ins.InstructionParams(per_task=5)
    first, again, other = (ins.build(params, s) for s in (3, 3, 4))
    assert first == again
    assert [p.id for p in first] != [p.id for p in other]
    assert all(p.family == "instruction" and p.task in params.tasks for p in first)


def test_the_metadata_holds_ifevals_ids_and_kwargs():
    [problem] = ins.build(ins.InstructionParams(per_task=1, tasks=("no_comma+max_words",)), 0)
    meta = problem.metadata
    assert meta["instruction_id_list"] == ["punctuation:no_comma",
                                           "length_constraints:number_words"]
    assert meta["kwargs"][0] == {} and meta["kwargs"][1]["relation"] == "less than"
    assert "refrain from the use of any commas" in problem.prompt


def test_params_refuse_unknown_or_repeated_kinds_and_build_refuses_conflicts():
    with pytest.raises(ValueError, match="unknown kinds \\['shouting'\\]"):
        ins.InstructionParams(tasks=("no_comma+shouting",))
    with pytest.raises(ValueError, match="repeats a kind"):
        ins.InstructionParams(tasks=("no_comma+no_comma",))
    with pytest.raises(ValueError, match="IFEval marks as conflicting"):
        ins.build(ins.InstructionParams(per_task=1, tasks=("lowercase+uppercase",)), 0)
    with pytest.raises(ValueError, match="raise max_words"):
        ins.build(ins.InstructionParams(per_task=5, max_words=(3,), tasks=("max_words",)), 0)
    assert ins.InstructionParams(per_task=7, tasks=("title", "bullets+title")).size() == 14


def test_the_worked_example_scores_one_and_lies_outside_the_generated_sets():
    question, reply = ins.EXAMPLE
    problem = problem_of("quotation", {}, request="Write a sentence about snow.", topic="snow")
    assert problem.prompt == question
    assert rewards([problem], [reply]) == [1.0]
    prompts = {p.prompt for p in ins.build(ins.InstructionParams(per_task=50), 0)}
    assert question not in prompts and all("snow" not in p for p in prompts)


def test_the_registry_finds_the_family_and_verify_batch_judges_it():
    found = family("instruction")
    assert found is ins.FAMILY
    assert (found.name, found.title, found.headline) == ("instruction", "Instruction following",
                                                         "pass_at_1")
    problem = problem_of("no_comma", {})
    verdicts = verify_batch([problem] * 3, ["The sea is wide.", "Wide, deep.", ""], CONFIG)
    assert [v.reward for v in verdicts] == [1.0, 0.0, 0.0]
    assert verdicts[2].reason == "no_answer"


def test_the_params_section_loads_without_the_checker_library():
    """`brorl.params` validates family sections at load time: the module must stay light."""
    code = ("import sys\nfrom brorl.families.instruction import InstructionParams\n"
            "InstructionParams(per_task=3, tasks=('no_comma+title',)).size()\n"
            "print(sorted(m for m in ('if_verifiable', 'langdetect', 'nltk', 'datasets', 'torch')"
            " if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
