"""The engines one worker process holds, loaded on first use and kept, with each pair's load state.

openvino-genai's pipelines keep memory per request they served (docs/architecture.md, "Memory"; it is
all freed with the pipeline): an engine that has
taken `renew_after` requests is replaced by a fresh one at the next quiet moment, built in the
background, and freed once its own requests have ended. A library engine whose step process exited is
loaded again on next use. It also keeps what each pair's engines delivered lately (serving/rates.py),
for the plans of requests."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from inference.engines.devices import DeviceUnavailable, on_this_worker
from inference.engines.interface import Engine
from inference.engines.library.pipeline import LibraryEngine, StepObserver
from inference.engines.own.engine import OwnEngine
from inference.engines.spec import PairSpec
from inference.limits import LoadState, Route
from inference.serving.rates import StepRates

log = logging.getLogger(__name__)

# Building a pipeline takes the cores for seconds, and the old one then drains beside the new for an answer's
# length: renewed under a steady load it multiplies time to first token meanwhile (docs/benchmark-log.md,
# "Engine renewal at quiet moments"). So an engine due for renewal waits until the pair runs at most this
# many requests, or until it has taken twice `renew_after` (its memory keeps growing meanwhile).
RENEW_WHEN_RUNNING_AT_MOST = 1


# The engine class that serves each route: the library's pipeline (in a step process) or our exact sampler. The own
# engine's spec says Route.OWN_SPECULATIVE for both own routes (engines/spec.py): its main alone is its batch.
ENGINES: dict[Route, type[LibraryEngine] | type[OwnEngine]] = {
    Route.LIBRARY_SPECULATIVE: LibraryEngine,
    Route.PROMPT_LOOKUP: LibraryEngine,
    Route.LIBRARY_MAIN_ALONE: LibraryEngine,
    Route.OWN_SPECULATIVE: OwnEngine,
    Route.OWN_MAIN_ALONE: OwnEngine,
}


def build_engine(spec: PairSpec, *, on_step: StepObserver | None = None, step_timeout_s: float = 0) -> Engine:
    """The engine a spec's route asks for (ENGINES)."""
    engine = ENGINES[spec.route]
    if issubclass(engine, LibraryEngine):  # in a step process: its steps observed, a watchdog on them
        return engine(spec, on_step=on_step, step_timeout_s=step_timeout_s)
    return engine(spec)


