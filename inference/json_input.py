"""JSON that users (or a model) wrote, parsed within bounds and refused in plain words.

Python's own parser is not bounded that way: it raises RecursionError on deep nesting (a 500 wherever it
was not caught), names sys.set_int_max_str_digits for a 5,000-digit integer, accepts NaN and Infinity,
which JSON has not, and a lone surrogate escape ("\\ud800"), which is no text: the database and the
model's tokenizer fail on it far from here. Every place that parses a request body, a chat frame or a
tool call's arguments goes through `parse`.
"""

from __future__ import annotations

import json
from typing import Any

from inference import limits


class JsonInputError(ValueError):
    """The text is not JSON this server takes; the message says why, in words a user can read."""


def parse(text: str | bytes, *, max_depth: int = limits.MAX_JSON_DEPTH) -> Any:
    """The JSON value in `text`, nesting at most `max_depth` arrays and objects deep."""
    too_deep = f"it nests deeper than {max_depth} levels"
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_int=_bounded_int)
    except RecursionError:
        raise JsonInputError(too_deep) from None
    except JsonInputError:
        raise
    except ValueError as exc:  # not JSON, or bytes that are not UTF-8
        raise JsonInputError(str(exc)) from None
    if depth_over(value, max_depth):
        raise JsonInputError(too_deep)
    try:
        json.dumps(value, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        raise JsonInputError("it holds invalid Unicode (a lone surrogate escape)") from None
    return value


def depth_over(value: Any, limit: int) -> bool:
    """Whether `value` (parsed JSON) nests deeper than `limit`; without recursion, so any depth is safe."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


def _no_constant(name: str):
    raise JsonInputError(f"{name} is not a number JSON allows")


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > limits.MAX_NUMBER_DIGITS:
        raise JsonInputError(f"a number has {len(digits.lstrip('-'))} digits (at most {limits.MAX_NUMBER_DIGITS})")
    return int(digits)
