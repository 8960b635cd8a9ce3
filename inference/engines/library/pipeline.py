"""The library engine: one openvino-genai ContinuousBatchingPipeline per pair, in a step process of its own.

openvino-genai's `step()` must be driven by a single thread and its Python binding holds the GIL for
the whole step (tens of ms on a large main). In the worker's process that stalls every other thread
for a step at a time: the thread that writes a generation's tokens to Redis waits a step for each
round trip, and the stack's time to first token grew by a step or two. So the pipeline lives in a
child process (the step process) that does nothing but step it; the worker keeps a `LibraryEngine` proxy
with the same interface. Concurrent generations join the same batch through `add` messages; after
each step the step process sends every request the tokens it accepted in that step (with a draft:
the accepted draft run plus the main model's own token) in one message, with the step's duration
(the worker's live figures of what each K delivers, serving/rates.py, come from it).

The step process ends with its pipeline: when it is closed and drained, or when the worker exits or
is killed (its end of the socket closes; the step process checks it before every step).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection

import numpy as np
import openvino as ov
import openvino_genai as og

from inference.engines.decoding import DecodingParams
from inference.engines.interface import ActiveRequest, Finished, StepTokens
from inference.engines.library.config import generation_config
from inference.engines.pages import RELEASE_EVERY_S, release_weight_pages
from inference.engines.spec import PairSpec
from inference.engines.tokenizer import load_tokenizer, prompt_token_ids
from inference.limits import FinishReason

log = logging.getLogger(__name__)
LOAD_TIMEOUT_S = 600
HUNG_ENGINE = "made no step"  # in the error of the answers a step watchdog failed
WATCH_EVERY_S = 1.0  # how often the reader looks for a stalled step process
PREFILL_TOKENS_PER_BUDGET = 512  # each this many prompt tokens waiting for their prefill add one step budget


def build_pipeline(spec: PairSpec) -> og.ContinuousBatchingPipeline:
    scheduler = og.SchedulerConfig()
    scheduler.cache_size = spec.cache_size_gb
    scheduler.dynamic_split_fuse = not spec.prefill_first
    # A conversation's next turn, or a prompt starting as an earlier one, reads only what the pipeline's KV blocks
    # lack, as on the own engine (own/block_pool.py); within cache_size_gb; off where the spec says (the one-turn
    # benchmarks' lines, every prompt read whole). The main alone's only: with a draft, openvino-genai 2026.4 fails a
    # prompt asked again ("content_length <= prompt_ids.size()", sequence_group.cpp).
    scheduler.enable_prefix_caching = spec.prefix_caching and not (spec.uses_draft or spec.uses_prompt_lookup)
    budget = spec.step_budget  # reads the model's config.json
    if budget:
        scheduler.max_num_batched_tokens = budget
        # the library requires max_num_seqs <= max_num_batched_tokens
        scheduler.max_num_seqs = min(scheduler.max_num_seqs, budget)
    props: dict = spec.device_properties(device=spec.device)
    if spec.uses_draft:
        props["draft_model"] = og.draft_model(spec.draft_dir, spec.draft_runs_on,
                                              **spec.device_properties(device=spec.draft_runs_on))
    elif spec.uses_prompt_lookup:
        props["prompt_lookup"] = True
    return og.ContinuousBatchingPipeline(spec.main_dir, scheduler, spec.device, props)


class EngineProcessError(RuntimeError):
    """The step process could not load the pipeline, or exited."""


StepObserver = Callable[["LibraryEngine", int, int, int, float], object]  # (engine, K, streams, tokens, seconds)


class LibraryEngine:
    """The worker's handle on a step process: submit() returns an ActiveRequest fed one StepTokens per
    main step, then Finished, by a reader thread that takes the step process's messages. `on_step`
    hears of each step whose requests all share one K (0 on the main alone)."""

    def __init__(self, spec: PairSpec, *, on_step: StepObserver | None = None, step_timeout_s: float = 0):
        self.spec, self.on_step = spec, on_step
        self.step_timeout_s = step_timeout_s  # 0: no watchdog (see _stalled)
        self._progress_at = time.monotonic()  # the last step, or the submit that woke an idle engine
        self._stalled_for = 0.0
        started = time.perf_counter()
        # A new interpreter, not fork (the worker runs threads) nor multiprocessing's spawn (it re-runs the
        # caller's __main__, which breaks unguarded scripts): `python -m inference.engines.library.pipeline FD`.
        ours, theirs = socket.socketpair()
        self._process = subprocess.Popen([sys.executable, "-m", __name__, str(theirs.fileno())],
                                         pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        theirs.close()
        self._conn = Connection(ours.detach())
        self._conn.send(spec)
        try:
            if not self._conn.poll(LOAD_TIMEOUT_S):
                raise EngineProcessError(f"loading took more than {LOAD_TIMEOUT_S} s")
            kind, detail = self._conn.recv()
        except EOFError:
            kind, detail = "failed", f"the step process exited while loading (exit code {self._process.poll()})"
        if kind != "ready":
            self._process.kill()
            self._conn.close()
            raise EngineProcessError(detail)
        self.load_seconds = time.perf_counter() - started
        self.tokenizer = load_tokenizer(spec.main_dir)
        self._send_lock = threading.Lock()
        self._active: dict[int, ActiveRequest] = {}
        self._k: dict[int, int | None] = {}  # request id -> its K (0: no draft; None: a confidence threshold)
        self._decoding: set[int] = set()  # requests past their prefill
        self._ids = itertools.count()
        self.submitted = 0  # requests taken: the registry renews an engine after many (see EngineRegistry)
        self._closed = False
        self._reader = threading.Thread(target=self._read_steps, name=f"steps-{spec.slug}", daemon=True)
        self._reader.start()
        log.info("loaded %s (%s) in %.1f s, step process %s", spec.slug, spec.route,
                 self.load_seconds, self._process.pid)

    @property
    def active_count(self) -> int:
        return len(self._active)

    @property
    def alive(self) -> bool:
        return self._reader.is_alive()

    def submit(self, *, prompt: str = "", params: DecodingParams, add_special_tokens: bool = True,
               prompt_ids: list[int] | None = None) -> ActiveRequest:
        """Add a request to the batch (its tokens come in its `events`, read by its owner)."""
        prompt_ids = prompt_token_ids(self.tokenizer, prompt=prompt, add_special_tokens=add_special_tokens,
                                      prompt_ids=prompt_ids)
        request_id = next(self._ids)
        request = ActiveRequest(request_id, prompt_ids, time.perf_counter(),
                                on_stop=lambda: self._send(("stop", request_id)))
        self.submitted += 1
        if not self._active:
            self._progress_at = time.monotonic()  # idle time is not a stall
        self._active[request_id] = request
        speculation = params.speculation if self.spec.uses_draft else None
        self._k[request_id] = speculation.k if speculation else 0
        try:
            self._send(("add", request_id, prompt_ids, params))
        except (OSError, EOFError) as exc:
            self._active.pop(request_id, None)
            self._k.pop(request_id, None)
            raise EngineProcessError(f"the step process of {self.spec.slug} is gone") from exc
        return request

    def close(self) -> None:
        """End the step process once no request is left in it (frees the pipeline and all its memory)."""
        self._closed = True
        with contextlib.suppress(OSError, EOFError):  # already gone
            self._send(("close",))

    def _send(self, message: tuple) -> None:
        with self._send_lock:
            self._conn.send(message)

    def _read_steps(self) -> None:
        while True:
            try:
                if not self._conn.poll(WATCH_EVERY_S):
                    if self._stalled():
                        self._process.kill()  # its requests end below, as for any exit; the registry reloads it
                    continue
                _, at, seconds, outputs = self._conn.recv()  # ("step", when, took, [(id, tokens, logprobs, finished)])
            except (EOFError, OSError):
                break
            self._progress_at = time.monotonic()
            self._observe(outputs, seconds)
            for request_id, token_ids, logprobs, finished in outputs:
                request = self._active.get(request_id)
                if request is None:
                    continue
                if token_ids:
                    request.events.put(StepTokens(token_ids, at, logprobs))
                if finished:
                    self._active.pop(request_id, None)
                    self._k.pop(request_id, None)
                    self._decoding.discard(request_id)
                    request.events.put(Finished(FinishReason(finished[0]), finished[1]))
        try:
            code = self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            code = self._process.wait()
        self._conn.close()
        if not self._closed or self._active:
            log.error("the step process of %s exited (code %s)", self.spec.slug, code)
        reason = (f"the engine {HUNG_ENGINE} in {self._stalled_for:.0f} s and was restarted" if self._stalled_for
                  else f"the engine process exited (code {code})")
        for request in list(self._active.values()):
            request.events.put(Finished(FinishReason.ERROR, reason))
        self._active.clear()

    def _stalled(self) -> bool:
        """Requests wait and the step process, alive or not, sent no step within its budget: a hung step
        would hold them (and their slots) forever. Prompts still to prefill widen the budget, since a
        long prompt's prefill is one step."""
        if not self.step_timeout_s or not self._active:
            return False
        prefilling = sum(r.prompt_tokens for i, r in list(self._active.items()) if i not in self._decoding)
        budget = self.step_timeout_s * (1 + prefilling / PREFILL_TOKENS_PER_BUDGET)
        waited = time.monotonic() - self._progress_at
        if waited <= budget:
            return False
        log.error("the step process of %s made no step in %.0f s (budget %.0f s): killing it", self.spec.slug,
                  waited, budget)
        self._stalled_for = waited
        return True

    def _observe(self, outputs: list, seconds: float) -> None:
        """Tell `on_step` of a decoding step: one where every request was past its prefill and got tokens
        (prefills cost both paths alike, and a burst's would swing the figures while it arrives)."""
        ks = {self._k.get(request_id) for request_id, *_ in outputs}
        k = ks.pop() if len(ks) == 1 else None
        decoding = all(request_id in self._decoding and tokens for request_id, tokens, *_ in outputs)
        self._decoding.update(request_id for request_id, tokens, *_ in outputs if tokens)
        if self.on_step and seconds > 0 and k is not None and decoding:
            self.on_step(self, k, len(outputs), sum(len(tokens) for _, tokens, *_ in outputs), seconds)


