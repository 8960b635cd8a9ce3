"""What a worker's engines delivered lately: tokens per second of step time, by K (0: the main alone)
and by how many streams the step served; and the most streams it ran lately.

The pair's profile says which K is fastest at each load, as the benchmark measured it, maybe on
another day: on these shared hosts the crossover between speculation and the main alone moved from
above 16 streams to below 8 between two evenings. These figures say it for this host now, from the
answers the worker serves, and the planner (serving/planning) prefers them where both the main alone and a K have
been measured at the load. A step that ran beside another of the pair's pipelines is not counted:
the two contend for the cores and neither figure would be its own.
"""

from __future__ import annotations

import threading
import time
from collections import deque

MAX_SAMPLES = 4000  # per (K, streams bucket): about 10 minutes of steps at 8 streams
LOAD_MEMORY_S = 5.0  # a burst's first requests arrive before the rest: they plan for the load seen this lately
# A worker whose plans keep one path at a load never measures the other there: once per figure's
# lifetime, at loads where the two can cross (at 1-2 streams speculation leads far: docs/speculation.md), the requests
# joining in the next EXPLORE_FOR_S go to the unmeasured path until it has a figure.
EXPLORE_MIN_STREAMS = 4
EXPLORE_FOR_S = 30.0


def streams_bucket(streams: int) -> int:
    """The power of two at or above `streams`: a burst of 8 steps at 8 and, as it ends, 7 down to 5."""
    return 1 << max(streams - 1, 0).bit_length()


class _Window:
    """A (K, streams bucket)'s recent (when, tokens, step seconds) samples with their running sums: plans
    read figures several times a second, so a figure must not cost a pass over thousands of steps."""

    def __init__(self) -> None:
        self.samples: deque[tuple[float, int, float]] = deque()
        self.tokens, self.seconds = 0, 0.0

    def add(self, at: float, tokens: int, seconds: float) -> None:
        if len(self.samples) >= MAX_SAMPLES:
            self._drop()
        self.samples.append((at, tokens, seconds))
        self.tokens, self.seconds = self.tokens + tokens, self.seconds + seconds

    def drop_before(self, since: float) -> None:
        while self.samples and self.samples[0][0] < since:
            self._drop()

    def _drop(self) -> None:
        _, tokens, seconds = self.samples.popleft()
        self.tokens, self.seconds = self.tokens - tokens, self.seconds - seconds


class StepRates:
    """Recent step samples per (K, streams bucket), and the loads noted lately; thread-safe (every
    engine's reader thread records, the worker's task threads read)."""

    def __init__(self, *, fresh_s: float, min_step_seconds: float):
        """`fresh_s`: a sample older than this says little about the host now (0: keep none);
        `min_step_seconds`: step time a figure needs (a few answers' worth, not one prefill)."""
        self.fresh_s, self.min_step_seconds = fresh_s, min_step_seconds
        self._windows: dict[tuple[int, int], _Window] = {}
        self._loads: deque[tuple[float, int]] = deque(maxlen=MAX_SAMPLES)
        self._explored_at: dict[int, float] = {}  # streams bucket -> when its last exploration began
        self._lock = threading.Lock()

    def exploring(self, streams: int, *, now: float | None = None) -> bool:
        """Whether requests joining at this load should try the path not measured here: only one of the
        main alone and speculation has a figure at its bucket, and none was tried for a figure's lifetime
        (or the try began less than EXPLORE_FOR_S ago)."""
        bucket, now = streams_bucket(streams), time.monotonic() if now is None else now
        if self.fresh_s <= 0 or bucket < EXPLORE_MIN_STREAMS:
            return False
        measured = set(self.figures(now=now).get(bucket, {}))
        one_sided = bool(measured) and (0 in measured) != any(k > 0 for k in measured)
        with self._lock:
            began = self._explored_at.get(bucket)
            if began is not None and now - began < EXPLORE_FOR_S:
                return one_sided
            if one_sided and (began is None or now - began > self.fresh_s):
                self._explored_at[bucket] = now
                return True
        return False

    def note_load(self, streams: int) -> None:
        if self.fresh_s > 0:
            with self._lock:
                self._loads.append((time.monotonic(), streams))

    def recent_peak(self, *, within_s: float = LOAD_MEMORY_S) -> int:
        """The most streams noted in the last `within_s` seconds (0: none)."""
        since = time.monotonic() - within_s
        with self._lock:
            while self._loads and self._loads[0][0] < since:
                self._loads.popleft()
            return max((streams for _, streams in self._loads), default=0)

    def record(self, *, k: int, streams: int, tokens: int, seconds: float, at: float | None = None) -> None:
        if streams < 1 or seconds <= 0 or self.fresh_s <= 0:
            return
        with self._lock:
            window = self._windows.setdefault((k, streams_bucket(streams)), _Window())
            window.add(time.monotonic() if at is None else at, tokens, seconds)

    def at_load(self, streams: int, *, now: float | None = None) -> dict[int, float]:
        """{K: tokens/s} measured lately at this load's bucket, for each K with enough step time."""
        return self.figures(now=now).get(streams_bucket(streams), {})

    def figures(self, *, now: float | None = None) -> dict[int, dict[int, float]]:
        """{streams bucket: {K: tokens/s}}, where a K has enough recent step time."""
        since = (time.monotonic() if now is None else now) - self.fresh_s
        figures: dict[int, dict[int, float]] = {}
        with self._lock:
            for (k, bucket), window in self._windows.items():
                window.drop_before(since)
                if window.seconds >= self.min_step_seconds:
                    figures.setdefault(bucket, {})[k] = window.tokens / window.seconds
        return figures
