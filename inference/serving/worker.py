"""The worker side of a generation, run in the Celery worker process: load the pair's engine, run a
queued generation on it, stream its steps to the generation's Redis Stream and write the record.
The module state (the engines this process holds, the requests it runs) lives here only."""

from __future__ import annotations

import logging
import queue
import time
from datetime import timedelta

from celery import current_app
from django.conf import settings
from django.utils import timezone

from inference import selectors, transport
from inference.engines.base import ActiveRequest, DecodingParams, Finished, SpeculationStats, StepTokens, TextAssembler
from inference.engines.exact import ExactEngine
from inference.engines.library import PairEngine
from inference.engines.registry import EngineRegistry
from inference.metrics import record_generation
from inference.models import Generation, ModelPair
from inference.serving import speculation
from inference.serving.records import fail_generation, pair_spec, planned_decoding, queue_timeout, worker_died

log = logging.getLogger(__name__)

ENGINES = EngineRegistry(renew_after=settings.ENGINE_RENEW_AFTER_REQUESTS)
RUNNING: dict[str, ActiveRequest] = {}  # generation id -> its request in this worker's engine


def load_engine(*, pair: ModelPair, speculative: bool = True,
                exact_sampling: bool = False) -> PairEngine | ExactEngine:
    """This worker's engine for the pair, loaded on first use; the last load result is kept on the pair."""
    try:
        engine = ENGINES.get(pair_spec(pair=pair, speculative=speculative, exact_sampling=exact_sampling))
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
    writer = transport.StreamWriter(transport.sync_client(), generation.id)
    claimed = Generation.objects.filter(id=generation.id, status=Generation.Status.QUEUED).update(
        status=Generation.Status.RUNNING, worker=worker_name, started_at=timezone.now()
    )
    if not claimed:
        return
    planned = speculation.plan(pair=generation.pair, asked=speculation.Asked(**generation.params.get("asked", {})),
                               load=current_load(pair=generation.pair))
    Generation.objects.filter(id=generation.id).update(
        speculative_mode=planned.mode, speculative_reason=planned.reason, speculative_k=planned.k)
    generation.speculative_mode, generation.speculative_reason = planned.mode, planned.reason
    generation.speculative_k = planned.k
    try:
        engine = load_engine(pair=generation.pair, speculative=planned.speculative,
                             exact_sampling=planned.exact_sampling)
    except Exception as exc:
        fail_generation(generation_id=generation.id,
                        message=f"Pair '{generation.pair.slug}' failed to load: {type(exc).__name__}: {exc}")
        return
    decoding = generation.params["decoding"]
    params = planned_decoding(DecodingParams(**{**decoding, "stop": tuple(decoding["stop"])}), planned)
    request = None
    try:
        request = engine.submit(
            prompt=generation.prompt, params=params,
            add_special_tokens=generation.params.get("add_special_tokens", True),
            before_batch=lambda prompt_tokens: writer.send({"type": "start", "prompt_tokens": prompt_tokens,
                                                            "worker": worker_name, **_served(generation)}))
        RUNNING[str(generation.id)] = request
        _stream_generation(generation=generation, request=request, writer=writer, params=params, engine=engine)
    except Exception as exc:  # whatever went wrong, the reader gets an error instead of waiting forever
        log.exception("generation %s failed", generation.id)
        if request is not None:
            request.stop()
        fail_generation(generation_id=generation.id, message=f"The worker failed: {type(exc).__name__}: {exc}")
    finally:
        RUNNING.pop(str(generation.id), None)


