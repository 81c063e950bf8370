"""Instruction following with verifiable constraints: IFEval's checkers on generated requests.

A problem is a short request ("Write a short note about the sea.") followed by one or more
constraints in IFEval's own wording (`build_description` of its checker), e.g. "In your entire
response, refrain from the use of any commas."; the response is judged by IFEval's checkers
(Google's `instruction_following_eval`, as packaged by if-verifiable 0.1.2: its `ifeval`
subpackage is that code unchanged). A task is one constraint kind (`KINDS`) or several joined
by `+` ("no_comma+max_words"); IFEval's own conflict table refuses impossible combinations.
The metadata holds IFEval's `instruction_id_list` and `kwargs`, plus the `kinds` and the `topic`
the ideal response (`target`) is written from.

Reward is binary: 1 only when every constraint is followed (IFEval's prompt-level strict
accuracy, the `pass_at_1` headline), and only for a non-trivial response: not empty, at most
`MAX_RESPONSE_CHARS`, holding at least one word of two letters or more that the prompt does not
contain, mentioning the request's topic (its noun: "sea" for "about the sea"), and not repeating
any constraint's text. IFEval alone would reward an empty response for "no commas", a
punctuation-only one for "lowercase" (langdetect's failure counts as followed), the echoed
prompt for "include keyword", and random characters for "no commas" or "less than 20 words"
(an untrained policy's output: half of the CI base's validation problems at step 0 before the
topic rule). langdetect is seeded (IFEval leaves it
random), so a response always gets the same verdict.

Deliberately ignored: IFEval's loose accuracy (responses with first or last lines removed),
partial credit per constraint, the checkers that need nltk data no package ships (brorl never
downloads; number_sentences: punkt, capital_word_frequency: punkt_tab), the free-text ones (rephrase,
repeat_prompt, two_responses, constrained_response) and response_language and json_format (no
tiny model writes them). Paper: ProRL (arXiv 2505.24864) §3.1 (instruction following), IFEval
(arXiv 2311.07911).
"""

from __future__ import annotations

import functools
import itertools
import random
import re
from collections.abc import Sequence
from typing import Any

from pydantic import Field, NonNegativeInt, PositiveInt, field_validator

from brorl.families import FamilyParams, ProblemFamily
from brorl.types import Problem
from brorl.verifiers.config import VerifyConfig
from brorl.verifiers.verdict import Verdict, error_verdict
from brorl.verifiers.workers import judge_answers

KINDS = {
    "lowercase": "change_case:english_lowercase", "uppercase": "change_case:english_capital",
    "no_comma": "punctuation:no_comma", "max_words": "length_constraints:number_words",
    "min_words": "length_constraints:number_words", "end_phrase": "startend:end_checker",
    "quotation": "startend:quotation", "include_keyword": "keywords:existence",
    "forbidden_word": "keywords:forbidden_words", "keyword_frequency": "keywords:frequency",
    "first_word": "length_constraints:nth_paragraph_first_word",
    "bullets": "detectable_format:number_bullet_lists", "title": "detectable_format:title",
    "postscript": "detectable_content:postscript",
    "placeholders": "detectable_content:number_placeholders",
    "paragraphs": "length_constraints:number_paragraphs",
    "highlights": "detectable_format:number_highlighted_sections",
}
"""Constraint kind -> its IFEval instruction id (max_words and min_words: "less than" and "at
least" N words)."""
DEFAULT_TASKS = ("lowercase", "no_comma", "max_words", "min_words", "end_phrase", "first_word",
                 "include_keyword", "quotation", "bullets")
"""The CPU default: one constraint each, ones a weak policy meets by chance now and then (a
short answer, a lowercase one, one that starts with a given word), so the reward is not all 0."""
MAX_RESPONSE_CHARS = 16_384
"""A longer response gets 0 without a check: no constraint here needs more."""

TOPICS = {topic: f"{topic} is nice" for topic in (
    "the sea", "a cat", "the moon", "rain", "a garden", "bread", "a river", "the wind", "a dog",
    "the sun", "a book", "a train")}
