"""The OpenAPI 3 document of the REST API, served at GET /v1/openapi.json.

Built per request so `model` lists the pairs registered now and `max_tokens` their largest cap.
The fuzz test in tests/test_api_fuzz.py generates requests from this document.
"""

from __future__ import annotations

from typing import Any

from inference import limits
from inference.api.ids import AnswerIdConverter
from inference.serving.reasons import Reason

DESCRIPTION = """\
OpenAI-compatible completions and chat completions served by speculative decoding (a draft model
proposes tokens, the main model verifies them). `model` names a registered pair.

Every route under `/v1/` is also served under `/v3/`, as OpenVINO Model Server names them, so an
OVMS client works unchanged.

**Speculation per request.** `num_assistant_tokens` (K, tokens the draft proposes per step) or
`assistant_confidence_threshold` (the draft proposes while its confidence stays above it), never
both; `speculative: false` runs the main model alone for this request. With the `openai` Python
client pass them in `extra_body`. Every `usage` carries the request's speculative figures:
`draft_tokens`, `accepted_tokens`, `acceptance_rate`, `mean_accepted_length` (tokens per
verifying main step, the main's own token included), `main_steps`, and `speculative_mode` with
`speculative_reason`: how the answer was served (`draft`, `draft-exact-sampling`, `prompt-lookup`,
`off`; `draft-inexact-sampling` only where a pair allows openvino-genai's own sampling with a draft,
which does not draw from the main model's distribution).

**Streaming and resuming.** `stream: true` answers Server-Sent Events in OpenAI's chunk format,
ending with `data: [DONE]`. Each event carries `id:`; a client that lost the connection gets the
rest with `GET /v1/completions/{generation_id}/events` (or `/v1/chat/completions/...`) and the
header `Last-Event-ID: <last id it received>`, without loss or repetition. `{generation_id}` is the
answer's `id` as returned (`cmpl-…`, `chatcmpl-…`) or the bare uuid of the `X-Generation-Id` header.

**Disconnecting cancels.** When the client that started a generation disconnects, the generation
is stopped at the worker's next step. A request with `background: true` keeps running instead (so
it can be resumed after a dropped connection); stop it with `POST .../{generation_id}/cancel`.
A stopped generation ends with `finish_reason: "abort"`.

**Access.** Generation routes need `Authorization: Bearer <key>` (keys are created in the admin and
shown once); each key has a limit of generations in flight, past which requests answer 429.
Errors use OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
"""

ERROR = {"$ref": "#/components/schemas/Error"}
TOOL_CALL = {"type": "object", "properties": {
    "id": {"type": "string"}, "type": {"type": "string", "enum": ["function"]},
    "function": {"type": "object", "properties": {"name": {"type": "string"},
                                                  "arguments": {"type": "string", "description": "JSON object"}}}}}
LOGPROBS = ("Each token's log probability under the main model's raw distribution (before temperature), the "
            "same with or without the draft.")
ALTERNATIVES = ("The most likely tokens at each position, with their log probabilities: computed by the exact "
                "engine, which then serves the request (pairs with a draft model; not with a confidence threshold).")


def _errors(*statuses: int) -> dict:
    meaning = {400: "Invalid request; `error.param` names the field.", 401: "Missing, wrong or revoked API key.",
               404: "Unknown model or generation.", 413: "Body too large.",
               429: "This key has too many generations in flight.",
               503: "No worker can serve the pair now, the generation failed, or the database did not answer."}
    return {str(status): {"description": meaning[status], "content": {"application/json": {"schema": ERROR}}}
            for status in statuses}