def current_load(*, pair: ModelPair) -> int:
    """Streams a request joining now shares this worker with: those it runs, or, when a burst arrives,
    the pair's generations in flight (queued ones included) spread over the workers serving it; a
    burst's first requests would otherwise plan for a load that is about to come."""
    running_here = ENGINES.active_requests(slug=pair.slug) + 1
    in_flight = Generation.objects.filter(pair=pair, status__in=[Generation.Status.QUEUED,
                                                               Generation.Status.RUNNING]).count()
    serving = selectors.pair_state(pair=pair, workers=selectors.live_workers(client=transport.sync_client())).workers
    return max(running_here, -(-in_flight // max(len(serving), 1)))


def stop_running(*, generation_id: str) -> None:
    """A cancel published by the web side: the step thread stops the request before its next step."""
    request = RUNNING.get(generation_id)
    if request is not None:
        request.stop()


def _stream_generation(*, generation: Generation, request, writer, params: DecodingParams,
                       engine: PairEngine | ExactEngine) -> None:
    spec = engine.spec
    fixed_k = params.num_assistant_tokens if params.assistant_confidence_threshold is None else None
    stats = SpeculationStats(num_assistant_tokens=fixed_k if spec.uses_draft or spec.uses_prompt_lookup else None,
                             speculative=spec.uses_draft or spec.uses_prompt_lookup,
                             max_new_tokens=params.max_new_tokens)
    text = TextAssembler(engine.tokenizer)
    steps: list[list[str]] = []
    pending: list[list[str]] = []
    flush_s = settings.STREAM_FLUSH_MS / 1000
    last_flush = time.monotonic()
    finished: Finished | None = None
    while finished is None:
        try:
            item = request.events.get(timeout=flush_s)
        except queue.Empty:
            item = None
        if isinstance(item, StepTokens):
            stats.add_step(len(item.token_ids), item.at)
            piece = list(text.add(item.token_ids))
            steps.append(piece)
            pending.append(piece)
        elif isinstance(item, Finished):
            finished = item
        first_tokens = pending and len(pending) == len(steps)  # nothing sent yet: they are the time to first token
        if finished or first_tokens or time.monotonic() - last_flush >= flush_s:
            if finished:
                tail = text.finish()
                if tail:
                    piece = ["", tail]
                    steps.append(piece)
                    pending.append(piece)
            if pending:
                writer.send({"type": "delta", "steps": pending})
                pending = []
            if not finished and not request.stop_requested and writer.cancel_requested():
                request.stop()
            last_flush = time.monotonic()
    metrics = stats.summary(started_at=request.added_at, ended_at=stats.last_token_at or time.perf_counter())
    status = {"stopped": Generation.Status.STOPPED, "error": Generation.Status.FAILED}.get(
        finished.finish_reason, Generation.Status.FINISHED
    )
    ended = Generation.objects.filter(id=generation.id, status=Generation.Status.RUNNING).update(
        status=status, text=text.text, steps=steps, finish_reason=finished.finish_reason, error=finished.error,
        prompt_tokens=request.prompt_tokens, finished_at=timezone.now(), **metrics,
    )
    if not ended:
        # Failed meanwhile (this worker was taken for dead): its readers already got that error, and a
        # `done` after it would contradict the record.
        log.warning("generation %s was failed by another process before it finished here", generation.id)
        return
    record_generation(client=writer.client, pair=generation.pair.slug, finish_reason=finished.finish_reason,
                      prompt_tokens=request.prompt_tokens, summary=metrics, mode=generation.speculative_mode,
                      k=generation.speculative_k)
    if finished.finish_reason == "error":
        writer.send({"type": "error", "message": finished.error})
    else:
        writer.send({"type": "done", "finish_reason": finished.finish_reason, "prompt_tokens": request.prompt_tokens,
                     "text": text.text, **_served(generation), **metrics})


def _served(generation: Generation) -> dict:
    """How the answer is served, as the start and done events carry it."""
    return {"speculative_mode": generation.speculative_mode, "speculative_reason": generation.speculative_reason,
            "speculative_k": generation.speculative_k}


def resend_lost_generations(*, client, queues: list[str]) -> None:
    """Send again the task of a generation queued for longer than REQUEUE_AFTER_S on a pair this
    worker serves (called only while it has a free slot, so nothing legitimately waits for it): the
    claim in run_generation makes a second delivery harmless. Still queued after QUEUE_TIMEOUT_S: failed."""
    now = timezone.now()
    slugs = [queue.removeprefix("pair.") for queue in queues if queue.startswith("pair.")]
    stale = Generation.objects.filter(status=Generation.Status.QUEUED, pair__slug__in=slugs,
                                      created_at__lt=now - timedelta(seconds=settings.REQUEUE_AFTER_S))
    for generation_id, slug, created_at in stale.values_list("id", "pair__slug", "created_at"):
        if (now - created_at).total_seconds() >= settings.QUEUE_TIMEOUT_S:
            fail_generation(generation_id=generation_id, message=queue_timeout(slug))
        elif client.set(f"specchat:resent:{generation_id}", "1", nx=True, ex=settings.REQUEUE_AFTER_S):
            log.warning("generation %s was queued for %s s: sending its task again", generation_id,
                        settings.REQUEUE_AFTER_S)
            current_app.send_task("inference.generate", args=[str(generation_id)], queue=f"pair.{slug}")


def fail_orphaned_generations(*, client) -> None:
    """Fail the running generations of workers whose heartbeat expired, read or not (a background
    API request nobody follows must not stay 'running' forever). Live workers call this as they beat."""
    if not selectors.heartbeats_settled(client=client):
        return  # Redis just restarted: the other workers' heartbeats are not back yet
    running = list(Generation.objects.filter(status=Generation.Status.RUNNING).exclude(worker="")
                   .values_list("id", "worker"))
    dead = {worker for worker in {w for _, w in running} if not selectors.worker_is_alive(client=client, name=worker)}
    for generation_id, worker in running:
        if worker in dead:
            fail_generation(generation_id=generation_id, message=worker_died(worker))