"""Topic of the request -> the ideal response's first sentence: the topic, copied from the
request, and two words of its own (no commas). One pattern for every topic, so that the tiny
policy learns it within the CI base's 300 steps (twelve different sentences it did not: its
held-out instruction reward stayed at 0)."""
FORMS = ("a sentence", "a short note", "a short message", "one line", "a short reply")
KEYWORDS = ("light", "happy", "home", "blue", "friend", "water", "small", "music")
FORBIDDEN = ("banana", "purple", "rocket", "winter", "coffee", "guitar", "silver", "zebra")
"""Words no ideal response contains, to forbid."""
FIRST_WORDS = ("today", "yes", "listen", "look", "honestly", "well", "indeed", "once")
END_PHRASES = ("Any other questions?", "Is there anything else I can help with?",
               "That is all.", "Thank you for reading.")
FILLER = ("it makes me glad", "we often talk about it", "people love it very much",
          "i think of it every week")
"""Sentences that pad an ideal response to a minimum length or paragraph count."""
ITEMS = ("it is calm", "it feels old", "it looks nice")
MARKS = ("calm", "bright")

INSTRUCTION = "Follow every instruction."
EXAMPLE = ("Write a sentence about snow. Wrap your entire response with double quotation marks.",
           '"Snow covers the quiet road in white."')
"""Outside the generated sets: snow is no topic."""


class InstructionParams(FamilyParams):
    """Generated instruction-following problems (`data.families.instruction`)."""

    per_task: NonNegativeInt = 600
    """Draws per task; 0 leaves the family out. Draws may repeat; splitting dedupes by prompt."""
    tasks: tuple[str, ...] = DEFAULT_TASKS
    """Tasks: each a constraint kind of `KINDS` or kinds joined by "+" (all of them at once).
    The default: single constraints a weak policy sometimes meets (`DEFAULT_TASKS`)."""
    max_words: tuple[PositiveInt, ...] = Field((20, 30, 40), min_length=1)
    """The N of "less than N words", drawn per problem (IFEval draws 100-500: too long here)."""
    min_words: tuple[PositiveInt, ...] = Field((8, 12, 16), min_length=1)
    """The N of "at least N words", drawn per problem."""

    @field_validator("tasks")
    @classmethod
    def _known_kinds(cls, tasks: tuple[str, ...]) -> tuple[str, ...]:
        for task in tasks:
            kinds = task.split("+")
            if unknown := [k for k in kinds if k not in KINDS]:
                raise ValueError(f"tasks: {task!r} has unknown kinds {unknown}; use kinds of "
                                 f"{sorted(KINDS)}, joined by '+'.")
            if len(set(kinds)) < len(kinds):
                raise ValueError(f"tasks: {task!r} repeats a kind; name each kind once.")
        return tasks

    def size(self) -> int:
        return self.per_task * len(self.tasks)


def build(section: InstructionParams, seed: int) -> list[Problem]:
    """`per_task` problems of every task, each task's draws seeded by its name and `seed`."""
    from brorl.data.records import draw_per_task

    for task in section.tasks:
        if clash := _conflict(task.split("+")):
            raise ValueError(f"data.families.instruction.tasks: {task!r} combines {clash}, which "
                             "IFEval marks as conflicting; drop one of them.")
    return draw_per_task("instruction", section.tasks, section.tasks, section.per_task, seed,
                         functools.partial(_draw, section))


def _draw(section: InstructionParams, task: str, rng: random.Random) -> Problem:
    from brorl.data.records import make_problem

    topic = rng.choice(sorted(TOPICS))
    request = f"Write {rng.choice(FORMS)} about {topic}."
    kinds = task.split("+")
    kwargs = [_kwargs(kind, rng, section) for kind in kinds]
    ids = [KINDS[k] for k in kinds]
    texts = [_checker(i, kw)[1] for i, kw in zip(ids, kwargs)]
    problem = make_problem("instruction", task, " ".join([request, *texts]), metadata={
        "instruction_id_list": ids, "kwargs": kwargs, "kinds": kinds, "topic": topic})
    limit = kwargs[kinds.index("max_words")]["num_words"] if "max_words" in kinds else None
    if limit is not None and (n := _words(target(problem))) >= limit:
        raise ValueError(f"data.families.instruction: task {task!r} needs {n} words, more than "
                         "max_words allows; raise max_words or combine fewer kinds with it.")
    return problem


