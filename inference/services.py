"""The one generation path, shared by the chat and the REST API.

Web side: `start_generation` validates a request completely before it writes anything, records a
queued Generation and sends one Celery task to the pair's queue; `follow_generation` streams its
events to any number of readers and turns a dead or missing worker into an error event.
Worker side: `run_generation` drives the engine and writes the stream and the final record.
"""

from __future__ import annotations

import logging
import queue
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from inference import registry, selectors, transport
from inference.engine import (
    ENGINES, ActiveRequest, DecodingParams, Finished, PairEngine, PairSpec, Sampling, SpeculationStats, StepTokens,
    TextAssembler,
)
from inference.metrics import record_generation as record_metrics
from inference.models import Generation, ModelPair

log = logging.getLogger(__name__)


class GenerationRequestError(Exception):
    """A request that cannot be served; `param` names the field at fault, `status` the HTTP code."""

    def __init__(self, message: str, *, param: str | None = None, code: str = "invalid_value", status: int = 400):
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status


@dataclass(frozen=True, kw_only=True)
class GenerationOptions(Sampling):
    """What a caller may ask for; None means the pair's default (decoding_params resolves them)."""

    max_new_tokens: int | None = None
    num_assistant_tokens: int | None = None
    assistant_confidence_threshold: float | None = None
    speculative: bool = True


