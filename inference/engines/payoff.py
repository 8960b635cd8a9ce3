"""Whether each drafter pays for itself in one answer, judged from that answer's own steps: a drafter whose last few
steps delivered fewer tokens a second than the main alone would sits out a while (its steps are the main's alone),
then is tried again, as the answer may turn from prose the draft misses to code it predicts. So an answer whose
acceptance collapses (a sampled answer at a high temperature, a language the draft never saw) goes on at about the
main alone's speed within a few steps, where a fixed K would go on paying for proposals the main throws away.

Exactness does not depend on it: whether a step proposes is decided before the step from what came before, and the
main verifies whatever is proposed by the same rule (engines/acceptance.py).

The main alone's speed is timed in the answer itself: its first step after the prompt proposes nothing, and so does
one step in every MEASURE_EVERY tokens where none did (the host's load moves it); that costs one step's gain in a
hundred-odd tokens.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from statistics import median

from inference.limits import Drafter

WINDOW = 4  # a drafter's last steps judged together: "within a few steps", with a step's jitter averaged out
FIRST_PAUSE = 16  # tokens a drafter sits out the first time it does not pay
MAX_PAUSE = 256  # each pause in a row doubles, up to this
ALONE_STEPS_KEPT = 8  # the main alone's one-token steps whose median is its time a token
MEASURE_EVERY = 128  # tokens after which a step times the main alone again, if none did meanwhile
# A window this far below the main alone's speed has collapsed. Closer, the drafter goes on: four steps' times on a
# shared host move more than that, and a poor stretch is often followed by a good one (greedy chat requests on the
# real pair: sitting out every window below the main alone lost 2% against a fixed K, docs/speculation.md).
COLLAPSED = 0.8


@dataclass
class DrafterRecord:
    """One drafter's last judged steps in this answer: (tokens delivered, seconds)."""

    steps: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=WINDOW))
    resumes_at: int = 0  # the answer's length from which it proposes again
    pause: int = FIRST_PAUSE
    catching_up: bool = False  # its next step feeds the draft what it sat out: not judged


class Payoff:
    """One answer's judge of its drafters: `proposes` before a step, `record` after it."""

    def __init__(self, *, judging: bool = True) -> None:
        self.judging = judging  # off: every drafter proposes every step (fixed K, as a benchmark's line asks)
        self.records = {drafter: DrafterRecord() for drafter in Drafter}
        self.alone_steps: deque[float] = deque(maxlen=ALONE_STEPS_KEPT)
        self.tokens = 0  # the answer's tokens so far, as the steps recorded them
        self.measure_at = 0  # the answer's length at which a step times the main alone

    def proposes(self, drafter: Drafter) -> bool:
        return not self.judging or self.measure_at > self.tokens >= self.records[drafter].resumes_at

    def record(self, drafter: Drafter | None, *, tokens: int, seconds: float) -> None:
        """A step's outcome: `drafter` None for a step nothing was proposed for (the main alone's one token);
        `seconds`: the whole step, proposing included."""
        self.tokens += tokens
        if drafter is None:
            self.alone_steps.append(seconds)
            self.measure_at = self.tokens + MEASURE_EVERY
            return
        record = self.records[drafter]
        if record.catching_up:
            record.catching_up = False
            return
        record.steps.append((tokens, seconds))
        if len(record.steps) < WINDOW or not self.alone_steps:
            return
        if self._pays(record):
            record.pause = FIRST_PAUSE
            return
        record.resumes_at, record.pause = self.tokens + record.pause, min(2 * record.pause, MAX_PAUSE)
        record.steps.clear()
        record.catching_up = drafter == Drafter.DRAFT  # the lookup has nothing to catch up on

    def _pays(self, record: DrafterRecord) -> bool:
        """Its window's tokens a second against the main alone's in this answer: not collapsed."""
        tokens = sum(step[0] for step in record.steps)
        seconds = sum(step[1] for step in record.steps)
        return tokens * median(self.alone_steps) >= COLLAPSED * seconds
