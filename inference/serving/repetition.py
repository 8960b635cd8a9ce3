"""An answer caught repeating itself: the chat stops it and says so, with Continue beside it, where it would otherwise
run on to the cap (a greedy code model's first coding question looped to 2,048 tokens). The API's answers run as asked:
a script asks for what it wants."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MIN_REPEATS = 3  # whole copies of the span, one after the other
MIN_TOKENS = 128  # and at least this many tokens in them: a separator line or a table's rows are not a loop
MAX_PERIOD = 256  # the longest span looked for (a function or a paragraph written again)


def loop_period(tokens: Sequence[int]) -> int:
    """The length of the span the answer's last tokens repeat, at least MIN_REPEATS times and over MIN_TOKENS tokens
    or more, or 0 where it does not end in such a loop. A millisecond at most (one vector compare per period)."""
    if len(tokens) < MIN_TOKENS:
        return 0
    tail = np.asarray(tokens[-MAX_PERIOD * MIN_REPEATS - MIN_TOKENS:])
    for period in range(1, MAX_PERIOD + 1):
        looped = max(MIN_REPEATS * period, MIN_TOKENS)  # the last `looped` tokens: each equals the one `period` back
        if looped > len(tail):
            return 0
        if np.array_equal(tail[len(tail) - looped + period:], tail[len(tail) - looped:len(tail) - period]):
            return period
    return 0