def _sampling(*, models: list[str], max_tokens: int) -> dict:
    model: dict[str, Any] = {"type": "string", "description": "A registered pair (GET /v1/models)."}
    if models:
        model["enum"] = models
    tokens = {"type": "integer", "minimum": 1, "maximum": max_tokens, "nullable": True,
              "description": "New tokens at most; the pair's cap bounds it. Default: min(cap, 256)."}
    return {
        "model": model,
        "max_tokens": tokens,
        "max_completion_tokens": {**tokens, "description": "Same as max_tokens (OpenAI's newer name)."},
        "temperature": {"type": "number", "minimum": 0, "maximum": limits.TEMPERATURE_MAX, "nullable": True,
                        "description": "0 (default) is greedy decoding: the main model's own greedy output."},
        "top_p": {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 1, "nullable": True},
        "top_k": {"type": "integer", "minimum": 0, "maximum": limits.TOP_K_MAX, "nullable": True,
                  "description": "0 means no top-k."},
        "repetition_penalty": {"type": "number", "minimum": 0, "exclusiveMinimum": True,
                               "maximum": limits.REPETITION_PENALTY_MAX, "nullable": True,
                               "description": "Above 1, tokens already in the prompt or the answer are made less "
                                              "likely (OVMS, vLLM). Default 1: none."},
        "seed": {"type": "integer", "minimum": 0, "maximum": limits.MAX_SEED, "nullable": True},
        "stop": {"nullable": True, "oneOf": [
            {"type": "string", "minLength": 1, "maxLength": limits.MAX_STOP_LENGTH},
            {"type": "array", "maxItems": limits.MAX_STOP_STRINGS,
             "items": {"type": "string", "minLength": 1, "maxLength": limits.MAX_STOP_LENGTH}}]},
        "ignore_eos": {"type": "boolean", "nullable": True},
        "stream": {"type": "boolean", "nullable": True},
        "stream_options": {"type": "object", "nullable": True, "description": "Only with stream: true.",
                           "properties": {"include_usage": {"type": "boolean", "nullable": True}}},
        "num_assistant_tokens": {"type": "integer", "minimum": limits.K_MIN, "maximum": limits.K_MAX, "nullable": True,
                                 "description": "Tokens the draft proposes per step (OVMS). Excludes "
                                                "assistant_confidence_threshold."},
        "assistant_confidence_threshold": {
            "type": "number", "minimum": limits.FLOAT32_TINY, "maximum": 1, "exclusiveMaximum": True,
            "nullable": True, "description": "The draft proposes while its confidence stays above this (OVMS). "
                                             "Excludes num_assistant_tokens; needs a draft model."},
        "speculative": {"type": "boolean", "nullable": True,
                        "description": "false: the main model alone for this request (default true)."},
        "background": {"type": "boolean", "nullable": True,
                       "description": "true: the generation keeps running if the client disconnects."},
        "speculation_steps": {"type": "boolean", "nullable": True,
                              "description": "true: each choice (and each streamed chunk) carries speculation_steps, "
                                             "where its text came from, step by step."},
        "n": {"type": "integer", "enum": [1], "nullable": True, "description": "One choice per request."},
        "response_format": {
            "type": "object", "nullable": True, "required": ["type"],
            "description": "json_object or json_schema: every token is held to the schema (always strict). "
                           "Greedy answers stay the main model's own; sampled ones run on the main alone.",
            "properties": {
                "type": {"type": "string", "enum": ["text", "json_object", "json_schema"]},
                "json_schema": {"type": "object", "required": ["schema"], "properties": {
                    "name": {"type": "string"}, "description": {"type": "string"},
                    "schema": {"type": "object"}, "strict": {"type": "boolean", "nullable": True}}},
            }},
        "regex": {"type": "string", "minLength": 1, "nullable": True,
                  "description": "The answer matches this regular expression (xgrammar's dialect: no lookaround). "
                                 "Excludes response_format and grammar."},
        "grammar": {"type": "string", "minLength": 1, "nullable": True,
                    "description": "The answer follows this EBNF grammar (xgrammar's dialect, from rule root). "
                                   "Excludes response_format and regex."},
    }


def _usage() -> dict:
    figure = {"nullable": True, "description": "null when the request ran without speculation."}
    return {
        "type": "object",
        "required": ["prompt_tokens", "completion_tokens", "total_tokens", "draft_tokens", "accepted_tokens",
                     "acceptance_rate", "mean_accepted_length", "main_steps", "speculative_mode",
                     "speculative_reason", "speculative_k", "speculative_route", "speculative_reason_codes"],
        "properties": {
            "prompt_tokens": {"type": "integer"}, "completion_tokens": {"type": "integer"},
            "prompt_tokens_details": {
                "type": "object", "properties": {"cached_tokens": {"type": "integer"}},
                "description": "cached_tokens: prompt tokens read from the prefix cache, not prefilled again (the own "
                               "engine's; 0 on the library's pipeline, which does not say)."},
            "total_tokens": {"type": "integer"},
            "draft_tokens": {"type": "integer", **figure,
                             "description": "Tokens proposed, by the draft model and the n-gram lookup (null in the "
                                            "confidence-threshold mode)."},
            "accepted_tokens": {"type": "integer", **figure},
            "ngram_draft_tokens": {"type": "integer", **figure,
                                   "description": "Of draft_tokens, those the n-gram lookup proposed (the answer's own "
                                                  "history read where it repeats): the rest are the draft model's."},
            "ngram_accepted_tokens": {"type": "integer", **figure,
                                      "description": "Of accepted_tokens, the n-gram lookup's."},
            "ngram_draft_steps": {"type": "integer", **figure,
                                  "description": "Main steps that verified the n-gram lookup's proposals."},
            "undrafted_steps": {"type": "integer", **figure,
                                "description": "Main steps of a speculating answer that verified no proposal: its "
                                               "drafters sat out the stretches where they did not pay for themselves "
                                               "(docs/speculation.md#drafters-that-do-not-pay)."},
            "acceptance_rate": {"type": "number", **figure},
            "mean_accepted_length": {"type": "number", **figure},
            "main_steps": {"type": "integer", "description": "Main-model steps (the prefill included)."},
            "speculative_mode": {"type": "string", "enum": ["draft", "draft-exact-sampling", "draft-inexact-sampling",
                                                            "prompt-lookup", "off"],
                                 "description": "How the answer was served."},
            "speculative_reason": {"type": "string", "description": "Why this mode and K (asked, measured best "
                                                                    "at this load, the pair's default), for people."},
            "speculative_route": {"type": "string", "description": "The engine that served the answer: "
                                  f"{', '.join(route.value for route in limits.Route)} (empty on answers older "
                                  "than routes)."},
            "speculative_reason_codes": {"type": "array", "items": {"type": "string", "enum": [
                reason.value for reason in Reason]}, "description": "speculative_reason's reasons as codes, in "
                                         "the order they were decided (docs/speculation.md#routes-and-reasons)."},
            "speculative_k": {"type": "integer", "nullable": True,
                              "description": "K used: tokens the draft proposed per step (null: threshold or off)."},
        },
    }


