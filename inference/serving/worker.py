"""The worker side of a generation, run in the Celery worker process: load the pair's engine, run a
queued generation on it, stream its steps to the generation's Redis Stream and write the record.
The module state (the engines this process holds, the requests it runs) lives here only."""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace

from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone

from inference import selectors, transport
from inference.engines.decoding import DecodingParams
from inference.engines.interface import ActiveRequest, Engine, Finished, JoinedBatch, LeftBatch, PromptRead, StepTokens
from inference.engines.speculation_stats import SpeculationStats
from inference.engines.text_assembler import TextAssembler
from inference.limits import FinishReason, Route, SpeculativeMode
from inference.metrics import record_generation
from inference.models import Generation, ModelPair
from inference.serving import calibrated, planning, repetition, routing
from inference.serving.host import this_host
from inference.serving.planning import handover
from inference.serving.reasons import Reason, Why
from inference.serving.records import (
    NOT_SAVED,
    fail_generation,
    finish_generation,
    pair_spec,
    planned_decoding,
)
from inference.serving.registry import EngineRegistry

log = logging.getLogger(__name__)
WORKER_NAME = f"{socket.gethostname()}:{os.getpid()}"  # in heartbeats and on the records this process runs


@dataclass
class WorkerState:
    """All this worker process holds, in one place: its engines, the request each running answer has in
    them, and the generations its threads claimed. Made when the worker imports this module (the web
    never does)."""

    engines: EngineRegistry
    running: dict[str, ActiveRequest] = field(default_factory=dict)  # generation id -> its request
    submitting: dict[str, float] = field(default_factory=dict)  # generation id -> when it was handed to its engine
    claimed: set[str] = field(default_factory=set)  # held by a thread of this worker, from claim to end
    stopping: bool = False  # asked to stop (SIGTERM): what it has not started goes back to the shared queue
    # {slug: the K a lone answer is planned with here}, as the housekeeping last read it: the heartbeat reads no
    # database (lifecycle.py)
    lone_k: dict[str, int | None] = field(default_factory=dict)
    _claiming: threading.Lock = field(default_factory=threading.Lock)

    def claim(self, generation_id: str) -> bool:
        """Hold the generation for the calling thread; False if another thread of this worker holds it. A second
        delivery of one generation must not serve it again, nor, ending, drop the claim the first still needs: the
        heartbeat's reconcile would fail the answer under way ("could not be saved")."""
        with self._claiming:
            if generation_id in self.claimed:
                return False
            self.claimed.add(generation_id)
            return True


STATE = WorkerState(engines=EngineRegistry(
    renew_after=settings.ENGINE_RENEW_AFTER_REQUESTS, live_figures_s=settings.LIVE_FIGURES_S,
    live_figures_min_step_s=settings.LIVE_FIGURES_MIN_STEP_MS / 1000,
    release_extra_after_s=settings.RELEASE_EXTRA_ENGINES_AFTER_S, step_timeout_s=settings.STEP_TIMEOUT_S))

OVERRAN = "The answer ran past the server's limit of {limit} s and was stopped; what it wrote is kept."
NEVER_STARTED = ("The worker's engine did not take this answer within the server's limit of {limit} s (it may be "
                 "hung); send it again.")
NOT_STOPPED = "The answer ran past the server's limit of {limit} s and its worker could not stop it; send it again."
WORKER_FAILED = "The worker failed while writing this answer (the details are in its log); send it again."
# A recorded request's decoding fields the worker reads back (the plan adds how it speculates)
RECORDED_DECODING = {each.name for each in fields(DecodingParams)} - {"speculation"}


def host_figures(*, pair: ModelPair) -> planning.HostFigures:
    """What the pair measured on this worker's host (serving/calibrated.py)."""
    return calibrated.host_figures(pair=pair, host=this_host(pair.runs_on))


