"""Render problems into prompts, render ideal responses, and extract final answers.

One place that turns a problem into the text a policy sees and reads its answer back, so that
reward (training) and evaluation read answers the same way (nanochat's `reward()` reuses
`evaluate()`). What differs by family (the instruction, the worked example, the answer's marker,
the ideal response) is the family's (`brorl.families`); this module names none.

Deliberately ignored: `<think>` handling (the tiny policies do not think). Our choice of prompt
format; the BroRL paper does not state its prompts.
"""

from __future__ import annotations

from typing import Any

from brorl.families import family
from brorl.types import Problem

PLAIN_TEMPLATE = "Q: {prompt}\nA: "
"""The plain template for tokenizers without a chat template (or none at all). It leaves the
family's instruction out: every prompt character costs the tiny character-level policy, and the
supervised warm-up on `render_target` teaches the format."""


def render_prompt(problem: Problem, tokenizer: Any = None) -> str:
    """The prompt text for `problem`; deterministic.

    With a tokenizer that has a `chat_template`, `chat_messages` (the problem text plus its
    family's instruction, after the family's worked example if the problem asks for one) through
    the checkpoint's own `apply_chat_template(add_generation_prompt=True)`; otherwise
    `PLAIN_TEMPLATE` around the bare problem text.
    """
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return PLAIN_TEMPLATE.format(prompt=problem.prompt)
    return tokenizer.apply_chat_template(chat_messages(problem), tokenize=False,
                                         add_generation_prompt=True)


def chat_messages(problem: Problem) -> list[dict[str, str]]:
    """The chat turns of `problem`: the user's problem with the family's instruction, after the
    family's worked example (`ProblemFamily.example`) when the problem carries `chat_example`
    (the data stage's `data.chat_example`: a small instruct model follows a format it is shown
    far more often than one it is told; SmolLM2-135M-Instruct never wrote an answer tag when
    only told to)."""
    fam = family(problem.family)
    messages = []
    if problem.metadata.get("chat_example"):
        question, answer = fam.example
        messages += [{"role": "user", "content": f"{question}\n{fam.instruction}"},
                     {"role": "assistant", "content": answer}]
    return messages + [{"role": "user", "content": f"{problem.prompt}\n{fam.instruction}"}]


def render_target(problem: Problem) -> str:
    """The ideal response for supervised warm-up, in exactly the format `extract_answer` reads
    (`ProblemFamily.target`)."""
    return family(problem.family).target(problem)


def extract_answer(text: str, name: str) -> str | None:
    """The final answer in `text` for family `name` (`ProblemFamily.extract`), or None when
    absent or empty."""
    return family(name).extract(text)
