"""The web side of starting a generation, shared by the chat and the REST API (runs in the Django process).

`start_generation` validates a request completely before it writes anything (options, ranges, the
prompt against the model's context), records a queued Generation and, once the record is committed, sends
`tasks.generate` to the worker of the pair that holds the prompt's cached blocks (serving/routing.py; tasks.py imports
the worker side, inference.serving.worker, only in the task's body: never here); `in_flight_slot` bounds what one key
or chat user has running (`start_for_key`, an API key's). Readers follow the generation with inference.serving.readers.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import redis
from django.conf import settings
from django.db import transaction
from kombu.exceptions import OperationalError

from inference import errors, limits, pair_checks, selectors, transport
from inference.celery_worker import worker_command_line
from inference.engines.decoding import DecodingParams, Sampling
from inference.engines.spec import context_length
from inference.models import ApiKey, Generation, ModelPair
from inference.serving import routing, tasks
from inference.serving.planning.inputs import Asked
from inference.serving.records import fail_if_stalled

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class GenerationOptions(Sampling):
    """What a caller may ask for; None means the pair's default (decoding_params resolves them)."""

    max_new_tokens: int | None = None
    num_assistant_tokens: int | None = None
    assistant_confidence_threshold: float | None = None
    speculative: bool = True
    pair_sampling: bool = False  # the chat's, asking for no sampling: the pair's chat_sampling (chat/services.py)