def _kwargs(kind: str, rng: random.Random, section: InstructionParams) -> dict:
    """The checker's keyword arguments for one constraint of `kind`, drawn with `rng`."""
    match kind:
        case "max_words":
            return {"relation": "less than", "num_words": rng.choice(section.max_words)}
        case "min_words":
            return {"relation": "at least", "num_words": rng.choice(section.min_words)}
        case "end_phrase":
            return {"end_phrase": rng.choice(END_PHRASES)}
        case "include_keyword":
            return {"keywords": [rng.choice(KEYWORDS)]}
        case "forbidden_word":
            return {"forbidden_words": [rng.choice(FORBIDDEN)]}
        case "keyword_frequency":
            return {"keyword": rng.choice(KEYWORDS), "frequency": rng.choice((2, 3)),
                    "relation": "at least"}
        case "first_word":
            return {"num_paragraphs": 1, "nth_paragraph": 1, "first_word": rng.choice(FIRST_WORDS)}
        case "bullets":
            return {"num_bullets": rng.choice((2, 3))}
        case "postscript":
            return {"postscript_marker": rng.choice(("P.S.", "P.P.S"))}
        case "placeholders":
            return {"num_placeholders": rng.choice((1, 2))}
        case "paragraphs":
            return {"num_paragraphs": rng.choice((2, 3))}
        case "highlights":
            return {"num_highlights": rng.choice((1, 2))}
    return {}


def extract(text: str) -> str | None:
    """The whole response, stripped; None when it is empty or whitespace."""
    return text.strip() or None


def target(problem: Problem) -> str:
    """An ideal response that follows every constraint of `problem`, written from its topic."""
    meta = problem.metadata
    args = dict(zip(meta["kinds"], meta["kwargs"]))
    sentences = [TOPICS[meta["topic"]]]
    if "first_word" in args:
        sentences[0] = f"{args['first_word']['first_word']} {sentences[0]}"
    if "include_keyword" in args:
        sentences.append(f"it reminds me of {args['include_keyword']['keywords'][0]}")
    if kw := args.get("keyword_frequency"):
        sentences.append("i say " + " and ".join([kw["keyword"]] * kw["frequency"]))
    if kw := args.get("placeholders"):
        slots = ["[name]", "[place]"][:kw["num_placeholders"]]
        sentences.append("send it to " + " at ".join(slots))
    if kw := args.get("highlights"):
        sentences.append("it is " + " and ".join(f"*{m}*" for m in MARKS[:kw["num_highlights"]]))
    if "lowercase" in args or "uppercase" in args:
        sentences.append(FILLER[1])  # langdetect misreads some single short sentences
    paragraphs = args.get("paragraphs", {}).get("num_paragraphs", 1)
    fillers = itertools.cycle(FILLER)
    sentences += [next(fillers) for _ in range(paragraphs - len(sentences))]
    text = _compose(sentences, paragraphs, args)
    while "min_words" in args and _words(text) < args["min_words"]["num_words"]:
        sentences.append(next(fillers))
        text = _compose(sentences, paragraphs, args)
    return text


