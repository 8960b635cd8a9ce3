"""Thin async handlers of the REST API: check access, parse, delegate to the shared generation path.

Every answer that is not a success is OpenAI's error object; an unexpected exception is logged and
still answered in that shape, never as an HTML page.
"""

from __future__ import annotations

import asyncio
import functools
import logging

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DatabaseError
from django.db.models import Max
from django.http import HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from inference import errors, selectors, transport
from inference.api import auth, openapi, parsing, sse
from inference.api.shapes import Shape, error_body, usage
from inference.engines.spec import context_length
from inference.metrics import exposition
from inference.models import Generation, ModelPair
from inference.serving import calibrated, readers, web

log = logging.getLogger(__name__)


def error_response(exc: errors.ServiceError) -> JsonResponse:
    reply = JsonResponse(error_body(exc), status=exc.status)
    if exc.status == 401:
        reply["WWW-Authenticate"] = "Bearer"
    return reply


def api_view(*methods: str, authenticated: bool = False):
    """An async, CSRF-exempt API view answering errors in OpenAI's shape; `authenticated` passes
    the caller's ApiKey as `api_key`."""

    def decorate(handler):
        @csrf_exempt
        @functools.wraps(handler)
        async def view(request, **kwargs):
            try:
                if request.method not in methods:
                    reply = error_response(errors.MethodNotAllowed(
                        f"{request.method} is not allowed here; use {', '.join(methods)}."))
                    reply["Allow"] = ", ".join(methods)
                    return reply
                if authenticated:
                    kwargs["api_key"] = await sync_to_async(auth.authenticate)(
                        authorization=request.headers.get("Authorization", ""))
                return await handler(request, **kwargs)
            except errors.ServiceError as exc:
                return error_response(exc)
            except DatabaseError:
                log.exception("API error on %s %s: the database", request.method, request.path)
                return error_response(errors.DatabaseUnavailable(errors.DATABASE_DOWN))
            except Exception:
                log.exception("API error on %s %s", request.method, request.path)
                return error_response(errors.InternalError("Internal error; it has been logged."))

        return view

    return decorate


def _shape(generation: Generation, *, chat: bool) -> Shape:
    return Shape(chat=chat, model=generation.pair.slug, generation_id=str(generation.id),
                 created=int(generation.created_at.timestamp()),
                 logprobs=bool(generation.params.get("decoding", {}).get("logprobs")),
                 tool_calls=bool(generation.params.get("reply", {}).get("tool_calls")),
                 speculation_steps=bool(generation.params.get("reply", {}).get("speculation_steps")))


def _start(*, data: dict, chat: bool, api_key) -> tuple[parsing.ApiRequest, Generation]:
    api_request = parsing.parse(data, chat=chat, requester=str(api_key.id))
    try:
        generation = web.start_for_key(api_key=api_key, source=Generation.Source.API, **api_request.start_kwargs)
    except errors.ServiceError as exc:
        if chat and exc.param == "prompt":
            exc.param = "messages"  # the prompt a chat request has is its templated messages
        raise
    return api_request, generation


def _stop_abandoned(start: asyncio.Future) -> None:
    if not start.cancelled() and start.exception() is None:
        api_request, generation = start.result()
        if not api_request.background:
            web.request_stop(generation=generation)


async def _generate(request, *, api_key, chat: bool):
    data = parsing.json_body(request)
    start = asyncio.ensure_future(sync_to_async(_start)(data=data, chat=chat, api_key=api_key))
    try:
        api_request, generation = await asyncio.shield(start)
    except asyncio.CancelledError:  # the client left before its generation was queued: stop it once it is
        start.add_done_callback(_stop_abandoned)
        raise
    shape = _shape(generation, chat=chat)
    if api_request.stream:
        stream = sse.events(generation=generation, shape=shape, after="0-0", include_usage=api_request.include_usage,
                            owner=not api_request.background)
        return sse.response(stream, generation=generation)
    try:
        ended = await readers.wait_for(generation_id=generation.id)
    except asyncio.CancelledError:  # the client went away while waiting
        if not api_request.background:
            web.request_stop(generation=generation)
        raise
    if ended.status == Generation.Status.FAILED:
        raise errors.GenerationFailed(f"The generation failed: {ended.error}")
    body = shape.response(text=ended.text, finish_reason=ended.finish_reason, usage=usage(vars(ended)),
                          steps=ended.steps)
    return JsonResponse(body, headers={"X-Generation-Id": str(generation.id)})


@api_view("POST", authenticated=True)
async def completions(request, *, api_key):
    return await _generate(request, api_key=api_key, chat=False)


