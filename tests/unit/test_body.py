"""The strict JSON decoder request bodies go through."""

from __future__ import annotations

import json

import pytest

from clawrl.api.body import MAX_DEPTH, parse_json


def test_ordinary_json_decodes_as_usual():
    body = {"a": [1, 2.5, -3e10, None, True, "é"], "b": {"c": {"d": []}}}
    assert parse_json(json.dumps(body, ensure_ascii=False).encode()) == body


@pytest.mark.parametrize(
    "raw, needle",
    [
        (b'{"x": NaN}', "NaN is not a JSON number"),
        (b"[Infinity]", "Infinity is not a JSON number"),
        (b"[-Infinity]", "-Infinity is not a JSON number"),
        (b"[1e400]", "too large"),
        (b"[" + b"9" * 5000 + b"]", "digits"),
        (b'{"x": "\xff"}', "not UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, f"deeper than {MAX_DEPTH}"),
        (b"{" + b'"a": {' * MAX_DEPTH + b"}" * (MAX_DEPTH + 1), f"deeper than {MAX_DEPTH}"),
        (b'{"x": 1', "Expecting"),
    ],
)
def test_refusals_are_json_errors_that_say_why(raw, needle):
    with pytest.raises(json.JSONDecodeError) as caught:
        parse_json(raw)
    assert needle in caught.value.msg


def test_nesting_up_to_the_limit_is_accepted():
    exact = b"[" * MAX_DEPTH + b"]" * MAX_DEPTH
    assert parse_json(exact) == json.loads(exact)
    assert parse_json(b"7") == 7
