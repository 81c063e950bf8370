"""Prompt rendering, ideal targets, and answer extraction (issue 3, item 2)."""

from __future__ import annotations

import pytest

from brorl.families import family
from brorl.families.answers import last_boxed
from brorl.families.prompts import extract_answer, render_prompt, render_target
from brorl.types import Problem

MATH = Problem("m1", "math", "fractions", "What is 3/4 as a decimal?", answer="0.75")
REASONING = Problem("r1", "reasoning", "chain_sum", "2 + 3 =", answer="5")
CODE = Problem(
    "c1", "code", "add_one", "Write f(x) returning x + 1.", tests=("assert f(1) == 2",),
    metadata={"solution": "def f(x):\n    return x + 1"},
)


class ChatTokenizer:
    """A stand-in with the two members render_prompt uses: a template and its renderer."""

    chat_template = "{role}: {content}"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        assert tokenize is False and add_generation_prompt is True
        turns = "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages)
        return turns + "<|assistant|>"


def test_plain_prompt_is_the_short_template_without_instructions():
    assert render_prompt(REASONING) == "Q: 2 + 3 =\nA: "
    assert render_prompt(REASONING, tokenizer=object()) == "Q: 2 + 3 =\nA: "


def test_chat_prompt_appends_the_family_answer_format_and_is_deterministic():
    text = render_prompt(MATH, ChatTokenizer())
    assert text == f"<|user|>What is 3/4 as a decimal?\n{family('math').instruction}\n<|assistant|>"
    assert render_prompt(MATH, ChatTokenizer()) == text


@pytest.mark.parametrize("problem", [MATH, REASONING, CODE])
def test_target_round_trips_through_extraction(problem):
    target = render_target(problem)
    expected = problem.metadata["solution"] if problem.family == "code" else problem.answer
    assert extract_answer(target, problem.family) == expected


def test_target_of_code_without_solution_names_the_fix():
    bare = Problem("c2", "code", "t", "p", tests=("assert True",))
    with pytest.raises(ValueError, match="metadata\\['solution'\\]"):
        render_target(bare)


@pytest.mark.parametrize(
    ("text", "family", "expected"),
    [
        ("<answer>4</answer> then <answer> 5 </answer>", "reasoning", "5"),  # last tag, stripped
        ("<answer>\n12\n</answer>", "math", "12"),
        ("so \\boxed{\\frac{3}{4}} done", "math", "\\frac{3}{4}"),  # nested braces balanced
        ("\\boxed{1} then \\boxed{2}", "math", "2"),  # last box
        ("\\boxed{7} and \\boxed{unclosed", "math", "7"),  # an unclosed box is skipped
        ("<answer>9</answer> \\boxed{8}", "math", "9"),  # the tag wins over a box
        ("\\boxed{8}", "reasoning", None),  # boxes count for math only
        ("the answer is 5", "math", None),
        ("", "math", None),
        ("<answer>   </answer>", "reasoning", None),  # empty counts as absent
        ("<answer>5", "reasoning", None),  # unclosed tag
        ("```python\na = 1\n```\n```python\nb = 2\n```", "code", "b = 2"),  # last block
        ("```py\nx = 3\n```", "code", "x = 3"),
        ("```\nx = 4\n```", "code", "x = 4"),
        ("```python\ndef f():\n    return 1\n", "code", None),  # unclosed fence
        ("def f(): return 1", "code", None),
    ],
)
def test_extract_answer_truth_table(text, family, expected):
    assert extract_answer(text, family) == expected


def test_last_boxed_keeps_inner_braces():
    assert last_boxed("\\boxed{\\sqrt{2}+{1}}") == "\\sqrt{2}+{1}"
    assert last_boxed("no box") is None


def test_tiny_policy_tokenizer_gets_the_plain_prompt_unless_given_a_chat_template():
    from brorl.policy.tokenizer import CHAT_TEMPLATE, build_tokenizer

    assert render_prompt(REASONING, build_tokenizer()) == "Q: 2 + 3 =\nA: "
    text = render_prompt(REASONING, build_tokenizer(chat_template=CHAT_TEMPLATE))
    # the opt-in template writes "role: content\n" then "assistant: "
    assert text == f"user: 2 + 3 =\n{family('reasoning').instruction}\nassistant: "