@api_view("POST", authenticated=True)
async def chat_completions(request, *, api_key):
    return await _generate(request, api_key=api_key, chat=True)


@api_view("GET", authenticated=True)
async def events(request, *, api_key, generation_id, chat: bool):
    """Resume a stream after Last-Event-ID. This connection does not own the generation."""
    generation = await sync_to_async(auth.owned_generation)(api_key=api_key, generation_id=generation_id)
    after = request.headers.get("Last-Event-ID") or "0-0"
    if not transport.valid_entry_id(after):
        raise errors.InvalidValue("Last-Event-ID must be an event id this stream sent.", param="Last-Event-ID")
    include_usage = request.GET.get("include_usage", "false").lower()
    if include_usage not in {"true", "false"}:
        raise errors.InvalidValue("include_usage must be true or false.", param="include_usage")
    stream = sse.events(generation=generation, shape=_shape(generation, chat=chat), after=after,
                        include_usage=include_usage == "true", owner=False)
    return sse.response(stream, generation=generation)


@api_view("POST", authenticated=True)
async def cancel(request, *, api_key, generation_id, chat: bool):
    generation = await sync_to_async(auth.owned_generation)(api_key=api_key, generation_id=generation_id)
    if not generation.is_done:
        await sync_to_async(web.request_stop)(generation=generation)
    return JsonResponse({"id": _shape(generation, chat=chat).id, "status": generation.status})


def _models() -> list[dict]:
    states = selectors.pair_states(client=transport.sync_client())
    return [{"id": pair.slug, "object": "model", "created": int(pair.created_at.timestamp()), "owned_by": "specchat",
             "name": pair.name, "speculative": pair.is_speculative, "state": states[pair.slug].state,
             "max_model_len": context_length(settings.MODELS_ROOT / pair.main_dir)}
            for pair in ModelPair.objects.filter(enabled=True)]


@api_view("GET", authenticated=True)
async def models(request, *, api_key):
    return JsonResponse({"object": "list", "data": await sync_to_async(_models)()})


def _config(*, calibrations: bool) -> dict:
    """OVMS's shape and each pair's devices; with `calibrations`, its calibration per host too: which host its
    figures come from (its CPU, flags, library version), when, and what they decided."""
    workers = selectors.live_workers(client=transport.sync_client())
    states = {pair: selectors.pair_state(pair=pair, workers=workers) for pair in ModelPair.objects.all()}
    shown = {pair.slug: {"model_version_status": [{
        "version": "1", "state": state.state,
        "status": {"error_code": "UNAVAILABLE" if state.error else "OK", "error_message": state.error or "OK"},
    }], "devices": pair.devices} for pair, state in states.items()}
    if calibrations:
        for pair in states:
            shown[pair.slug]["calibrations"] = [calibrated.public_summary(each)
                                                for each in selectors.pair_calibrations(pair=pair)]
    return shown


@api_view("GET")
async def config(request):
    """Each pair's state in OpenVINO Model Server's /v1/config shape, and the devices its models run on. The
    calibrations describe the host (CPU, flags, core count, library version): an API key's to read (staff read
    them in the admin), not anyone's who can reach the port."""
    authorization = request.headers.get("Authorization")
    if authorization is not None:
        await sync_to_async(auth.authenticate)(authorization=authorization)
    return JsonResponse(await sync_to_async(_config)(calibrations=authorization is not None))


def _health() -> None:
    """Redis and the database answer, or an error naming which one (the cause goes to the log only:
    it can hold host names, ports and credentials)."""
    for part, check in (("Redis", lambda: transport.sync_client().ping()), ("the database", ModelPair.objects.exists)):
        try:
            check()
        except Exception:
            log.exception("health check: %s does not answer", part)
            raise errors.Unhealthy(f"Not ready: {part} does not answer.") from None


@api_view("GET")
async def health(request):
    await sync_to_async(_health)()
    return JsonResponse({"status": "ok"})


@api_view("GET")
async def metrics(request):
    auth.check_metrics_access(authorization=request.headers.get("Authorization", ""))
    text = await sync_to_async(exposition)(client=transport.sync_client())
    return HttpResponse(text, content_type="text/plain; version=0.0.4; charset=utf-8")


def _document() -> dict:
    pairs = ModelPair.objects.filter(enabled=True)
    return openapi.document(models=list(pairs.values_list("slug", flat=True)),
                            max_tokens=pairs.aggregate(cap=Max("max_new_tokens_cap"))["cap"] or 1)


@api_view("GET")
async def openapi_document(request):
    return JsonResponse(await sync_to_async(_document)())


@api_view("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")
async def not_found(request):
    raise errors.NotFound(f"No route {request.path}; see GET /v1/openapi.json.")
