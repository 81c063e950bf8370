"""Reading answers out of responses: the markers the built-in families share.

- `last_tag`: the last `<answer>...</answer>` (math, reasoning);
- `last_boxed`: the content of the last `\\boxed{...}`, braces balanced (math, and MATH's
  reference solutions);
- `last_fence`: the last fenced block ```` ```python ... ``` ```` (```` ```py ```` or a bare
  fence also count; code);
- `tagged_target`: the ideal response in an answer tag (math, reasoning).

Each returns None when the marker is absent or unclosed (a truncated response has no answer).
Deliberately ignored: `<think>` handling (the tiny policies do not think), `\\fbox`, answers
written without any marker. Paper: ProRL (arXiv 2505.24864) App. E, Table 4 (math `\\boxed{}`,
Reasoning Gym `<answer></answer>`, code in triple backticks).
"""

from __future__ import annotations

import re

from brorl.types import Problem

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)
_BOXED = "\\boxed"


def last_tag(text: str) -> str | None:
    """The content of the last `<answer>...</answer>` in `text`; None if there is none."""
    tags = _ANSWER_TAG.findall(text)
    return tags[-1] if tags else None


def last_fence(text: str) -> str | None:
    """The content of the last closed ```` ```python ```` fence in `text`; None if none."""
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else None


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` in `text`, braces balanced; None if none is closed."""
    start = text.rfind(_BOXED + "{")
    while start != -1:
        content = _balanced(text, start + len(_BOXED))
        if content is not None:
            return content
        start = text.rfind(_BOXED + "{", 0, start)
    return None


def tagged_target(problem: Problem) -> str:
    """`<answer>{reference}</answer>`: the ideal response of a family whose answers are tagged
    (math, reasoning); a ValueError when the problem has no reference answer."""
    if not problem.answer:
        raise ValueError(f"{problem.family} problem {problem.id!r} has an empty answer: the "
                         "warm-up needs the reference answer in problem.answer")
    return f"<answer>{problem.answer}</answer>"


def stripped(found: str | None) -> str | None:
    """`found` stripped, None when absent or blank."""
    return found.strip() if found is not None and found.strip() else None


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
