"""Render problems into prompts, render ideal responses, and extract final answers.

One place for the response format, so that reward (training) and evaluation read answers the
same way (nanochat's `reward()` reuses `evaluate()`):

- math and reasoning: the last `<answer>...</answer>`; for math also the last `\\boxed{...}`
  (balanced braces) when no answer tag is present;
- code: the last fenced block ```` ```python ... ``` ```` (```` ```py ```` or a bare fence
  also count).

Deliberately ignored: `<think>` handling (the tiny policies do not think), `\\fbox`, unclosed
fences or tags (a truncated response has no answer), answers written without any marker.
Paper: ProRL (arXiv 2505.24864) App. E, Table 4 (math `\\boxed{}`, Reasoning Gym
`<answer></answer>`, code in triple backticks).
"""

from __future__ import annotations

import re
from typing import Any

from brorl.types import Family, Problem

ANSWER_FORMAT: dict[Family, str] = {
    "math": "Answer in <answer></answer>.",
    "reasoning": "Answer in <answer></answer>.",
    "code": "Answer in a ```python block.",
}
"""Instruction appended to the prompt under a chat template, kept short. The plain template
(the tiny character-level policy, whose tokenizer has no chat template) leaves it out: every prompt character
costs, and the supervised warm-up on `render_target` teaches the format."""

PLAIN_TEMPLATE = "Q: {prompt}\nA: "
"""The plain template for tokenizers without a chat template (or none at all)."""

CHAT_EXAMPLES: dict[Family, tuple[str, str]] = {
    "math": ("Compute 12 + 30.", "12 + 30 = 42.\n<answer>42</answer>"),
    "reasoning": ("Spell this word backward (example: sun -> nus): stone",
                  "stone backward is enots.\n<answer>enots</answer>"),
    "code": ("Write a Python function double_all(xs) that returns a list with every item of xs "
             "doubled.", "```python\ndef double_all(xs):\n    return [2 * x for x in xs]\n```"),
}
"""One worked example per family, shown before the problem as a user turn and the assistant's reply
when a problem carries `metadata["chat_example"]` (the data stage's `data.chat_example`): a small
instruct model follows a format it is shown far more often than one it is told
(SmolLM2-135M-Instruct never wrote an answer tag when only told to). Each lies outside the generated
sets (operands up to 9, three-letter words, other code templates), so it gives no held-out answer
away. Our choice; the BroRL paper does not state its prompts."""

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)
_BOXED = "\\boxed"


def render_prompt(problem: Problem, tokenizer: Any = None) -> str:
    """The prompt text for `problem`; deterministic.

    With a tokenizer that has a `chat_template`, `chat_messages` (the problem text plus
    `ANSWER_FORMAT[family]`, after a worked example if the problem asks for one) through the
    checkpoint's own `apply_chat_template(add_generation_prompt=True)`; otherwise
    `PLAIN_TEMPLATE` around the bare problem text.
    """
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return PLAIN_TEMPLATE.format(prompt=problem.prompt)
    return tokenizer.apply_chat_template(chat_messages(problem), tokenize=False,
                                         add_generation_prompt=True)


def chat_messages(problem: Problem) -> list[dict[str, str]]:
    """The chat turns of `problem`: the user's problem with the family's answer format, after
    the family's worked example (`CHAT_EXAMPLES`) when the problem carries `chat_example`."""
    instruction = ANSWER_FORMAT[problem.family]
    messages = []
    if problem.metadata.get("chat_example"):
        question, answer = CHAT_EXAMPLES[problem.family]
        messages += [{"role": "user", "content": f"{question}\n{instruction}"},
                     {"role": "assistant", "content": answer}]
    return messages + [{"role": "user", "content": f"{problem.prompt}\n{instruction}"}]


def render_target(problem: Problem) -> str:
    """The ideal response for supervised warm-up, in exactly the format `extract_answer` reads.

    Math and reasoning: `<answer>{problem.answer}</answer>`. Code: the reference solution from
    `problem.metadata["solution"]` in a ```` ```python ```` fence.
    """
    if problem.family == "code":
        solution = problem.metadata.get("solution")
        if not solution:
            raise ValueError(
                f"code problem {problem.id!r} has no metadata['solution']: render_target needs "
                "a reference solution; add one to the record or skip it in warm-up"
            )
        return f"```python\n{solution.strip()}\n```"
    if not problem.answer:
        raise ValueError(
            f"{problem.family} problem {problem.id!r} has an empty answer: render_target needs "
            "the reference answer in problem.answer"
        )
    return f"<answer>{problem.answer}</answer>"


def extract_answer(text: str, family: Family) -> str | None:
    """The final answer in `text` for `family` (stripped), or None when absent or empty."""
    if family == "code":
        blocks = _FENCE.findall(text)
        found = blocks[-1] if blocks else None
    else:
        tags = _ANSWER_TAG.findall(text)
        found = tags[-1] if tags else None
        if found is None and family == "math":
            found = last_boxed(text)
    if found is None or not found.strip():
        return None
    return found.strip() if family != "code" else found.strip("\n")


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` in `text`, braces balanced; None if none is closed."""
    start = text.rfind(_BOXED + "{")
    while start != -1:
        content = _balanced(text, start + len(_BOXED))
        if content is not None:
            return content
        start = text.rfind(_BOXED + "{", 0, start)
    return None


def _balanced(text: str, open_at: int) -> str | None:
    """Content between the `{` at `open_at` and its matching `}`; None if unclosed."""
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : i]
    return None
