"""How many tokens the draft proposes at each step of one answer: the K, up to the plan's, that this answer's own
acceptance so far says delivers the most tokens a second at the host's costs.

A K fits the draft's acceptance a: a step of K proposals delivers (1 - a^(K+1)) / (1 - a) tokens on average and costs
K draft tokens and a verify of K+1 (the host's calibration times both, as shares of one main token). The plan's K is
the best for the requests it was measured on; an answer the draft guesses poorly (a language or a temperature it
knows little of) is better served by shorter steps, while on the requests the plan's K was measured on the two come
out level (docs/speculation.md#a-k-per-answer). Where the draft stops at a token it is unsure of (`draft_stop_below`)
its steps are shortened by its own confidence already, and the plan's K stands.

Exact like every other step-length rule: the K is decided before the step from what the answer delivered before it.
"""

from __future__ import annotations

from collections import deque

PRIOR_ACCEPTANCE = 0.7  # what an answer is taken to accept before its own steps say otherwise
PRIOR_WEIGHT = 8  # worth this many proposals: a few steps move it
WINDOW = 48  # the draft's last steps the acceptance is counted on: an answer turns from prose to code and back


class StepLength:
    """One answer's draft step length; `costs` = (a draft token, then the verify of 2, 3, ... tokens), each as a share
    of one main token."""

    def __init__(self, costs: tuple[float, ...]):
        self.draft_cost = costs[0]
        self.verify_cost = {1: 1.0, **dict(enumerate(costs[1:], start=2))}
        self.steps: deque[tuple[int, int]] = deque(maxlen=WINDOW)  # (tokens judged, accepted) per drafted step

    @property
    def acceptance(self) -> float:
        judged = sum(step[0] for step in self.steps)
        accepted = sum(step[1] for step in self.steps)
        return (PRIOR_ACCEPTANCE * PRIOR_WEIGHT + accepted) / (PRIOR_WEIGHT + judged)

    def k(self, most: int) -> int:
        """The K in 1..`most` (at most one below the longest verify timed) whose expected tokens a second is best."""
        alpha, most = self.acceptance, min(most, max(self.verify_cost) - 1)
        if most <= 1:
            return max(most, 1)

        def rate(k: int) -> float:
            delivered = (1 - alpha ** (k + 1)) / (1 - alpha) if alpha < 1 else k + 1
            return delivered / (k * self.draft_cost + self.verify_cost[k + 1])

        return max(range(1, most + 1), key=rate)

    def record(self, *, proposed: int, accepted: int) -> None:
        """A drafted step's outcome: its proposals up to the first the main refused are the ones judged."""
        if proposed:
            self.steps.append((min(accepted + 1, proposed), accepted))