def load_engine(*, pair: ModelPair, route: Route, figures: planning.HostFigures | None = None,
                loading: Callable[[], object] | None = None) -> Engine:
    """This worker's engine for the pair's route, loaded on first use, in the precision the host's calibration
    chose; the last load result is kept on the pair. `loading`: called first if it is not loaded yet."""
    try:
        figures = figures or host_figures(pair=pair)
        engine = STATE.engines.get(pair_spec(pair=pair, route=route, calibration=figures), loading=loading)
    except Exception as exc:
        ModelPair.objects.filter(id=pair.id).update(load_error=f"{type(exc).__name__}: {exc}",
                                                    load_reported_at=timezone.now())
        raise
    if pair.load_error:
        ModelPair.objects.filter(id=pair.id).update(load_error="", load_reported_at=timezone.now())
    return engine


def run_generation(*, generation_id: str, worker_name: str) -> None:
    generation = Generation.objects.select_related("pair").filter(id=generation_id).first()
    if generation is None or generation.status != Generation.Status.QUEUED:
        return  # a replayed delivery of a generation that already ran
    if STATE.stopping:  # its engine may be gone with this process's group: another worker serves it
        log.info("stopping: generation %s goes back to the queue of %s", generation_id, generation.pair.slug)
        routing.send_to_shared_queue(generation_id=generation.id, pair_queue=generation.pair.queue)
        return
    # Held before the row says so: the heartbeat's reconcile fails a running row that no thread holds.
    if not STATE.claim(str(generation.id)):
        return  # a second delivery (a stopping worker's hand-back beside the web's re-route): another thread has it
    try:
        _claimed(generation=generation, worker_name=worker_name)
    finally:
        STATE.claimed.discard(str(generation.id))


def _claimed(*, generation: Generation, worker_name: str) -> None:
    """The generation, held by this thread: planned, its row written running, served (a duplicate plans nothing)."""
    asked = replace(planning.Asked(**generation.params.get("asked", {})), prompt_tokens=generation.prompt_tokens)
    load, slug = current_load(pair=generation.pair), generation.pair.slug
    figures = host_figures(pair=generation.pair)
    planned = planning.plan(
        pair=generation.pair, asked=asked,
        load=planning.Load(streams=load,
                              running_speculative=STATE.engines.active_requests(slug=slug, speculative=True),
                              running_alone=STATE.engines.active_requests(slug=slug, speculative=False)),
        live=planning.live_figures(STATE.engines.rates_of(slug), asked=asked, load=load), calibration=figures)
    # One write claims the generation and records its plan (each write before the first token delays it).
    if Generation.objects.filter(id=generation.id, status=Generation.Status.QUEUED).update(
            status=Generation.Status.RUNNING, worker=worker_name, started_at=timezone.now(),
            **_plan_fields(generation=generation, planned=planned)):
        _serve(generation=generation, asked=asked, planned=planned, worker_name=worker_name, figures=figures)


def _serve(*, generation: Generation, asked: planning.Asked, planned: planning.Plan, worker_name: str,
           figures: planning.HostFigures) -> None:
    writer = transport.StreamWriter(transport.sync_client(), generation.id)
    try:  # a pair loading (a worker just started, or one idle a while) says so, not a blank wait
        engine = load_engine(pair=generation.pair, route=planned.route, figures=figures,
                             loading=lambda: writer.send({"type": "loading"}))
    except Exception:  # the details (paths, the library's words) go to the log and the pair's admin page
        log.exception("pair %s failed to load for generation %s", generation.pair.slug, generation.id)
        fail_generation(generation_id=generation.id,
                        message=f"Pair '{generation.pair.slug}' failed to load on its worker: an admin can see why "
                                "on the pair's page.")
        return
    # the plan sets how it speculates; a record queued before an upgrade may hold fields since gone
    decoding = {name: value for name, value in generation.params["decoding"].items() if name in RECORDED_DECODING}
    params = planned_decoding(DecodingParams(**{**decoding, "stop": tuple(decoding["stop"])}), planned)
    request = None
    STATE.submitting[str(generation.id)] = time.perf_counter()
    try:
        # The web encoded the prompt when it checked its length; a record older than that is encoded here.
        request = engine.submit(prompt=generation.prompt, prompt_ids=generation.params.get("prompt_ids"),
                                params=params, add_special_tokens=generation.params.get("add_special_tokens", True))
        STATE.running[str(generation.id)] = request
        # Written while the prompt is prefilled: only this thread writes the stream, so it precedes every delta.
        writer.send({"type": "start", "prompt_tokens": request.prompt_tokens, "worker": worker_name,
                     **_served(generation)})
        answer = Answer(generation=generation, writer=writer, params=params, asked=asked, planned=planned,
                        engine=engine, request=request)
        request = None  # the answer owns it (and any engine it is handed over to) from here
        answer.run()
    except Exception:  # whatever went wrong, the reader gets an error instead of waiting forever
        log.exception("generation %s failed", generation.id)
        running = STATE.running.get(str(generation.id)) or request
        if running is not None:
            running.stop()
        fail_generation(generation_id=generation.id, message=WORKER_FAILED)
    finally:
        STATE.running.pop(str(generation.id), None)
        STATE.submitting.pop(str(generation.id), None)


