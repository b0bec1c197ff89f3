"""JSON from outside the process, parsed so that whatever parses is safe to hold.

Python's ``json`` accepts more than JSON: the literals ``NaN``, ``Infinity`` and
``-Infinity``, and a number too large for a float (``1e400``) read as infinity;
either would reach a table as a non-finite hyper-parameter, and neither can be
written back out as JSON (an error reply echoing it fails). Nesting costs a
recursion per level, so 100,000 ``[`` end the parse in ``RecursionError``; a
few hundred levels still parse, and then overflow whatever walks the result.

``loads`` refuses all of these, nesting before anything is parsed, with
``json.JSONDecodeError`` (a ValueError) saying what and where, so a caller that
already handles bad JSON handles them too. The admin API parses request bodies
with it, a PS node the ``spec_json`` of CreateTable.
"""

from __future__ import annotations

import json
import math
import re
import sys
from itertools import accumulate
from typing import Any, NoReturn

#: the deepest nesting of arrays and objects accepted (a table spec nests 3 deep,
#: the deepest body of the admin API 4)
MAX_DEPTH = 32
#: a string with its escapes (an unterminated one runs to the end), matched
#: possessively so that no input makes the scan quadratic
_STRING = re.compile(r'"[^"\\]*+(?:\\.[^"\\]*+)*+"?', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def loads(document: str | bytes | bytearray) -> Any:
    """``document`` parsed as strict JSON; ``json.JSONDecodeError`` when it is not.

    Refused besides malformed JSON: nesting deeper than ``MAX_DEPTH``, the
    constants ``NaN``/``Infinity``/``-Infinity``, a number that is not a finite
    float (``1e400``) and an integer too long to read (over 4300 digits).
    """
    text = _text(document)
    depth = nesting_depth(text) if text.count("[") + text.count("{") > MAX_DEPTH else 0
    if depth > MAX_DEPTH:
        _refuse(f"nested {depth} levels deep, more than the {MAX_DEPTH} accepted", text, 0)

    def constant(literal: str) -> NoReturn:
        _refuse(f"{literal} is not a JSON number: numbers must be finite", text, literal)

    def finite_float(literal: str) -> float:
        value = float(literal)
        if not math.isfinite(value):
            shown = literal if len(literal) <= 24 else f"{literal[:20]}..."
            _refuse(f"{shown} is out of range: numbers must be finite", text, literal)
        return value

    try:
        return json.loads(text, parse_constant=constant, parse_float=finite_float)
    except json.JSONDecodeError:
        raise
    except ValueError:  # an integer longer than Python reads from text
        limit = sys.get_int_max_str_digits()
        raise json.JSONDecodeError(f"an integer of over {limit} digits", text, 0) from None


def nesting_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in ``text`` (brackets inside strings
    do not count); scanned without parsing, linear in its length."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def _text(document: str | bytes | bytearray) -> str:
    if isinstance(document, str):
        return document
    try:  # the encodings json.loads accepts
        return bytes(document).decode(json.detect_encoding(document), "surrogatepass")
    except UnicodeDecodeError as error:
        raise json.JSONDecodeError(f"not UTF-8, -16 or -32 text ({error.reason})", "", 0) from None


def _refuse(message: str, text: str, where: int | str) -> NoReturn:
    """Raise the decode error; ``where``: a position, or the literal to find."""
    position = where if isinstance(where, int) else max(text.find(where), 0)
    raise json.JSONDecodeError(message, text, position)
