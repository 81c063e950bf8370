"""The judge of code tests (brorl.verifiers.checks): which forms it accepts, how it compares,
and that it decodes nothing but plain data (issue 13)."""

from __future__ import annotations

import json

import pytest

from brorl.verifiers.checks import Check, decode, parse_test, same


@pytest.mark.parametrize(
    ("test", "check"),
    [
        ("assert f(2) == 5", Check("f(2)", "==", 5)),
        ("assert f(*[1, 'a'], k=None) != [1]", Check("f(*[1, 'a'], k=None)", "!=", [1])),
        ("assert 3 < g(x=1.5)", Check("g(x=1.5)", "<", 3, reflected=True)),
        ("assert f('ab') in ('a', 'b')", Check("f('ab')", "in", ("a", "b"))),
        ("assert f() is None", Check("f()", "is", None)),
        ("assert f()", Check("f()", "truthy")),
        ("assert not done", Check("done", "falsy")),
        ("assert abs(f(2) - 1.5) < 1e-6", Check("f(2)", "close", 1.5, tolerance=1e-6)),
        ("assert abs(f(2) - 1.5) <= 0.1", Check("f(2)", "close", 1.5, tolerance=0.1,
                                                 inclusive=True)),
    ],
)
def test_accepted_forms_split_into_subject_and_comparison(test, check):
    assert parse_test(test) == check


@pytest.mark.parametrize(
    "test",
    [
        "assert True",  # no subject: nothing of the candidate's is checked
        "assert f(x) == 1",  # a non-literal argument
        "assert f(1) == g(1)",  # both sides the candidate's
        "assert f(f(1)) == 2",  # nested call
        "assert sorted(f(1)) == [1]",  # the judge would compare what the candidate's sorted says
        "assert f(1) is 1",  # identity with a non-singleton
        "x = f()\nassert x == 1",  # two statements
        "print(f(1))",  # not an assert
        "assert f(1) == 1 == 1",  # a chained comparison
        "assert abs(f(1) - g(1)) < 1",  # a tolerance against the candidate's own value
        "assert f(",  # not Python
    ],
)
def test_other_forms_are_refused_with_the_accepted_ones(test):
    with pytest.raises(ValueError, match="write it as `assert f"):
        parse_test(test)


def test_same_is_equality_of_plain_values_with_exact_kinds():
    assert same(1, 1.0) and same(2, 2 + 0j) and same("a", "a") and same(None, None)
    assert not same(True, 1) and not same(0, False) and not same(1, "1")
    assert not same([1, 2], (1, 2)) and not same([1], [1, 2])
    assert same({"k": [1, (2,)]}, {"k": [1.0, (2,)]}) and not same({"k": [True]}, {"k": [1]})
    assert same({1, 2}, {2, 1}) and not same({1}, frozenset({1}))


def test_passes_applies_each_comparison_on_the_judges_side():
    assert Check("f()", "==", 5).passes(5) and not Check("f()", "==", 5).passes(True)
    assert Check("f()", "<", 3, reflected=True).passes(4)  # 3 < 4
    assert not Check("f()", "<", 3).passes(4)
    assert Check("f()", "in", (1, 2)).passes(2) and not Check("f()", "not in", (1, 2)).passes(2)
    assert Check("f()", "close", 1.5, tolerance=0.01).passes(1.505)
    assert not Check("f()", "close", 1.5, tolerance=0.01).passes("1.5")  # not a number
    assert not Check("f()", "close", 1.5, tolerance=0.01).passes(True)  # bool is not a number
    assert Check("f()", "truthy").passes([0]) and Check("f()", "falsy").passes("")
    assert not Check("f()", "<", 1).passes("a")  # a TypeError is a failed test, not a crash


def test_decode_takes_the_plain_encoding_only():
    wire = ["t", [["i", "3"], ["f", (0.5).hex()], ["s", "x"], ["l", []], ["n"], ["b", True],
                  ["y", "ff"], ["c", (1.0).hex(), (2.0).hex()],
                  ["d", [[["s", "k"], ["S", [["i", "1"]]]]]], ["F", []]]]
    value = decode(json.dumps(wire))
    assert value == (3, 0.5, "x", [], None, True, b"\xff", 1 + 2j, {"k": {1}}, frozenset())
    assert type(value[5]) is bool
    for bad in ['["i", 3]', '["b", 1]', '["x", "1"]', '"3"', "3", "[]", '["i", "1e9"]',
                '["d", [[["l", []], ["n"]]]]', '["i", "' + "9" * 5000 + '"]', "[" * 100000,
                "not json"]:
        with pytest.raises(ValueError, match="not a plain encoded value"):
            decode(bad)