def _plan_fields(*, generation: Generation, planned: planning.Plan) -> dict:
    """The plan as the generation records it (also on the instance, for the events that carry it)."""
    limit = Generation._meta.get_field("speculative_reason").max_length or 0
    reason = planned.reason if len(planned.reason) <= limit else planned.reason[:limit - 1] + "…"  # handovers add up
    fields = {"speculative_mode": planned.mode, "speculative_reason": reason, "speculative_k": planned.k,
              "speculative_route": planned.route, "speculative_reason_codes": list(planned.reasons)}
    for name, value in fields.items():
        setattr(generation, name, value)
    return fields


def _record_plan(*, generation: Generation, planned: planning.Plan) -> None:
    Generation.objects.filter(id=generation.id).update(**_plan_fields(generation=generation, planned=planned))


def current_load(*, pair: ModelPair) -> int:
    """Streams a request joining now shares this worker with: those it runs, or, when a burst arrives,
    the pair's generations in flight (queued ones included) spread over the workers serving it, or the
    most it ran in the last seconds (with live figures on); a burst's first requests would otherwise
    plan for a load that is about to come. Chats' titles do not count (selectors.answers_in_flight): the
    own engine puts an answer in its batch while one is written, and lets it out once it is done."""
    in_flight, titles_here = selectors.answers_in_flight(pair=pair, worker=WORKER_NAME)
    running_here = max(STATE.engines.active_requests(slug=pair.slug) - titles_here, 0) + 1
    serving = selectors.pair_state(pair=pair, workers=selectors.live_workers(client=transport.sync_client())).workers
    load = max(running_here, -(-in_flight // max(len(serving), 1)))
    rates = STATE.engines.rates_of(pair.slug)
    rates.note_load(load)
    return max(load, rates.recent_peak())


def publish_held_blocks(*, client, slug: str | None = None) -> None:
    """Say which of the mains' blocks this worker holds (one pair's, or all), for the web side's routing. Never
    raises: an answer must not fail for it (the heartbeat says it again)."""
    try:
        for held_slug, (_, hashes) in STATE.engines.main_blocks().items():
            if slug in (None, held_slug):
                routing.publish_held(client, worker=WORKER_NAME, slug=held_slug, hashes=hashes,
                                     ttl_s=settings.WORKER_HEARTBEAT_TTL_S)
    except Exception:
        log.exception("could not publish the blocks this worker holds")


def stop_running(*, generation_id: str) -> None:
    """A cancel published by the web side: the step thread stops the request before its next step."""
    request = STATE.running.get(generation_id)
    if request is not None:
        request.stop()


REPLAN_EVERY_S = 0.2  # how often a running answer asks whether to move to another engine
OVERRUN_GRACE_S = 10  # an answer past settings.MAX_ANSWER_S whose engine has not stopped it ends anyway


def _fixed_k(engine: Engine, params: DecodingParams) -> int | None:
    """The K every step of the answer drafts, for its figures (None: the main alone, or a threshold)."""
    if not (engine.spec.uses_draft or engine.spec.uses_prompt_lookup) or params.speculation is None:
        return None
    return params.speculation.k


def _scored(engine: Engine, item: StepTokens) -> list[list]:
    """[text, logprob] per token, and [[text, logprob], ...] of its alternatives when the request asked."""
    decode = engine.tokenizer.decode
    scored: list[list] = [[decode([token]), logprob]
                          for token, logprob in zip(item.token_ids, item.logprobs or [], strict=True)]
    for entry, alternatives in zip(scored, item.alternatives or [], strict=False):
        entry.append([[decode([token]), logprob] for token, logprob in alternatives])
    return scored


class Answer:
    """One generation being streamed: its request's steps go to the generation's Redis Stream (batched
    for STREAM_FLUSH_MS), its record is written at the end. While it runs, it may be handed over to
    another engine of the pair when the load changes (serving/planning/handover.py): the request there goes on
    from the prompt and the tokens so far, and the reader sees one answer."""

    def __init__(self, *, generation: Generation, writer: transport.StreamWriter, params: DecodingParams,
                 asked: planning.Asked, planned: planning.Plan, engine: Engine,
                 request: ActiveRequest):
        self.generation, self.writer, self.params = generation, writer, params
        self.asked, self.planned, self.engine, self.request = asked, planned, engine, request
        self.prompt_ids, self.started_at = request.prompt_ids, request.added_at
        self.stats = SpeculationStats(num_assistant_tokens=_fixed_k(engine, params),
                                      speculative=(engine.spec.uses_draft or engine.spec.uses_prompt_lookup)
                                      and params.speculation is not None,
                                      max_new_tokens=params.max_new_tokens, drafter=engine.spec.drafter)
        self.text = TextAssembler(engine.tokenizer)
        # [draft text, main text] per step; a third element when asked: [[token, logprob(, alternatives)], ..]
        self.steps: list[list] = []
        self.pending: list[list] = []
        self.moving_to: planning.Plan | None = None
        self.cached_tokens = 0  # prompt tokens the first engine found in its prefix cache
        self.overran = False  # stopped for running past settings.MAX_ANSWER_S
        # A chat answer's tokens, watched for a loop (serving/repetition.py): stopped once it repeats itself.
        self.watched: list[int] | None = [] if generation.source == Generation.Source.CHAT else None
        self.repeating = False

    def run(self) -> None:
        flush_s = settings.STREAM_FLUSH_MS / 1000
        last_flush = next_replan = time.monotonic()
        finished: Finished | None = None
        while finished is None:
            try:
                item = self.request.events.get(timeout=flush_s)
            except queue.Empty:
                item = None
            if isinstance(item, PromptRead):
                self.writer.send({"type": "prompt", "read": item.read, "total": item.total})
            elif isinstance(item, JoinedBatch):
                self._joined_batch(item)
            elif isinstance(item, LeftBatch):
                self._left_batch(item)
            elif isinstance(item, StepTokens):
                if not self.steps:
                    self.cached_tokens = self.request.cached_tokens
                self.stats.add_step(len(item.token_ids), item.at, drafter=item.drafter, proposed=item.proposed)
                piece: list = list(self.text.add(item.token_ids))
                if item.logprobs is not None:  # a third element: each token's text and log probability
                    piece.append(_scored(self.engine, item))
                self.steps.append(piece)
                self.pending.append(piece)
                self._watch_for_a_loop(item.token_ids)
            elif isinstance(item, Finished):
                finished = self._ended(item)
            finished = finished or self._overrun()
            first_tokens = self.pending and len(self.pending) == len(self.steps)  # the time to first token
            if finished or first_tokens or time.monotonic() - last_flush >= flush_s:
                self._flush(finished)
                if not finished and not self.request.stop_requested and self.writer.cancel_requested():
                    self.request.stop()
                last_flush = time.monotonic()
            if not finished and time.monotonic() >= next_replan:
                self._consider_handover()
                next_replan = time.monotonic() + REPLAN_EVERY_S
        self._record(finished)

    def _ended(self, item: Finished) -> Finished | None:
        """How the answer ended, or None where it goes on in another engine (a handover); a stop this worker made
        says why."""
        finished = self._continue_elsewhere() if self._handing_over(item) else item
        if finished and finished.finish_reason == FinishReason.STOPPED and self.overran:
            return Finished(FinishReason.ERROR, OVERRAN.format(limit=settings.MAX_ANSWER_S))
        if finished and finished.finish_reason == FinishReason.STOPPED and self.repeating:
            return Finished(FinishReason.REPEATING)
        return finished

    def _watch_for_a_loop(self, token_ids: list[int]) -> None:
        if self.watched is None or self.repeating:
            return
        self.watched += token_ids
        if period := repetition.loop_period(self.watched):
            log.info("generation %s repeats a span of %d tokens: stopped", self.generation.id, period)
            self.repeating, self.moving_to = True, None
            self.request.stop()

    def _overrun(self) -> Finished | None:
        """Past settings.MAX_ANSWER_S the answer is stopped (no handover); past the grace it ends whether or
        not its engine stopped (a hung one), so its slot is freed in bounded time."""
        limit = settings.MAX_ANSWER_S
        ran = time.perf_counter() - self.started_at
        if not limit or ran < limit:
            return None
        if not self.overran:
            log.warning("generation %s ran %.0f s, over the limit of %d s: stopping it", self.generation.id, ran, limit)
            self.overran, self.moving_to = True, None
            self.request.stop()
        return Finished(FinishReason.ERROR, OVERRAN.format(limit=limit)) if ran >= limit + OVERRUN_GRACE_S else None

    def _flush(self, finished: Finished | None) -> None:
        if finished:
            tail = self.text.finish()
            if tail:
                piece = ["", tail]
                self.steps.append(piece)
                self.pending.append(piece)
        if self.pending:
            self.writer.send({"type": "delta", "steps": self.pending})
            self.pending = []

    def _consider_handover(self) -> None:
        """Stop this request to go on elsewhere if the load now calls for another engine (greedy, or
        sampled on the own engine; no stop strings: the library would not see one that began before
        the handover; no grammar: it would start again at the handover)."""
        exact = self.planned.mode == SpeculativeMode.EXACT_SAMPLING
        if (self.moving_to or self.request.stop_requested or self.params.stop or self.params.grammar
                or (self.params.temperature > 0 and not exact)):
            return
        slug = self.generation.pair.slug
        rates, running = STATE.engines.rates_of(slug), STATE.engines.active_requests(slug=slug)
        rates.note_load(running)
        load = rates.recent_peak() or running  # the load a request joining now plans for (0: live figures off)
        if load > handover.HANDOVER_MAX_STREAMS and not exact and not self.planned.route.is_own_engine():
            return  # no move at this load: not worth working out figures (or starting an exploration) for
        self.moving_to = handover.handover(
            pair=self.generation.pair, asked=self.asked, planned=self.planned, load=load,
            generated=self.stats.tokens, remaining=self.params.max_new_tokens - self.stats.tokens,
            live=planning.live_figures(rates, asked=self.asked, load=load))
        if self.moving_to:
            self.request.stop()

    def _joined_batch(self, joined: JoinedBatch) -> None:
        """The own engine moved the answer into its batch (and lowered its K there): said on the record, the usage
        and the chat's explanation as it happens, not left as a K the answer no longer runs at."""
        moved = [Why(Reason.MOVED_INTO_BATCH, {"token": joined.token + 1})]
        if joined.k < joined.k_before:
            moved.append(Why(Reason.K_LOWERED, {"k": joined.k, "k_before": joined.k_before}))
        if joined.lookup:
            moved.append(Why(Reason.LOOKUP_IN_BATCH))
        self._replanned(k=joined.k, why=moved)

    def _left_batch(self, left: LeftBatch) -> None:
        """The own engine let the answer out of its batch: it speculates again at its K, said as `_joined_batch` says
        the move in."""
        self._replanned(k=left.k, why=[Why(Reason.LEFT_BATCH, {"token": left.token + 1, "k": left.k})])

    def _replanned(self, *, k: int, why: list[Why]) -> None:
        self.planned = replace(self.planned, k=k, why=(*self.planned.why, *why))
        try:
            _record_plan(generation=self.generation, planned=self.planned)
        except DatabaseError:  # the done event says it all the same; the answer goes on
            log.warning("generation %s: its move into or out of the batch could not be recorded", self.generation.id)

    def _handing_over(self, finished: Finished) -> bool:
        return (self.moving_to is not None and finished.finish_reason == FinishReason.STOPPED
                and not self.writer.cancel_requested())

    def _continue_elsewhere(self) -> Finished | None:
        """Submit the rest of the answer to the engine of the new plan; Finished if that fails."""
        planned, self.moving_to = self.moving_to, None
        assert planned is not None
        params = planned_decoding(replace(self.params, max_new_tokens=self.params.max_new_tokens - self.stats.tokens),
                                  planned)
        try:
            engine = load_engine(pair=self.generation.pair, route=planned.route)
            request = engine.submit(prompt_ids=self.prompt_ids + self.text.ids, params=params)
        except Exception:
            log.exception("generation %s could not be handed over", self.generation.id)
            return Finished(FinishReason.ERROR, f"The answer could not go on ({planned.reason}): {WORKER_FAILED}")
        self.engine, self.request, self.planned = engine, request, planned
        STATE.running[str(self.generation.id)] = request
        self.stats.hand_over(num_assistant_tokens=_fixed_k(engine, params), speculative=engine.spec.uses_draft,
                             drafter=engine.spec.drafter)
        _record_plan(generation=self.generation, planned=planned)
        return None

    def _record(self, finished: Finished) -> None:
        generation, writer = self.generation, self.writer
        figures = self.stats.summary(started_at=self.started_at,
                                     ended_at=self.stats.last_token_at or time.perf_counter())
        status = {FinishReason.STOPPED: Generation.Status.STOPPED, FinishReason.REPEATING: Generation.Status.STOPPED,
                  FinishReason.ERROR: Generation.Status.FAILED}.get(
            finished.finish_reason, Generation.Status.FINISHED
        )
        prompt_tokens = len(self.prompt_ids)
        # Before the record and `done`: a next turn sent as soon as either says the answer ended finds its blocks here
        publish_held_blocks(client=writer.client, slug=generation.pair.slug)
        try:
            ended = finish_generation(
                generation_id=generation.id, status=status, text=self.text.text, steps=self.steps,
                finish_reason=finished.finish_reason, error=finished.error, prompt_tokens=prompt_tokens,
                cached_tokens=self.cached_tokens,
                finished_at=timezone.now(), **asdict(figures))
        except DatabaseError:
            # Retried for FINAL_WRITE_RETRY_S: its readers end with an error rather than wait forever.
            log.exception("generation %s ended but its record could not be written", generation.id)
            writer.send({"type": "error", "message": NOT_SAVED})
            return
        if not ended:
            # Failed meanwhile (this worker was taken for dead): its readers already got that error, and a
            # `done` after it would contradict the record.
            log.warning("generation %s was failed by another process before it finished here", generation.id)
            return
        record_generation(client=writer.client, pair=generation.pair.slug, finish_reason=finished.finish_reason,
                          prompt_tokens=prompt_tokens, cached_tokens=self.cached_tokens, figures=figures,
                          mode=generation.speculative_mode, k=generation.speculative_k, worker=WORKER_NAME)
        if finished.finish_reason == FinishReason.ERROR:
            writer.send({"type": "error", "message": finished.error})
        else:
            writer.send({"type": "done", "finish_reason": finished.finish_reason, "prompt_tokens": prompt_tokens,
                         "cached_tokens": self.cached_tokens,
                         "text": self.text.text, **_served(generation), **asdict(figures)})


def _served(generation: Generation) -> dict:
    """How the answer is served, as the start and done events carry it."""
    return {"speculative_mode": generation.speculative_mode, "speculative_reason": generation.speculative_reason,
            "speculative_k": generation.speculative_k, "speculative_route": generation.speculative_route,
            "speculative_reason_codes": generation.speculative_reason_codes}