def _compose(sentences: list[str], paragraphs: int, args: dict) -> str:
    """The response text: sentences spread over paragraphs, then bullets, title, postscript, end
    phrase, case and quotes as `args` (kind -> kwargs) asks."""
    lines = [f"{s[0].upper()}{s[1:]}." for s in sentences]
    cuts = [len(lines) * i // paragraphs for i in range(paragraphs + 1)]
    parts = [" ".join(lines[a:b]) for a, b in zip(cuts, cuts[1:])]
    if kw := args.get("bullets"):
        parts[-1] += "".join(f"\n* {item}" for item in ITEMS[:kw["num_bullets"]])
    if "title" in args:
        parts[0] = f"<<About it>>\n{parts[0]}" if "first_word" not in args else \
            f"{parts[0]}\n<<About it>>"
    if kw := args.get("postscript"):
        parts[-1] += f"\n{kw['postscript_marker']} Thanks."
    if kw := args.get("end_phrase"):
        parts[-1] += f"\n{kw['end_phrase']}"
    text = "\n***\n".join(parts)
    text = text.lower() if "lowercase" in args else text.upper() if "uppercase" in args else text
    return f'"{text}"' if "quotation" in args else text


def _words(text: str) -> int:
    """Words as IFEval counts them (`instructions_util.count_words`: runs of \\w)."""
    return len(re.findall(r"\w+", text))


class InstructionVerifier:
    """Binary reward: 1 when the response is non-trivial and IFEval finds every constraint
    followed."""

    def __init__(self, config: VerifyConfig = VerifyConfig()):
        self.config = config

    def verify(self, problems: Sequence[Problem], responses: Sequence[str]) -> list[Verdict]:
        """One verdict per pair; a response that is not a string gets an error verdict."""
        _warm_up()
        answers = [extract(r) if isinstance(r, str) else None for r in responses]
        verdicts = judge_answers(_check, problems, answers, workers=self.config.workers,
                                 timeout_s=self.config.timeout_s)
        return [v if isinstance(r, str) else
                error_verdict(TypeError(f"response is {type(r).__name__}, not str"))
                for r, v in zip(responses, verdicts)]


def _check(item: tuple[Problem, str]) -> Verdict:
    """IFEval's strict judgement of a non-trivial response (no time limit: call in a worker)."""
    problem, text = item
    ids, kwargs = problem.metadata["instruction_id_list"], problem.metadata["kwargs"]
    checkers = [_checker(i, kw) for i, kw in zip(ids, kwargs, strict=True)]
    said = _tokens(text)
    if (len(text) > MAX_RESPONSE_CHARS or not set(said) - set(_tokens(problem.prompt))
            or topic_noun(problem) not in said
            or any(_contains(said, _tokens(description)) for _, description in checkers)):
        return Verdict(0.0, "wrong")
    followed = all(checker.check_following(text) for checker, _ in checkers)
    return Verdict(1.0, "correct") if followed else Verdict(0.0, "wrong")


def topic_noun(problem: Problem) -> str:
    """The noun of the request's topic ("the sea" -> "sea"), which a response must mention."""
    return problem.metadata["topic"].split()[-1]


def _tokens(text: str) -> list[str]:
    """The lowercase words of two letters or more (digits and underscores split words)."""
    return re.findall(r"[^\W\d_]{2,}", text.lower())


def _contains(words: list[str], part: list[str]) -> bool:
    """Whether `part` occurs in `words` as a contiguous run."""
    return bool(part) and f" {' '.join(part)} " in f" {' '.join(words)} "


def _checker(instruction_id: str, kwargs: dict) -> tuple[Any, str]:
    """IFEval's checker for `instruction_id` built with `kwargs`, and its description."""
    from if_verifiable.ifeval.instructions_registry import INSTRUCTION_DICT

    checker = INSTRUCTION_DICT[instruction_id](instruction_id)
    return checker, checker.build_description(**kwargs)


def _conflict(kinds: list[str]) -> list[str] | None:
    """Two kinds of `kinds` that IFEval's conflict table forbids together, None if none."""
    from if_verifiable.ifeval.instructions_registry import INSTRUCTION_CONFLICTS

    for i, a in enumerate(kinds):
        for b in kinds[i + 1:]:
            if KINDS[b] in INSTRUCTION_CONFLICTS.get(KINDS[a], ()):
                return [a, b]
    return None


@functools.cache
def _warm_up() -> None:
    """Import IFEval's checkers, seed langdetect (IFEval's lowercase and capital checkers call
    it; unseeded it may change its mind between calls) and load its language profiles, once and
    before any worker forks."""
    import langdetect
    from if_verifiable.ifeval import instructions_registry  # noqa: F401 - 1.5 s, once

    langdetect.DetectorFactory.seed = 0
    langdetect.detect("the warm wind blows over the quiet sea")


FAMILY = ProblemFamily(
    name="instruction", title="Instruction following", params=InstructionParams, build=build,
    instruction=INSTRUCTION, example=EXAMPLE, extract=extract, target=target,
    verifier=InstructionVerifier, headline="pass_at_1",
)