def _step_process(conn: Connection) -> None:
    spec: PairSpec = conn.recv()
    try:
        pipe = build_pipeline(spec)
    except Exception as exc:
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", ""))
    Stepper(pipe, spec, conn).run()


class Stepper:
    """The step process's loop: take the worker's messages, step, send each request what it got."""

    def __init__(self, pipe: og.ContinuousBatchingPipeline, spec: PairSpec, conn: Connection):
        self.pipe, self.spec, self.conn = pipe, spec, conn
        self.handles: dict[int, og.GenerationHandle] = {}  # a handle's destructor cancels its request: keep it
        self.finish_reasons: dict[int, FinishReason] = {}
        self.with_logprobs: set[int] = set()  # requests that asked for their tokens' log probabilities
        self.stopping: set[int] = set()
        self.closing = False
        self.released, self.stepped_since_release = time.monotonic(), False  # see engines/pages.py

    def run(self) -> None:
        while True:
            if self.closing and not self.handles:
                return
            if self.stepped_since_release and (not self.handles or time.monotonic() - self.released > RELEASE_EVERY_S):
                release_weight_pages()
                self.released, self.stepped_since_release = time.monotonic(), False
            try:
                wait = None if not self.handles else 0  # idle: sleep until the worker sends something
                while self.conn.poll(wait):
                    self._take(self.conn.recv())
                    wait = 0
            except (EOFError, OSError):
                return  # the worker is gone
            if not self.handles:
                continue
            started = time.perf_counter()
            try:
                self.pipe.step()
            except Exception as exc:  # a failed step fails the requests in it, not the engine
                log.exception("step failed for %s", self.spec.slug)
                error = (FinishReason.ERROR, f"{type(exc).__name__}: {exc}")
                self._send_step([(rid, [], None, error) for rid in self.handles])
                self.handles.clear()
                self.finish_reasons.clear()
                self.with_logprobs.clear()
                self.stopping.clear()
                continue
            took = time.perf_counter() - started
            self.stepped_since_release = True
            self._send_step([self._collect(rid) for rid in list(self.handles)], seconds=took)

    def _send_step(self, outputs: list, *, seconds: float = 0.0) -> None:
        self.conn.send(("step", time.perf_counter(), seconds, outputs))

    def _take(self, message: tuple) -> None:
        kind, *args = message
        if kind == "add":
            request_id, prompt_ids, params = args
            input_ids = ov.Tensor(np.array([prompt_ids], dtype=np.int64), shared_memory=False)
            try:
                self.handles[request_id] = self.pipe.add_request(request_id, input_ids,
                                                                 generation_config(params, self.spec))
            except Exception as exc:  # the request's settings, not the engine: fail this request only
                self._send_step([(request_id, [], None, (FinishReason.ERROR, f"{type(exc).__name__}: {exc}"))])
                return
            if params.logprobs:
                self.with_logprobs.add(request_id)
        elif kind == "stop" and args[0] in self.handles and args[0] not in self.stopping:
            self.handles[args[0]].stop()
            self.stopping.add(args[0])
        elif kind == "close":
            self.closing = True

    def _collect(self, request_id: int) -> tuple[int, list[int], list[float] | None, tuple[str, str] | None]:
        handle = self.handles[request_id]
        token_ids: list[int] = []
        logprobs: list[float] | None = [] if request_id in self.with_logprobs else None
        if handle.can_read():
            for output in handle.read().values():
                token_ids += list(output.generated_ids)
                if logprobs is not None:
                    logprobs += list(output.generated_log_probs)
                if output.finish_reason == og.GenerationFinishReason.LENGTH:
                    self.finish_reasons[request_id] = FinishReason.LENGTH
                elif output.finish_reason == og.GenerationFinishReason.STOP:
                    self.finish_reasons[request_id] = FinishReason.STOP
        status = handle.get_status()
        if status == og.GenerationStatus.RUNNING:
            return request_id, token_ids, logprobs, None
        del self.handles[request_id]
        self.with_logprobs.discard(request_id)
        reason = self.finish_reasons.pop(request_id, FinishReason.STOP)
        if status in (og.GenerationStatus.STOP, og.GenerationStatus.CANCEL) or request_id in self.stopping:
            finished = (FinishReason.STOPPED, "")
        elif status == og.GenerationStatus.FINISHED:
            finished = (reason, "")
        else:
            finished = (FinishReason.ERROR, f"the pipeline dropped the request ({status.name})")
        self.stopping.discard(request_id)
        return request_id, token_ids, logprobs, finished


if __name__ == "__main__":
    # A service stopped (systemd, `docker compose stop`) or Ctrl+C signals the worker's whole process group. The
    # worker shuts down warm, letting its answers finish, and this process must live as long: it ends when the
    # worker closes its socket, or by the SIGKILL of a hung step's watchdog.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _step_process(Connection(int(sys.argv[1])))
