"""The library engine: one openvino-genai ContinuousBatchingPipeline per pair, stepped by one thread.

openvino-genai's `step()` must be driven by a single thread and holds the GIL while it runs, so a
worker process keeps one pipeline per pair and one thread that steps it; concurrent generations
join the same batch through `add_request` (thread-safe). Each step hands every request the tokens
it accepted in that step: with a draft, the accepted draft run plus the main model's own token.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable

import openvino_genai as og

from inference.engines.base import ActiveRequest, DecodingParams, Finished, PairSpec, StepTokens

log = logging.getLogger(__name__)


def build_pipeline(spec: PairSpec) -> og.ContinuousBatchingPipeline:
    scheduler = og.SchedulerConfig()
    scheduler.cache_size = spec.cache_size_gb
    props: dict = dict(spec.device_properties())
    if spec.uses_draft:
        props["draft_model"] = og.draft_model(spec.draft_dir, spec.device, **spec.device_properties())
    elif spec.uses_prompt_lookup:
        props["prompt_lookup"] = True
    return og.ContinuousBatchingPipeline(spec.main_dir, scheduler, spec.device, props)


class PairEngine:
    def __init__(self, spec: PairSpec):
        self.spec = spec
        started = time.perf_counter()
        self.pipe = build_pipeline(spec)
        self.load_seconds = time.perf_counter() - started
        self.tokenizer = self.pipe.get_tokenizer()
        self._cv = threading.Condition()
        self._active: dict[int, ActiveRequest] = {}
        self._ids = itertools.count()
        self.submitted = 0  # requests taken: the registry renews an engine after many (see EngineRegistry)
        self._closed = False
        self._thread = self._start_stepping()
        log.info("loaded %s (speculative=%s) in %.1f s", spec.slug, spec.speculative, self.load_seconds)

    @property
    def active_count(self) -> int:
        return len(self._active)

    def submit(self, *, prompt: str, params: DecodingParams, add_special_tokens: bool = True,
               before_batch: Callable[[int], object] | None = None) -> ActiveRequest:
        """Add a request to the batch. `before_batch(prompt_tokens)` runs first: once the request is
        in, step() holds the GIL and I/O from other threads (a Redis write) waits tens of ms."""
        input_ids = self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens).input_ids
        if before_batch:
            before_batch(int(input_ids.shape[1]))
        request_id = next(self._ids)
        self.submitted += 1
        config = params.generation_config(self.spec)
        with self._cv:
            handle = self.pipe.add_request(request_id, input_ids, config)
            request = ActiveRequest(request_id, handle, int(input_ids.shape[1]), time.perf_counter())
            self._active[request_id] = request
            if not self._thread.is_alive():  # closed and drained just before this request came: step it too
                self._thread = self._start_stepping()
            self._cv.notify()
        return request

    def _start_stepping(self) -> threading.Thread:
        thread = threading.Thread(target=self._step_forever, name=f"step-{self.spec.slug}", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        """End the step thread once no request is left, so the pipeline can be freed."""
        with self._cv:
            self._closed = True
            self._cv.notify()

    def _step_forever(self) -> None:
        while True:
            with self._cv:
                while not self._active and not self._closed:
                    self._cv.wait()
                if not self._active:
                    return
                batch = list(self._active.values())
            for request in batch:
                if request.stop_requested and not request.stop_sent:
                    request.handle.stop()
                    request.stop_sent = True
            try:
                self.pipe.step()
            except Exception as exc:  # a failed step fails the requests in it, not the worker
                log.exception("step failed for %s", self.spec.slug)
                for request in batch:
                    self._finish(request, Finished("error", f"{type(exc).__name__}: {exc}"))
                continue
            now = time.perf_counter()
            for request in batch:
                self._collect(request, now)
            # step() keeps the GIL for its whole run: hand it over so the threads that stream the
            # tokens just delivered run now, not after the next step.
            time.sleep(0)

    def _collect(self, request: ActiveRequest, now: float) -> None:
        if request.handle.can_read():
            for output in request.handle.read().values():
                if output.generated_ids:
                    request.events.put(StepTokens(list(output.generated_ids), now))
                if output.finish_reason == og.GenerationFinishReason.LENGTH:
                    request.finish_reason = "length"
                elif output.finish_reason == og.GenerationFinishReason.STOP:
                    request.finish_reason = "stop"
        status = request.handle.get_status()
        if status == og.GenerationStatus.RUNNING:
            return
        if status in (og.GenerationStatus.STOP, og.GenerationStatus.CANCEL) or request.stop_sent:
            self._finish(request, Finished("stopped"))
        elif status == og.GenerationStatus.FINISHED:
            self._finish(request, Finished(request.finish_reason or "stop"))
        else:
            self._finish(request, Finished("error", f"the pipeline dropped the request ({status.name})"))

    def _finish(self, request: ActiveRequest, finished: Finished) -> None:
        with self._cv:
            if self._active.pop(request.request_id, None) is None:
                return
        request.events.put(finished)
        request.handle = None