def _typed(data: dict, name: str, kind: type, default=None):
    """data[name] checked against kind (bool is not a number here); errors.InvalidType naming it."""
    value = data.get(name, default)
    if value is None:
        return default
    ok = isinstance(value, kind) and not (kind in (int, float) and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        if abs(value) > sys.float_info.max:
            raise errors.InvalidValue(f"{name} is far out of range ({_shown(value)}).", param=name)
        value, ok = float(value), True
    if not ok:
        raise errors.InvalidType(f"{name} must be {kind.__name__}, not {type(value).__name__}.", param=name)
    if kind is float and not math.isfinite(value):
        raise errors.InvalidValue(f"{name} must be a finite number; got {value}.", param=name)
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
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= limits.MAX_STOP_STRINGS:
        stop = tuple(stop)
    else:
        raise errors.InvalidType(f"stop must be a string or a list of at most {limits.MAX_STOP_STRINGS} strings.",
                                 param="stop")
    if any(not s or "\x00" in s for s in stop):
        raise errors.InvalidValue("stop strings must not be empty or contain NUL.", param="stop")
    if any(len(s) > limits.MAX_STOP_LENGTH for s in stop):
        raise errors.InvalidValue(f"A stop string is at most {limits.MAX_STOP_LENGTH} characters long.", param="stop")
    return GenerationOptions(
        max_new_tokens=max_new,
        num_assistant_tokens=_typed(data, "num_assistant_tokens", int),
        assistant_confidence_threshold=_typed(data, "assistant_confidence_threshold", float),
        speculative=_typed(data, "speculative", bool, True),
        temperature=_typed(data, "temperature", float, 0.0),
        top_p=_typed(data, "top_p", float, 1.0),
        top_k=_typed(data, "top_k", int, 0),
        repetition_penalty=_typed(data, "repetition_penalty", float, 1.0),
        seed=_typed(data, "seed", int),
        stop=stop,
        ignore_eos=_typed(data, "ignore_eos", bool, False),
    )


def _check_range(value, low, high, param: str, *, low_open=False, high_open=False) -> None:
    if value is None:
        return
    too_low = value <= low if low_open else value < low
    too_high = value >= high if high_open else value > high
    if too_low or too_high:
        lo, hi = ("(" if low_open else "["), (")" if high_open else "]")
        raise errors.InvalidValue(f"{param} must be in {lo}{low}, {high}{hi}; got {_shown(value)}.", param=param)


def _shown(number) -> str:
    """A number as an error message quotes it: a 1,000-digit one by its length."""
    text = str(number)
    return text if len(text) <= 24 else f"a number of {len(text.lstrip('-'))} digits"


def decoding_params(*, pair: ModelPair, options: GenerationOptions, prompt_tokens: int) -> DecodingParams:
    """The pipeline settings for a request, or an errors.ServiceError naming the bad field."""
    k, threshold = options.num_assistant_tokens, options.assistant_confidence_threshold
    if k is not None and threshold is not None:
        raise errors.InvalidValue(
            "num_assistant_tokens and assistant_confidence_threshold are mutually exclusive.",
            param="assistant_confidence_threshold",
        )
    _check_range(k, limits.K_MIN, limits.K_MAX, "num_assistant_tokens")
    _check_range(threshold, 0, 1, "assistant_confidence_threshold", low_open=True, high_open=True)
    _check_float32_floor(threshold, "assistant_confidence_threshold")
    if (k is not None or threshold is not None) and options.speculative and not pair.is_speculative:
        raise errors.InvalidValue(
            f"Pair '{pair.slug}' has no draft model, so it takes no speculative parameters.",
            param="num_assistant_tokens" if k is not None else "assistant_confidence_threshold",
        )
    if threshold is not None and not pair.draft_dir:
        raise errors.InvalidValue(
            "assistant_confidence_threshold needs a draft model (prompt lookup takes num_assistant_tokens).",
            param="assistant_confidence_threshold",
        )
    _check_range(options.temperature, 0, limits.TEMPERATURE_MAX, "temperature")
    _check_float32_floor(options.temperature, "temperature", zero_means="greedy decoding")
    _check_range(options.top_p, 0, 1, "top_p", low_open=True)
    _check_range(options.top_k, 0, limits.TOP_K_MAX, "top_k")
    _check_range(options.repetition_penalty, 0, limits.REPETITION_PENALTY_MAX, "repetition_penalty", low_open=True)
    _check_range(options.seed, 0, limits.MAX_SEED, "seed")
    max_new = asked_max_new_tokens(pair=pair, options=options)
    if max_new < 1:
        raise errors.InvalidValue(f"max_tokens must be at least 1; got {_shown(max_new)}.", param="max_tokens")
    if max_new > pair.max_new_tokens_cap:
        raise errors.InvalidValue(
            f"max_tokens is {_shown(max_new)}, over this pair's cap of {pair.max_new_tokens_cap}.", param="max_tokens"
        )
    context = main_context(pair=pair)
    if prompt_tokens >= context:
        raise errors.ContextLengthExceeded(
            f"The prompt is {prompt_tokens} tokens, over the model's context of {context} tokens.",
            param="prompt",
        )
    return DecodingParams(
        max_new_tokens=min(max_new, context - prompt_tokens),  # how it speculates, the worker's plan decides
        max_ngram_size=pair.max_ngram_size,
        **options.sampling(),
    )


def cache_scope(*, user=None, api_key=None) -> str:
    """Whose cached blocks a request may find (engines/own/block_pool.py): its user's, the API key's owner's (a key
    with no owner is its own user), or everyone's where the server shares its cache (SPECCHAT_PREFIX_CACHE_SCOPE)."""
    if settings.PREFIX_CACHE_SCOPE == "server":
        return ""
    if user is None and api_key is not None:
        return f"user:{api_key.user_id}" if api_key.user_id else f"key:{api_key.pk}"
    return f"user:{user.pk}" if user is not None else "anonymous"


def asked_max_new_tokens(*, pair: ModelPair, options: GenerationOptions) -> int:
    """max_tokens as asked, else the pair's default (checked against the pair's cap in decoding_params)."""
    if options.max_new_tokens is None:
        return min(pair.max_new_tokens_cap, limits.DEFAULT_MAX_NEW_TOKENS)
    return options.max_new_tokens


def main_context(*, pair: ModelPair) -> int:
    """The tokens the pair's main reads at most, prompt and answer together."""
    return context_length(Path(settings.MODELS_ROOT) / pair.main_dir)


def asked(options: GenerationOptions) -> Asked:
    return Asked(speculative=options.speculative, k=options.num_assistant_tokens,
                             threshold=options.assistant_confidence_threshold, sampled=options.temperature > 0,
                             constrained=bool(options.grammar_kind), alternatives=options.top_logprobs > 0)


def _check_float32_floor(value: float | None, param: str, *, zero_means: str = "") -> None:
    if value and 0 < value < limits.FLOAT32_TINY:
        hint = f"; use 0 for {zero_means}" if zero_means else ""
        raise errors.InvalidValue(
            f"{param} {value} is too small for the pipeline (at least {limits.FLOAT32_TINY}{hint}).",
                                     param=param)


def encode_prompt(*, pair: ModelPair, prompt: str, add_special_tokens: bool) -> list[int]:
    """The prompt's token ids, counted here against the context and carried to the worker in the record."""
    try:
        main = pair_checks.resolve_model_dir(pair.main_dir)
    except pair_checks.PairFolderError as exc:
        raise errors.ModelUnavailable(f"Pair '{pair.slug}' cannot be served: {exc}", param="model") from exc
    tokenizer = pair_checks.load_tokenizer(str(main))
    return [int(t) for t in tokenizer.encode(prompt, add_special_tokens=add_special_tokens).input_ids.data[0]]


def chat_prompt(*, pair: ModelPair, messages: list[dict], tools: list[dict] | None = None) -> str:
    """The conversation as the model sees it, through the main model's own chat template (which describes
    the tools, if any)."""
    tokenizer = pair_checks.load_tokenizer(str(pair_checks.resolve_model_dir(pair.main_dir)))
    try:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tools=tools)
    except Exception as exc:
        raise errors.InvalidValue(f"The pair's chat template failed: {exc}", param="messages") from exc


