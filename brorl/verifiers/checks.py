"""Code tests the candidate cannot fake: each test is split into what the sandbox evaluates (a
call of the candidate's function, or a name it defines) and what the judge compares on its side.

A code test is one `assert` statement of these forms, `SUBJECT` being `name(arguments)` with
literal arguments (`*[...]` and keywords included) or a bare `name`, `LITERAL` a Python literal:

    assert SUBJECT == LITERAL        (also !=, <, <=, >, >=, in, not in, and LITERAL op SUBJECT)
    assert SUBJECT is None           (also is True / is False / is not ...)
    assert SUBJECT                   (truthy)      assert not SUBJECT
    assert abs(SUBJECT - LITERAL) < LITERAL        (a tolerance; also <=)

The sandbox receives the candidate's code and the SUBJECT sources only, never a LITERAL the
answer is compared with, so nothing in the candidate's address space tells it what to return. It
sends back each SUBJECT's value in a plain encoding that only the exact built-in types have
(`None`, `bool`, `int`, `float`, `complex`, `str`, `bytes`, `list`, `tuple`, `dict`, `set`,
`frozenset`; never a subclass, so no `__eq__`, `__hash__` or `__bool__` of the candidate's), and
`Check.passes` decodes and compares it here, in the judge's process, with the judge's built-ins.
A candidate that fakes the channel can only send values; to pass it must send the right ones.

Deliberately ignored: tests of any other shape (arbitrary statements would have to run beside
the candidate, where it can fake them): `parse_test` refuses them with the accepted forms, and
`brorl.families.code` refuses them when data is loaded. Paper: ProRL (arXiv 2505.24864) App. E
(Code: fraction of test cases passed).
"""

from __future__ import annotations

import ast
import json
import operator
from dataclasses import dataclass
from functools import lru_cache

FORMS = ("`assert f(<literals>) == <literal>` (or !=, <, <=, >, >=, in, not in, is None, "
         "`assert f(...)`, `assert not f(...)`, `assert abs(f(...) - <literal>) < <literal>`)")
"""The accepted test forms, named in every refusal."""

_NUMBERS = (int, float, complex)


def same(value: object, expected: object) -> bool:
    """Equality of plain values with exact kinds: numbers compare by value (1 == 1.0), but a bool
    is not a number (True != 1), a list is not a tuple, and containers compare item by item."""
    kind, want = type(value), type(expected)
    if kind in _NUMBERS and want in _NUMBERS:
        return value == expected
    if kind is not want:
        return False
    if kind in (list, tuple):
        return len(value) == len(expected) and all(map(same, value, expected))
    if kind is dict:
        return value.keys() == expected.keys() and all(same(value[k], expected[k])
                                                       for k in expected)
    return value == expected  # None, bool, str, bytes, set, frozenset


_COMPARE = {
    ast.Eq: same, ast.NotEq: lambda a, b: not same(a, b), ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b, ast.Is: operator.is_, ast.IsNot: operator.is_not,
}
_OPS = {cls: name for cls, name in (
    (ast.Eq, "=="), (ast.NotEq, "!="), (ast.Lt, "<"), (ast.LtE, "<="), (ast.Gt, ">"),
    (ast.GtE, ">="), (ast.In, "in"), (ast.NotIn, "not in"), (ast.Is, "is"), (ast.IsNot, "is not"))}
_BY_NAME = {name: _COMPARE[cls] for cls, name in _OPS.items()}


@dataclass(frozen=True)
class Check:
    """One test: the sandbox evaluates `subject`; the judge applies `op` against `expected`.

    `op`: a comparison (`==`, ..., `in`, `is`) with the subject on the left (`reflected`: on the
    right), `truthy`, `falsy`, or `close` (|subject - expected| < tolerance, `<=` when
    `inclusive`).
    """

    subject: str
    op: str
    expected: object = None
    reflected: bool = False
    tolerance: float = 0.0
    inclusive: bool = False

    def passes(self, value: object) -> bool:
        """Whether the subject's decoded plain `value` satisfies the test; never raises."""
        try:
            return bool(self._passes(value))
        except Exception:  # noqa: BLE001 - e.g. '<' between a str and an int: the test fails
            return False

    def _passes(self, value: object) -> bool:
        if self.op == "truthy":
            return bool(value)
        if self.op == "falsy":
            return not value
        if self.op == "close":
            if type(value) not in (int, float):  # noqa: E721 - exact types, on purpose
                return False
            gap = abs(value - self.expected)
            return gap <= self.tolerance if self.inclusive else gap < self.tolerance
        compare = _BY_NAME[self.op]
        if self.reflected:
            return compare(self.expected, value)
        return compare(value, self.expected)