class EngineRegistry:
    """The engines a worker process holds, loaded on first use and kept."""

    def __init__(self, *, renew_after: int = 0, live_figures_s: float = 0, live_figures_min_step_s: float = 2.0,
                 release_extra_after_s: float = 0, step_timeout_s: float = 0):
        self.renew_after = renew_after  # 0: never
        self.step_timeout_s = step_timeout_s  # 0: no watchdog on the step processes
        self.release_extra_after_s = release_extra_after_s  # 0: never (see release_idle_extras)
        self._last_used: dict[PairSpec, float] = {}
        self.live_figures_s, self.live_figures_min_step_s = live_figures_s, live_figures_min_step_s  # see StepRates
        self.renewed = 0
        self._renewing: set[PairSpec] = set()
        self._engines: dict[PairSpec, Engine] = {}
        self._locks: dict[PairSpec, threading.Lock] = {}
        self._guard = threading.Lock()
        self.states: dict[str, dict] = {}  # slug -> {"state": loading|available|failed, "error": str}
        self.rates: dict[str, StepRates] = {}  # slug -> tokens/s its engines delivered lately, by K and load

    def get(self, spec: PairSpec, *, loading: Callable[[], object] | None = None) -> Engine:
        """The engine of `spec`, built on first use; `loading` is called first where it is not ready (built here or
        by another thread), so an answer waiting for it can say so."""
        self._last_used[spec] = time.monotonic()
        engine = self._engines.get(spec)
        if engine and not engine.alive:  # its step process exited: load it again
            self._engines.pop(spec, None)
            engine = None
        if engine:
            if self._renewal_due(engine) and spec not in self._renewing:
                self._renewing.add(spec)
                threading.Thread(target=self._renew, args=(spec, engine), name=f"renew-{spec.slug}",
                                 daemon=True).start()
            return engine
        if loading:
            loading()
        with self._guard:
            lock = self._locks.setdefault(spec, threading.Lock())
        with lock:
            if spec in self._engines:
                return self._engines[spec]
            if spec.is_pair_default:
                self.states[spec.slug] = {"state": LoadState.LOADING, "error": ""}
            try:
                for folder in filter(None, (spec.main_dir, spec.draft_dir if spec.uses_draft else "")):
                    if not Path(folder, "openvino_model.xml").is_file():
                        raise FileNotFoundError(f"no openvino_model.xml in {folder}")
                if refusals := on_this_worker().refusals(spec.devices):
                    raise DeviceUnavailable(" ".join(refusals.values()))
                engine = self._build(spec)
            except Exception as exc:
                if spec.is_pair_default:
                    self.states[spec.slug] = {"state": LoadState.FAILED, "error": f"{type(exc).__name__}: {exc}"}
                raise
            self._engines[spec] = engine
            self._retire_replaced(spec)
            if spec.is_pair_default:
                self.states[spec.slug] = {"state": LoadState.AVAILABLE, "error": ""}
            return engine

    def _renewal_due(self, engine: Engine) -> bool:
        if not self.renew_after or engine.submitted < self.renew_after:
            return False
        quiet = self.active_requests(slug=engine.spec.slug) <= RENEW_WHEN_RUNNING_AT_MOST
        return quiet or engine.submitted >= 2 * self.renew_after

    def _build(self, spec: PairSpec) -> Engine:
        return build_engine(spec, on_step=self._record_step, step_timeout_s=self.step_timeout_s)

    def _record_step(self, engine: LibraryEngine, k: int, streams: int, tokens: int, seconds: float) -> None:
        if self.active_requests(slug=engine.spec.slug) > engine.active_count:
            return  # another of the pair's pipelines runs beside it: the two contend for the cores
        self.rates_of(engine.spec.slug).record(k=k, streams=streams, tokens=tokens, seconds=seconds)

    def rates_of(self, slug: str) -> StepRates:
        return self.rates.setdefault(slug, StepRates(fresh_s=self.live_figures_s,
                                                     min_step_seconds=self.live_figures_min_step_s))

    def _renew(self, spec: PairSpec, old: Engine) -> None:
        try:
            fresh = self._build(spec)
            if self._engines.get(spec) is old:
                self._engines[spec] = fresh
                self.renewed += 1
                old.close()  # its requests in flight finish first
            else:
                fresh.close()  # the pair was edited or unloaded meanwhile
        finally:
            self._renewing.discard(spec)

    def _retire_replaced(self, spec: PairSpec) -> None:
        """An edited pair loads a new engine: the one it replaces is freed once its requests end."""
        for stale in [s for s in self._engines if s.role == spec.role and s != spec]:
            if stale.devices != spec.devices:
                self.rates.pop(spec.slug, None)  # figures measured on other devices say nothing of these
            self._engines.pop(stale).close()

    def release_idle_extras(self) -> list[PairSpec]:
        """Free a pair's extra engines (its main alone, its own engine) once idle for `release_extra_after_s`:
        each holds another copy of the main's weights (2.2 GB for Qwen2.5-Coder-1.5B in int8), which a worker
        keeps only while requests need it. The pair's default engine stays."""
        if not self.release_extra_after_s:
            return []
        idle_since = time.monotonic() - self.release_extra_after_s

        def idle(spec: PairSpec, engine: Engine) -> bool:
            return (not spec.is_pair_default and not engine.active_count
                    and self._last_used.get(spec, 0) < idle_since and spec not in self._renewing)

        released = []
        for spec, engine in list(self._engines.items()):
            if not idle(spec, engine):
                continue
            with self._guard:
                lock = self._locks.setdefault(spec, threading.Lock())
            with lock:  # asked again: a request may have taken it since the first look
                if self._engines.get(spec) is engine and idle(spec, engine):
                    self._engines.pop(spec).close()
                    released.append(spec)
        if released:
            log.info("freed idle engines (slug, role): %s", [spec.role for spec in released])
        return released

    def loaded(self) -> list[dict]:
        return [{"slug": s.slug, "route": s.route,
                 "inference_precision": s.inference_precision, "kv_cache_precision": s.kv_cache_precision,
                 "dynamic_quantization": s.dynamic_quantization} for s in self._engines]

    def prefix_cache_bytes(self) -> dict[str, int]:
        """Slug -> the bytes its engines hold cached for prompts to come (the own engine's pools, main and draft)."""
        return self._own_pools(lambda engine: engine.cached_bytes)

    def kv_blocks_held(self) -> dict[str, int]:
        """Slug -> the KV blocks its running answers hold (the own engine's pools): 0 once they have all ended."""
        return self._own_pools(lambda engine: engine.held_blocks)

    def main_blocks(self) -> dict[str, tuple[int, list[bytes]]]:
        """Slug -> the block size of its own engine's main and the hashes of the blocks that main's pool holds: what
        the worker publishes so that a conversation's turns come back to it (serving/routing.py)."""
        held: dict[str, tuple[int, list[bytes]]] = {}
        for spec, engine in list(self._engines.items()):
            if isinstance(engine, OwnEngine):
                pool = engine.main.pool
                held[spec.slug] = (pool.block_tokens, [*held.get(spec.slug, (0, []))[1], *pool.cached_hashes()])
        return held

    def _own_pools(self, read: Callable[[OwnEngine], int]) -> dict[str, int]:
        """Slug -> `read` summed over the pair's own engines."""
        summed: dict[str, int] = {}
        for spec, engine in list(self._engines.items()):
            if isinstance(engine, OwnEngine):
                summed[spec.slug] = summed.get(spec.slug, 0) + read(engine)
        return summed

    def unload(self, slug: str) -> None:
        for spec in [s for s in self._engines if s.slug == slug]:
            self._engines.pop(spec).close()  # requests in flight finish first
        self.states.pop(slug, None)

    def note_answers_elsewhere(self, answers: int) -> None:
        """What the other workers on this host run now: the own engines weigh it before letting an answer speculate
        on its own (OwnEngine.beyond_speculating_streams)."""
        for engine in list(self._engines.values()):
            if isinstance(engine, OwnEngine):
                engine.answers_elsewhere = answers

    def active_requests(self, *, slug: str = "", speculative: bool | None = None) -> int:
        """Requests running in this process, for one pair or all: in all its engines, or (`speculative`
        True / False) in the library's speculative pipeline / its main alone."""
        return sum(engine.active_count for spec, engine in self._engines.items()
                   if (not slug or spec.slug == slug)
                   and (speculative is None or (not spec.route.is_own_engine()
                                                and spec.route.speculates() == speculative)))