def find_pair(*, slug: str) -> ModelPair:
    pair = selectors.enabled_pair(slug=slug or "")
    if pair is None:
        raise errors.ModelNotFound(f"The model '{slug}' does not exist or is disabled.", param="model")
    return pair


def check_prompt_text(text: str, *, param: str) -> None:
    """Empty text, or a NUL character (PostgreSQL cannot store one), is refused before anything is written."""
    if not text or not text.strip():
        raise errors.EmptyPrompt("The prompt is empty.", param=param)
    if "\x00" in text:
        raise errors.InvalidValue("The prompt contains a NUL character.", param=param)


def start_generation(
    *,
    pair: ModelPair,
    prompt: str,
    options: GenerationOptions,
    prompt_ids: list[int] | None = None,
    user=None,
    source: str = Generation.Source.API,  # the chat says it is the chat: its answers are watched by its pages
    add_special_tokens: bool = True,
    api_key=None,
    reply: dict | None = None,
) -> Generation:
    """Validate, record and enqueue one generation. Raises an errors.ServiceError and writes
    nothing when the request cannot be served. `reply`: how the API shapes the answer (its views read it
    back from the record). `prompt_ids`: the prompt's tokens where the caller counted them already (the chat,
    fitting a conversation to the context), so a long prompt is not tokenized twice."""
    if not pair.enabled:
        raise errors.ModelNotFound(f"The model '{pair.slug}' is disabled.", param="model")
    check_prompt_text(prompt, param="prompt")
    if prompt_ids is None:
        prompt_ids = encode_prompt(pair=pair, prompt=prompt, add_special_tokens=add_special_tokens)
    params = replace(decoding_params(pair=pair, options=options, prompt_tokens=len(prompt_ids)),
                     cache_scope=cache_scope(user=user, api_key=api_key))
    client = transport.sync_client()
    workers = selectors.live_workers(client=client)
    state = selectors.pair_state(pair=pair, workers=workers)
    # Just after a Redis restart the heartbeats are not back yet: queue it; the stall checks judge it later.
    if not state.served and selectors.heartbeats_settled(client=client):
        raise errors.ModelUnavailable(
            f"Nobody serves '{pair.slug}' now ({state.error}). An admin can load it with the pair's \"Load on "
            f"every live worker\" action, or restart `python manage.py serve` (`make run`), which serves every "
            f"enabled pair; or start a worker for it: `{worker_command_line(queues=[pair.queue])}`.",
            param="model",
        )
    routed = routing.route(client, pair=pair, workers=workers, prompt_ids=prompt_ids, scope=params.cache_scope)
    generation = Generation.objects.create(
        pair=pair,
        user=user,
        source=source,
        api_key=api_key,
        prompt=prompt,
        prompt_tokens=len(prompt_ids),
        routed_to=routed.worker,
        params={"decoding": asdict(params), "asked": asdict(asked(options)), "prompt_ids": prompt_ids,
                "add_special_tokens": add_special_tokens, "reply": reply or {},
                "routed": {"by": routed.by, "cached_tokens": routed.cached_tokens}},
    )
    transaction.on_commit(lambda: _enqueue(generation_id=generation.id, queue=routed.queue))
    return generation


