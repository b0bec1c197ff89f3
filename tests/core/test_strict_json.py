"""Strict JSON: what Python's json accepts beyond JSON, and nesting, refused before use."""

from __future__ import annotations

import json
import time

import pytest

from recstore.core.strict_json import MAX_DEPTH, loads, nesting_depth


@pytest.mark.parametrize(
    ("document", "reason", "position"),
    [
        ('{"lr": NaN}', "NaN is not a JSON number", 7),
        ('{"lr": Infinity}', "Infinity is not a JSON number", 7),
        ('{"lr": -Infinity}', "-Infinity is not a JSON number", 7),
        ('{"lr": 1e400}', "1e400 is out of range", 7),
        ('{"lr": -1e400}', "-1e400 is out of range", 7),
        ('{"lr": 1' + "0" * 400 + ".5}", "is out of range", 7),
        ("[" + "9" * 5000 + "]", "an integer of over", 0),
        ("[" * 100_000 + "]" * 100_000, "nested 100000 levels deep", 0),
        ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), f"more than the {MAX_DEPTH}", 0),
        (b"\xff\xfe\xff", "not UTF-8, -16 or -32 text", 0),
        ('{"lr": 1', "Expecting", 8),  # plain bad JSON still says what json says
    ],
)
def test_refused_with_a_decode_error_saying_what_and_where(
    document: str | bytes, reason: str, position: int
) -> None:
    with pytest.raises(json.JSONDecodeError) as refused:
        loads(document)
    assert reason in refused.value.msg and refused.value.pos == position


@pytest.mark.parametrize(
    "document",
    [
        '{"a": 1.5, "b": [1, {"c": "x\\"y"}], "d": -2e-3, "e": 1e308, "f": true}',
        '{"s": "' + "[" * 1000 + '\\\\", "t": ["\\n"]}',  # brackets in strings do not nest
        "[" * MAX_DEPTH + "]" * MAX_DEPTH,
        '"NaN"',
        b'{"utf-8": "\xc3\xa9"}',
        '{"utf-16": 1}'.encode("utf-16"),
    ],
)
def test_strict_json_reads_what_json_reads(document: str | bytes) -> None:
    assert loads(document) == json.loads(document)


def test_nesting_depth_skips_strings_and_escapes() -> None:
    assert nesting_depth('[{"a": "]]]\\"[[[", "b": [[]]}]') == 4
    assert nesting_depth('"unterminated [[[[') == 0
    assert nesting_depth("") == 0


@pytest.mark.parametrize(
    "adversarial",
    ['"' + '\\"' * 500_000, '"a' * 500_000, "[]" * 500_000, "[" * 1_000_000],
    ids=["escaped quotes", "quotes", "pairs", "opening brackets"],
)
def test_the_scan_is_linear(adversarial: str) -> None:
    started = time.perf_counter()
    nesting_depth(adversarial)
    assert time.perf_counter() - started < 5.0  # a quadratic scan takes minutes here