def _literal(node: ast.AST) -> object:
    return ast.literal_eval(node)


def _is_literal(node: ast.AST) -> bool:
    try:
        _literal(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def _subject(node: ast.AST) -> str | None:
    """The source of a subject (`name(literal args)` or `name`), None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        return None
    args = [a.value if isinstance(a, ast.Starred) else a for a in node.args]
    if all(_is_literal(a) for a in args) and all(k.arg is not None and _is_literal(k.value)
                                                for k in node.keywords):
        return ast.unparse(node)
    return None


def _check(test: ast.expr) -> Check | None:
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        subject = _subject(test.operand)
        return Check(subject, "falsy") if subject else None
    if (subject := _subject(test)) is not None:
        return Check(subject, "truthy")
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return None
    left, op, right = test.left, type(test.ops[0]), test.comparators[0]
    if (isinstance(left, ast.Call) and isinstance(left.func, ast.Name) and left.func.id == "abs"
            and len(left.args) == 1 and not left.keywords and op in (ast.Lt, ast.LtE)
            and isinstance(left.args[0], ast.BinOp) and isinstance(left.args[0].op, ast.Sub)
            and _is_literal(right)):
        inner = left.args[0]
        subject = _subject(inner.left)
        if subject and _is_literal(inner.right):
            return Check(subject, "close", _literal(inner.right),
                         tolerance=float(_literal(right)), inclusive=op is ast.LtE)
        return None
    if op in (ast.Is, ast.IsNot):  # identity only against the singletons
        if (subject := _subject(left)) and isinstance(right, ast.Constant) and (
                right.value is None or isinstance(right.value, bool)):
            return Check(subject, _OPS[op], right.value)
        return None
    if (subject := _subject(left)) is not None and _is_literal(right):
        return Check(subject, _OPS[op], _literal(right))
    if (subject := _subject(right)) is not None and _is_literal(left):
        return Check(subject, _OPS[op], _literal(left), reflected=True)
    return None


def parse_test(test: str) -> Check:
    """The `Check` of one test snippet; ValueError naming the accepted forms otherwise."""
    try:
        module = ast.parse(test.strip(), mode="exec")
    except (SyntaxError, ValueError) as exc:
        raise ValueError(f"code test {test!r} is not valid Python ({exc.__class__.__name__}); "
                         f"write it as {FORMS}.") from None
    check = None
    if len(module.body) == 1 and isinstance(module.body[0], ast.Assert):
        check = _check(module.body[0].test)
    if check is None:
        raise ValueError(f"code test {test!r} has a form the judge cannot check outside the "
                         f"sandbox; write it as {FORMS}.")
    return check


@lru_cache(maxsize=4096)
def parse_tests(tests: tuple[str, ...]) -> tuple[Check, ...]:
    """`parse_test` of each snippet (cached: every rollout of a problem shares its tests)."""
    return tuple(parse_test(t) for t in tests)


def decode(wire: str) -> object:
    """A value from the sandbox's plain encoding (`harness.encode`, JSON); ValueError if the
    text is not exactly that encoding. Only built-in types come out; nothing is executed."""
    try:
        return _decode(json.loads(wire))
    except (ValueError, TypeError, KeyError, IndexError, RecursionError, OverflowError) as exc:
        raise ValueError(f"not a plain encoded value: {exc.__class__.__name__}") from None


def _decode(node: object) -> object:
    if type(node) is not list or not node or type(node[0]) is not str:
        raise ValueError("a tagged list was expected")
    tag, rest = node[0], node[1:]
    match tag, len(rest):
        case "n", 0:
            return None
        case "b", 1 if type(rest[0]) is bool:
            return rest[0]
        case "i", 1 if type(rest[0]) is str:
            return int(rest[0])
        case "f", 1 if type(rest[0]) is str:
            return float.fromhex(rest[0])
        case "c", 2 if type(rest[0]) is str and type(rest[1]) is str:
            return complex(float.fromhex(rest[0]), float.fromhex(rest[1]))
        case "s", 1 if type(rest[0]) is str:
            return rest[0]
        case "y", 1 if type(rest[0]) is str:
            return bytes.fromhex(rest[0])
        case ("l" | "t" | "S" | "F"), 1 if type(rest[0]) is list:
            items = [_decode(item) for item in rest[0]]
            return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
        case "d", 1 if type(rest[0]) is list:
            pairs = [(_decode(k), _decode(v)) for k, v in rest[0]]
            return dict(pairs)
    raise ValueError(f"unknown tag {tag!r}")

