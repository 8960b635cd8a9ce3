"""Whether each drafter pays for itself in one answer, judged from that answer's own steps: a drafter whose last few
steps delivered clearly fewer tokens a second than the main alone would sits out a while (its steps are the main's
alone), then is tried again (judged on fewer steps: it collapsed once), as the answer may turn from prose the draft
misses to code it predicts. So an answer whose acceptance collapses (a sampled answer at a high temperature, a
language the draft never saw) goes on near the main alone's speed, where a fixed K would go on paying for proposals
the main throws away.

Exactness does not depend on it: whether a step proposes is decided before the step from what came before, and the
main verifies whatever is proposed by the same rule (engines/own/acceptance.py).

The main alone's step is known without timing it while a drafter clearly pays: a verify of K+1 tokens costs at most
VERIFY_AT_MOST of its steps on the hosts measured, so the quickest verify bounds it. Only a window that does not pay
against that bound asks for a few steps with nothing proposed, timed, and is judged against their median (and against
the steps it sat out, later): an answer that pays throughout never gives a step away to be measured.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from statistics import median

from inference.limits import Drafter

WINDOW = 8  # a drafter's last steps judged together: a poor stretch of a few steps in a good answer is not a collapse
PROBE = 4  # the steps a drafter that sat out before is judged on when tried again: it collapsed once, probes cost
FIRST_PAUSE = 8  # tokens a drafter sits out the first time it does not pay (a poor stretch is often short)
MAX_PAUSE = 256  # each pause in a row doubles, up to this
ALONE_STEPS_KEPT = 8  # the main alone's one-token steps whose median is its time a token
MEASURE_EVERY = 128  # tokens after which the main alone's time is measured again before it decides
# The main alone's steps timed in a row before a window is judged against them: one step slowed by a neighbour on a
# shared host would make the main alone look slow, and a drafter that does not pay go on for MEASURE_EVERY tokens.
ALONE_TIMED = 3
# A verify of K+1 tokens against one token of the main alone, at most: above what the hosts' calibrations measured at
# the Ks served, AVX2's steep verify curves included (docs/calibration.md#figures).
VERIFY_AT_MOST = 1.5
# A window this far below the main alone's speed has collapsed. Closer, the drafter goes on: a few steps' times on a
# shared host move more than that, and a poor stretch is often followed by a good one (sitting out every window below
# the main alone lost against a fixed K on greedy chat: docs/speculation.md#drafters-that-do-not-pay).
COLLAPSED = 0.9


@dataclass
class DrafterRecord:
    """One drafter's last judged steps in this answer: (tokens delivered, seconds, the main's verify seconds)."""

    steps: deque[tuple[int, float, float]] = field(default_factory=lambda: deque(maxlen=WINDOW))
    resumes_at: int = 0  # the answer's length from which it proposes again
    pause: int = FIRST_PAUSE
    catching_up: bool = False  # its next step feeds the draft what it sat out: not judged
    sat_out: bool = False  # it has sat out before in this answer: judged on PROBE steps

    @property
    def judged_on(self) -> int:
        return PROBE if self.sat_out else WINDOW


class Payoff:
    """One answer's judge of its drafters: `proposes` before a step, `record` after it."""

    def __init__(self, *, judging: bool = True) -> None:
        self.judging = judging  # off: every drafter proposes every step (fixed K, as a benchmark's line asks)
        self.records = {drafter: DrafterRecord() for drafter in Drafter}
        self.alone_steps: deque[float] = deque(maxlen=ALONE_STEPS_KEPT)
        self.tokens = 0  # the answer's tokens so far, as the steps recorded them
        self.alone_timed_at: int | None = None  # the answer's length when the main alone's step was last timed
        self.to_time = 0  # the next steps propose nothing: they time the main alone

    @property
    def measuring(self) -> bool:
        return self.to_time > 0

    def proposes(self, drafter: Drafter) -> bool:
        return not self.judging or (not self.measuring and self.tokens >= self.records[drafter].resumes_at)

    def record(self, drafter: Drafter | None, *, tokens: int, seconds: float, verify_seconds: float) -> None:
        """A step's outcome: `drafter` None for a step nothing was proposed for (the main alone's one token);
        `seconds`: the whole step, proposing included; `verify_seconds`: the main's inference."""
        self.tokens += tokens
        if drafter is None:
            self.alone_steps.append(seconds)
            self.to_time = max(self.to_time - 1, 0)
            if not self.to_time:
                self.alone_timed_at = self.tokens
            return
        record = self.records[drafter]
        if record.catching_up:
            record.catching_up = False
            return
        record.steps.append((tokens, seconds, verify_seconds))
        if not self.judging or len(record.steps) < record.judged_on or self._pays(record):
            return
        if self.measuring:
            return  # judged once the main alone is timed
        record.resumes_at, record.pause = self.tokens + record.pause, min(2 * record.pause, MAX_PAUSE)
        record.steps.clear()
        record.sat_out, record.catching_up = True, drafter == Drafter.DRAFT  # the lookup has nothing to catch up on

    def _pays(self, record: DrafterRecord) -> bool:
        """Whether its window's tokens a second have not collapsed below the main alone's: against the quickest the
        main alone's step can be, else against its step timed in this answer lately (asked for when there is none:
        `measuring`, and the window is undecided)."""
        tokens = sum(step[0] for step in record.steps)
        seconds = sum(step[1] for step in record.steps)
        if tokens * min(step[2] for step in record.steps) / VERIFY_AT_MOST >= COLLAPSED * seconds:
            record.pause = FIRST_PAUSE
            return True
        if self.alone_timed_at is None or self.tokens - self.alone_timed_at > MEASURE_EVERY:
            self.to_time = ALONE_TIMED
            return False
        pays = tokens * median(self.alone_steps) >= COLLAPSED * seconds
        if pays:
            record.pause = FIRST_PAUSE
        return pays