def _completion(chat: bool) -> dict:
    choice = {"type": "object", "required": ["index", "finish_reason"], "properties": {
        "index": {"type": "integer"},
        "finish_reason": {"type": "string", "enum": ["stop", "length", "abort", "tool_calls"]},
        "logprobs": {"nullable": True},
        "speculation_steps": {"type": "array", "description": "Only when asked: per main step, the draft tokens "
                              "the main accepted and the token the main chose itself (speculation off: all "
                              "\"main\").", "items": {"type": "object", "properties": {
                                  "draft": {"type": "string"}, "main": {"type": "string"}}}},
        **({"message": {"type": "object", "properties": {"role": {"type": "string"},
                                                          "content": {"type": "string", "nullable": True},
                                                          "tool_calls": {"type": "array", "items": TOOL_CALL}}}}
           if chat else {"text": {"type": "string"}}),
    }}
    return {"type": "object", "required": ["id", "object", "created", "model", "choices", "usage"], "properties": {
        "id": {"type": "string"}, "object": {"type": "string"}, "created": {"type": "integer"},
        "model": {"type": "string"}, "choices": {"type": "array", "items": choice},
        "usage": {"$ref": "#/components/schemas/Usage"},
    }}


def _generate(chat: bool) -> dict:
    name = "ChatCompletion" if chat else "Completion"
    return {"post": {
        "operationId": "createChatCompletion" if chat else "createCompletion",
        "summary": "Chat completion (the pair's chat template applied)" if chat else "Text completion",
        "security": [{"bearerAuth": []}],
        "requestBody": {"required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{name}Request"}}}},
        "responses": {
            "200": {"description": "The completion, or with stream: true its chunks as Server-Sent Events.",
                    "headers": {"X-Generation-Id": {"schema": {"type": "string", "format": "uuid"}}},
                    "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}},
                                "text/event-stream": {"schema": {"type": "string"}}}},
            **_errors(400, 401, 404, 413, 429, 503),
        },
    }}


def _generation_route(chat: bool, action: str) -> dict:
    kind = "chat completion" if chat else "completion"
    params = [{"name": "generation_id", "in": "path", "required": True,
               "description": "the answer's id as returned (cmpl-<uuid>, chatcmpl-<uuid>) or the bare uuid",
               "schema": {"type": "string", "pattern": f"^{AnswerIdConverter.regex}$"}}]
    if action == "events":
        params += [
            {"name": "Last-Event-ID", "in": "header", "required": False, "schema": {"type": "string"},
             "description": "The id of the last event received; the stream resumes after it (default: start)."},
            {"name": "include_usage", "in": "query", "required": False, "schema": {"type": "boolean"},
             "description": "End with a usage chunk, as stream_options.include_usage does."},
        ]
        operation = {"get": {
            "operationId": f"{'chat' if chat else 'completion'}Events",
            "summary": f"Resume a streamed {kind} after Last-Event-ID",
            "description": "Disconnecting from this stream does not stop the generation.",
            "responses": {"200": {"description": "The remaining chunks.",
                                  "content": {"text/event-stream": {"schema": {"type": "string"}}}},
                          **_errors(400, 401, 404)}}}
    else:
        operation = {"post": {
            "operationId": f"{'chat' if chat else 'completion'}Cancel",
            "summary": f"Stop a {kind} at the worker's next step (its stream ends with finish_reason abort)",
            "responses": {"200": {"description": "Stop requested.", "content": {"application/json": {"schema": {
                "type": "object", "properties": {"id": {"type": "string"}, "status": {"type": "string"}}}}}},
                          **_errors(401, 404)}}}
    method = next(iter(operation.values()))
    method.update(parameters=params, security=[{"bearerAuth": []}])
    return operation