def _enqueue(*, generation_id, queue: str) -> None:
    """Send the generation's task. With the broker unreachable (a Redis restart), the request is not
    refused: its record is queued, and a worker sends the task again once Redis is back
    (housekeeping.resend_lost_generations)."""
    try:
        tasks.generate.apply_async(args=(str(generation_id),), queue=queue)
    except OperationalError as exc:
        log.warning("generation %s recorded but its task not sent (%s): a worker will send it again",
                    generation_id, exc)


def request_stop(*, generation: Generation) -> None:
    """Ask the worker to stop at its next step; what was produced is kept."""
    transport.request_cancel(transport.sync_client(), generation.id)


IN_FLIGHT = selectors.IN_FLIGHT
LOCK_POLL_S = 0.005


@contextmanager
def in_flight_slot(*, lock: str, generations, limit: int, refusal: str) -> Iterator[None]:
    """Inside: `generations` (a key's, a chat user's) have a free slot, held until the block's new one
    is committed. Under a Redis lock, so two requests at once cannot both take the last slot; when no
    slot is free, in-flight generations that will never end are failed first, so they free theirs.
    `refusal` is formatted with the count and the limit. A Redis restart inside the block drops the
    lock: not an error.

    A burst of requests on one key queues on this lock: waiters poll it every LOCK_POLL_S (redis-py's
    default of 0.1 s spaced a burst's requests 100 ms apart, which was most of its time to first token),
    and the stall checks (several round trips per generation) run only when they could free a slot."""
    held = transport.sync_client().lock(lock, timeout=30, sleep=LOCK_POLL_S, blocking_timeout=10)
    if not held.acquire():
        raise errors.ConcurrencyLimit("Too many requests at once for the same slots: retry in a moment.")
    try:
        in_flight = list(generations.filter(status__in=IN_FLIGHT).values_list("id", flat=True))
        if len(in_flight) >= limit:
            in_flight = [generation for generation in in_flight if not fail_if_stalled(generation_id=generation)]
        if len(in_flight) >= limit:
            raise errors.ConcurrencyLimit(refusal.format(count=len(in_flight), limit=limit))
        yield
    finally:
        with suppress(redis.exceptions.LockNotOwnedError):
            held.release()


def start_for_key(*, api_key: ApiKey, **start_kwargs) -> Generation:
    """start_generation for this key, or a 429 when it already has max_concurrent in flight.
    In-flight generations whose worker is gone are failed first so they free their slot."""
    with in_flight_slot(lock=transport.slot_lock("apikey", api_key.id),
                            generations=Generation.objects.filter(api_key=api_key), limit=api_key.max_concurrent,
                            refusal="This key already has {count} generations in flight (its limit is {limit}); "
                                    "retry when one has finished."):
        return start_generation(api_key=api_key, **start_kwargs)