def _typed(data: dict, name: str, kind: type, default=None):
    """data[name] checked against kind (bool is not a number here); GenerationRequestError naming it."""
    value = data.get(name, default)
    if value is None:
        return default
    ok = isinstance(value, kind) and not (kind in (int, float) and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise GenerationRequestError(f"{name} must be {kind.__name__}, not {type(value).__name__}.", param=name,
                                     code="invalid_type")
    return value


def parse_options(data: dict, *, max_tokens_names: tuple[str, ...] = ("max_tokens",)) -> GenerationOptions:
    """GenerationOptions from a JSON object (chat settings or an API body); types are checked here,
    ranges in decoding_params."""
    max_new = None
    for name in max_tokens_names:
        max_new = _typed(data, name, int, max_new)
    stop = data.get("stop")
    if stop is None:
        stop = ()
    elif isinstance(stop, str):
        stop = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= 4:
        stop = tuple(stop)
    else:
        raise GenerationRequestError("stop must be a string or a list of at most 4 strings.", param="stop",
                                     code="invalid_type")
    if any(not s or "\x00" in s for s in stop):
        raise GenerationRequestError("stop strings must not be empty or contain NUL.", param="stop")
    return GenerationOptions(
        max_new_tokens=max_new,
        num_assistant_tokens=_typed(data, "num_assistant_tokens", int),
        assistant_confidence_threshold=_typed(data, "assistant_confidence_threshold", float),
        speculative=_typed(data, "speculative", bool, True),
        temperature=_typed(data, "temperature", float, 0.0),
        top_p=_typed(data, "top_p", float, 1.0),
        top_k=_typed(data, "top_k", int, 0),
        seed=_typed(data, "seed", int),
        stop=stop,
        ignore_eos=_typed(data, "ignore_eos", bool, False),
    )


def pair_spec(*, pair: ModelPair, speculative: bool = True) -> PairSpec:
    root = Path(settings.MODELS_ROOT)
    return PairSpec(
        slug=pair.slug,
        main_dir=str(root / pair.main_dir),
        draft_dir=str(root / pair.draft_dir) if pair.draft_dir else "",
        prompt_lookup=pair.prompt_lookup,
        device=pair.device,
        cache_size_gb=pair.cache_size_gb,
        inference_precision=pair.inference_precision,
        kv_cache_precision=pair.kv_cache_precision,
        speculative=speculative and pair.is_speculative,
    )


def _check_range(value, low, high, param: str, *, low_open=False, high_open=False) -> None:
    if value is None:
        return
    too_low = value <= low if low_open else value < low
    too_high = value >= high if high_open else value > high
    if too_low or too_high:
        lo, hi = ("(" if low_open else "["), (")" if high_open else "]")
        raise GenerationRequestError(f"{param} must be in {lo}{low}, {high}{hi}; got {value}.", param=param)


def decoding_params(*, pair: ModelPair, options: GenerationOptions, prompt_tokens: int) -> DecodingParams:
    """The pipeline settings for a request, or GenerationRequestError naming the bad field."""
    k, threshold = options.num_assistant_tokens, options.assistant_confidence_threshold
    if k is not None and threshold is not None:
        raise GenerationRequestError(
            "num_assistant_tokens and assistant_confidence_threshold are mutually exclusive.",
            param="assistant_confidence_threshold",
        )
    _check_range(k, 1, 32, "num_assistant_tokens")
    _check_range(threshold, 0, 1, "assistant_confidence_threshold", low_open=True, high_open=True)
    _check_float32_floor(threshold, "assistant_confidence_threshold")
    if (k is not None or threshold is not None) and options.speculative and not pair.is_speculative:
        raise GenerationRequestError(
            f"Pair '{pair.slug}' has no draft model, so it takes no speculative parameters.",
            param="num_assistant_tokens" if k is not None else "assistant_confidence_threshold",
        )
    if threshold is not None and not pair.draft_dir:
        raise GenerationRequestError(
            "assistant_confidence_threshold needs a draft model (prompt lookup takes num_assistant_tokens).",
            param="assistant_confidence_threshold",
        )
    _check_range(options.temperature, 0, 2, "temperature")
    _check_float32_floor(options.temperature, "temperature", zero_means="greedy decoding")
    _check_range(options.top_p, 0, 1, "top_p", low_open=True)
    _check_range(options.top_k, 0, 100_000, "top_k")
    _check_range(options.seed, 0, MAX_SEED, "seed")
    max_new = options.max_new_tokens if options.max_new_tokens is not None else min(pair.max_new_tokens_cap, 256)
    if max_new < 1:
        raise GenerationRequestError(f"max_tokens must be at least 1; got {max_new}.", param="max_tokens")
    if max_new > pair.max_new_tokens_cap:
        raise GenerationRequestError(
            f"max_tokens is {max_new}, over this pair's cap of {pair.max_new_tokens_cap}.", param="max_tokens"
        )
    context = registry.context_length(Path(settings.MODELS_ROOT) / pair.main_dir)
    if prompt_tokens >= context:
        raise GenerationRequestError(
            f"The prompt is {prompt_tokens} tokens, over the model's context of {context} tokens.",
            param="prompt", code="context_length_exceeded",
        )
    if k is None and threshold is None:
        k, threshold = pair.num_assistant_tokens, pair.assistant_confidence_threshold
    params = DecodingParams(
        max_new_tokens=min(max_new, context - prompt_tokens),
        num_assistant_tokens=k,
        assistant_confidence_threshold=threshold,
        max_ngram_size=pair.max_ngram_size,
        **options.sampling(),
    )
    try:  # whatever else the pipeline would refuse, refused here rather than on the worker
        params.generation_config(pair_spec(pair=pair, speculative=options.speculative)).validate()
    except RuntimeError as exc:
        reason = str(exc).strip().splitlines()[-1]  # the C++ check's own sentence, without its source path
        raise GenerationRequestError(f"The pipeline refuses these settings: {reason}") from None
    return params


MAX_SEED = 2**64 - 1  # openvino-genai's rng_seed is a size_t
FLOAT32_TINY = 1e-30  # the pipeline keeps these options as float32: far smaller values become 0 or denormal


def _check_float32_floor(value: float | None, param: str, *, zero_means: str = "") -> None:
    if value and 0 < value < FLOAT32_TINY:
        hint = f"; use 0 for {zero_means}" if zero_means else ""
        raise GenerationRequestError(f"{param} {value} is too small for the pipeline (at least {FLOAT32_TINY}{hint}).",
                                     param=param)


def count_prompt_tokens(*, pair: ModelPair, prompt: str, add_special_tokens: bool) -> int:
    try:
        main = registry.resolve_model_dir(pair.main_dir)
    except registry.PairFolderError as exc:
        raise GenerationRequestError(f"Pair '{pair.slug}' cannot be served: {exc}", param="model",
                                     code="model_unavailable", status=503) from exc
    tokenizer = registry.load_tokenizer(str(main))
    return int(tokenizer.encode(prompt, add_special_tokens=add_special_tokens).input_ids.shape[1])


def chat_prompt(*, pair: ModelPair, messages: list[dict]) -> str:
    """The conversation as the model sees it, through the main model's own chat template."""
    tokenizer = registry.load_tokenizer(str(registry.resolve_model_dir(pair.main_dir)))
    try:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    except Exception as exc:
        raise GenerationRequestError(f"The pair's chat template failed: {exc}", param="messages") from exc


def find_pair(*, slug: str) -> ModelPair:
    pair = selectors.enabled_pair(slug=slug or "")
    if pair is None:
        raise GenerationRequestError(f"The model '{slug}' does not exist or is disabled.", param="model",
                                     code="model_not_found", status=404)
    return pair


def check_prompt_text(text: str, *, param: str) -> None:
    """Empty text, or a NUL character (PostgreSQL cannot store one), is refused before anything is written."""
    if not text or not text.strip():
        raise GenerationRequestError("The prompt is empty.", param=param, code="empty_prompt")
    if "\x00" in text:
        raise GenerationRequestError("The prompt contains a NUL character.", param=param)


def start_generation(
    *,
    pair: ModelPair,
    prompt: str,
    options: GenerationOptions,
    user=None,
    source: str = Generation.Source.CHAT,
    add_special_tokens: bool = True,
    api_key=None,
) -> Generation:
    """Validate, record and enqueue one generation. Raises GenerationRequestError and writes
    nothing when the request cannot be served."""
    if not pair.enabled:
        raise GenerationRequestError(f"The model '{pair.slug}' is disabled.", param="model", code="model_not_found",
                                     status=404)
    check_prompt_text(prompt, param="prompt")
    prompt_tokens = count_prompt_tokens(pair=pair, prompt=prompt, add_special_tokens=add_special_tokens)
    params = decoding_params(pair=pair, options=options, prompt_tokens=prompt_tokens)
    state = selectors.pair_state(pair=pair, workers=selectors.live_workers(client=transport.sync_client()))
    if not state.served:
        raise GenerationRequestError(
            f"Nobody can serve '{pair.slug}' now: {state.error}. Start one with "
            f"`celery -A chatsite worker -P threads -Q {pair.queue}`.",
            param="model", code="model_unavailable", status=503,
        )
    generation = Generation.objects.create(
        pair=pair,
        user=user,
        source=source,
        api_key=api_key,
        prompt=prompt,
        prompt_tokens=prompt_tokens,
        params={"decoding": asdict(params), "speculative": options.speculative and pair.is_speculative,
                "add_special_tokens": add_special_tokens},
    )
    from inference.tasks import generate

    transaction.on_commit(lambda: generate.apply_async(args=[str(generation.id)], queue=pair.queue))
    return generation


def request_stop(*, generation: Generation) -> None:
    """Ask the worker to stop at its next step; what was produced is kept."""
    transport.request_cancel(transport.sync_client(), generation.id)


# ------------------------------------------------------------------ readers
async def follow_generation(*, generation_id, after: str = "0-0"):
    """The generation's events after `after`, then a terminal one. A queued generation that no
    live worker serves, or a running one whose worker stopped beating, ends with an error event."""
    client = transport.async_client()
    quiet_since = time.monotonic()
    try:
        async for entry_id, event in transport.follow(client, generation_id, after=after):
            if entry_id is not None:
                quiet_since = time.monotonic()
                yield entry_id, event
                continue
            yield None, event  # idle: lets the caller keep its connection alive
            if time.monotonic() - quiet_since >= 2:
                problem = await sync_to_async(stalled_generation_problem)(generation_id=generation_id)
                if problem:
                    entry_id = await sync_to_async(fail_generation)(generation_id=generation_id, message=problem)
                    if entry_id is None:
                        continue  # it finished meanwhile: its last events are on the stream
                    yield entry_id, {"type": "error", "message": problem}
                    return
                quiet_since = time.monotonic()
    finally:
        await client.aclose()


def stalled_generation_problem(*, generation_id) -> str:
    """Why a generation that sends nothing will never finish, or '' while it may."""
    generation = Generation.objects.select_related("pair").filter(id=generation_id).first()
    if generation is None or generation.is_done:
        return ""
    client = transport.sync_client()
    if generation.status == Generation.Status.RUNNING:
        if generation.worker and not selectors.worker_is_alive(client=client, name=generation.worker):
            return _worker_died(generation.worker)
        return ""
    waited = (timezone.now() - generation.created_at).total_seconds()
    state = selectors.pair_state(pair=generation.pair, workers=selectors.live_workers(client=client))
    if not state.served and waited >= 2:
        return f"No worker can serve '{generation.pair.slug}': {state.error}."
    if waited >= settings.STALL_TIMEOUT_S and state.state != "AVAILABLE":
        return f"'{generation.pair.slug}' did not become available within {settings.STALL_TIMEOUT_S} s."
    return ""


def fail_if_stalled(*, generation_id) -> bool:
    """Fail the generation if it will never finish (see stalled_generation_problem); True if it was failed."""
    problem = stalled_generation_problem(generation_id=generation_id)
    if problem:
        fail_generation(generation_id=generation_id, message=problem)
    return bool(problem)


def _worker_died(worker: str) -> str:
    return f"The worker running this answer ({worker}) stopped before it finished."


def fail_orphaned_generations(*, client) -> None:
    """Fail the running generations of workers whose heartbeat expired, read or not (a background
    API request nobody follows must not stay 'running' forever). Live workers call this as they beat."""
    running = list(Generation.objects.filter(status=Generation.Status.RUNNING).exclude(worker="")
                   .values_list("id", "worker"))
    dead = {worker for worker in {w for _, w in running} if not selectors.worker_is_alive(client=client, name=worker)}
    for generation_id, worker in running:
        if worker in dead:
            fail_generation(generation_id=generation_id, message=_worker_died(worker))


def fail_generation(*, generation_id, message: str) -> str | None:
    """Mark a generation failed and put the error on its stream; None if it had already ended."""
    with transaction.atomic():
        updated = Generation.objects.filter(
            id=generation_id, status__in=[Generation.Status.QUEUED, Generation.Status.RUNNING]
        ).update(status=Generation.Status.FAILED, error=message, finish_reason="error", finished_at=timezone.now())
    if not updated:
        return None
    return transport.append_event(transport.sync_client(), generation_id, {"type": "error", "message": message})


# ------------------------------------------------------------------ worker side
RUNNING: dict[str, ActiveRequest] = {}  # generation id -> its request in this worker's engine


def load_engine(*, pair: ModelPair, speculative: bool = True) -> PairEngine:
    """This worker's engine for the pair, loaded on first use; the last load result is kept on the pair."""
    try:
        engine = ENGINES.get(pair_spec(pair=pair, speculative=speculative))
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
    try:
        engine = load_engine(pair=generation.pair, speculative=generation.params.get("speculative", True))
    except Exception as exc:
        fail_generation(generation_id=generation.id,
                        message=f"Pair '{generation.pair.slug}' failed to load: {type(exc).__name__}: {exc}")
        return
    params = DecodingParams(**{**generation.params["decoding"], "stop": tuple(generation.params["decoding"]["stop"])})
    request = None
    try:
        request = engine.submit(
            prompt=generation.prompt, params=params,
            add_special_tokens=generation.params.get("add_special_tokens", True),
            before_batch=lambda prompt_tokens: writer.send({"type": "start", "prompt_tokens": prompt_tokens,
                                                            "worker": worker_name}))
        RUNNING[str(generation.id)] = request
        _stream_generation(generation=generation, request=request, writer=writer, params=params, engine=engine)
    except Exception as exc:  # whatever went wrong, the reader gets an error instead of waiting forever
        log.exception("generation %s failed", generation.id)
        if request is not None:
            request.stop()
        fail_generation(generation_id=generation.id, message=f"The worker failed: {type(exc).__name__}: {exc}")
    finally:
        RUNNING.pop(str(generation.id), None)


def stop_running(*, generation_id: str) -> None:
    """A cancel published by the web side: the step thread stops the request before its next step."""
    request = RUNNING.get(generation_id)
    if request is not None:
        request.stop()


def _stream_generation(*, generation: Generation, request, writer, params: DecodingParams, engine: PairEngine) -> None:
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
    Generation.objects.filter(id=generation.id).update(
        status=status, text=text.text, steps=steps, finish_reason=finished.finish_reason, error=finished.error,
        prompt_tokens=request.prompt_tokens, finished_at=timezone.now(), **metrics,
    )
    record_metrics(client=writer.client, pair=generation.pair.slug, finish_reason=finished.finish_reason,
                   prompt_tokens=request.prompt_tokens, summary=metrics)
    if finished.finish_reason == "error":
        writer.send({"type": "error", "message": finished.error})
    else:
        writer.send({"type": "done", "finish_reason": finished.finish_reason, "prompt_tokens": request.prompt_tokens,
                     "text": text.text, **metrics})


async def wait_for(*, generation_id) -> Generation:
    """The generation once it has ended (used by non-streaming API calls and tests)."""
    async for _, event in follow_generation(generation_id=generation_id):
        if event["type"] in transport.TERMINAL:
            break
    return await Generation.objects.aget(id=generation_id)