def _open_get(operation_id: str, summary: str, content_type: str = "application/json") -> dict:
    return {"get": {"operationId": operation_id, "summary": summary, "responses": {
        "200": {"description": summary, "content": {content_type: {"schema": {
            "type": "string" if content_type.startswith("text/") else "object"}}}}}}}


def document(*, models: list[str], max_tokens: int) -> dict:
    sampling = _sampling(models=models, max_tokens=max_tokens)
    text_part = {"type": "object", "required": ["type", "text"],
                 "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}}}
    message = {"type": "object", "required": ["role"], "properties": {
        "role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]},
        "content": {"nullable": True, "oneOf": [{"type": "string"}, {"type": "array", "items": text_part}]},
        "tool_calls": {"type": "array", "items": TOOL_CALL, "description": "An assistant turn's calls, sent back."},
        "tool_call_id": {"type": "string"},
    }}
    function = {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"}, "description": {"type": "string"},
        "parameters": {"type": "object"}}}
    tools = {
        "tools": {"type": "array", "minItems": 1, "maxItems": 64, "nullable": True, "items": {
            "type": "object", "required": ["type", "function"],
            "properties": {"type": {"type": "string", "enum": ["function"]}, "function": function}},
            "description": "Functions the model may call, described by the pair's chat template (calls in "
                           "the <tool_call> format Qwen's templates ask for)."},
        "tool_choice": {"nullable": True, "description": "none, auto (default with tools), required, or a named "
                                                         "function: required and named hold the answer to one call.",
                        "oneOf": [{"type": "string", "enum": ["none", "auto", "required"]},
                                  {"type": "object", "required": ["type", "function"], "properties": {
                                      "type": {"type": "string", "enum": ["function"]},
                                      "function": {"type": "object", "required": ["name"],
                                                   "properties": {"name": {"type": "string"}}}}}]},
        "parallel_tool_calls": {"type": "boolean", "nullable": True},
    }
    return {
        "openapi": "3.0.3",
        "info": {"title": "SpecChat REST API", "version": "1.0.0", "description": DESCRIPTION},
        "paths": {
            "/v1/completions": _generate(chat=False),
            "/v1/chat/completions": _generate(chat=True),
            "/v1/completions/{generation_id}/events": _generation_route(False, "events"),
            "/v1/chat/completions/{generation_id}/events": _generation_route(True, "events"),
            "/v1/completions/{generation_id}/cancel": _generation_route(False, "cancel"),
            "/v1/chat/completions/{generation_id}/cancel": _generation_route(True, "cancel"),
            "/v1/models": {"get": {**_open_get("listModels", "The enabled pairs, OpenAI's model list with their "
                                                             "state.")["get"], "security": [{"bearerAuth": []}]}},
            "/v1/config": _open_get("getConfig", "Each pair's state (AVAILABLE, LOADING, UNAVAILABLE), OVMS's "
                                                 "shape, and its main's and draft's devices; with an API key, its "
                                                 "calibration per host too."),
            "/v1/openapi.json": _open_get("getOpenApi", "This document."),
            "/health": _open_get("health", "200 when the database and Redis answer."),
            "/metrics": _open_get("metrics", "Prometheus metrics, named like vLLM's.", "text/plain"),
        },
        "components": {
            "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {"type": "object", "required": ["error"], "properties": {"error": {
                    "type": "object", "required": ["message", "type", "param", "code"], "properties": {
                        "message": {"type": "string"}, "type": {"type": "string"},
                        "param": {"type": "string", "nullable": True}, "code": {"type": "string", "nullable": True},
                    }}}},
                "CompletionRequest": {"type": "object", "required": ["model", "prompt"], "properties": {
                    **sampling, "prompt": {"type": "string", "minLength": 1, "description": "One prompt."},
                    "logprobs": {"type": "integer", "minimum": 0, "maximum": 5, "nullable": True,
                                 "description": f"{LOGPROBS} Above 0: {ALTERNATIVES}"}}},
                "ChatCompletionRequest": {"type": "object", "required": ["model", "messages"], "properties": {
                    **sampling, **tools, "messages": {"type": "array", "minItems": 1, "items": message},
                    "logprobs": {"type": "boolean", "nullable": True, "description": LOGPROBS},
                    "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20, "nullable": True,
                                     "description": f"{ALTERNATIVES} Needs logprobs: true."}}},
                "Usage": _usage(),
                "Completion": _completion(chat=False),
                "ChatCompletion": _completion(chat=True),
            },
        },
    }
