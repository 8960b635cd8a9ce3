"""OpenAI request bodies -> what the shared generation path takes, or an error naming the field.

Everything is checked before anything is recorded or queued. Types and ranges of the decoding
options are checked by web.parse_options / start_generation, shared with the chat; what only
OpenAI's shapes have (prompt forms, messages, stream options, unsupported features) is checked here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest
from django.http.request import RawPostDataException

from inference import errors, json_input
from inference.api import tools
from inference.engines.grammar.checks import require_compiled
from inference.engines.grammar.grammar import Grammar
from inference.models import ModelPair
from inference.serving import reasons, web

CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}

# OpenAI parameters this server cannot honour: each is accepted only with its neutral values.
NEUTRAL = {
    "n": (1,),
    "best_of": (1,),
    "num_beams": (1,),
    "use_beam_search": (False,),
    "echo": (False,),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "suffix": ("",),
}
WHY_NOT = {
    "n": "one choice per request",
    "best_of": "no beam search (speculative decoding samples one sequence)",
    "num_beams": "no beam search (speculative decoding samples one sequence)",
    "use_beam_search": "no beam search (speculative decoding samples one sequence)",
}


@dataclass(frozen=True)
class ApiRequest:
    """A checked request: what to start and how to answer."""

    pair: ModelPair
    prompt: str
    options: web.GenerationOptions
    chat: bool
    stream: bool
    include_usage: bool
    background: bool
    tool_calls: bool = False  # the answer is read for tool calls (tools were given)
    speculation_steps: bool = False  # each choice says which text the draft proposed and which the main wrote

    @property
    def start_kwargs(self) -> dict:
        """web.start_generation's arguments; the chat template already holds the special tokens."""
        return {"pair": self.pair, "prompt": self.prompt, "options": self.options,
                "add_special_tokens": not self.chat,
                "reply": {"tool_calls": self.tool_calls, "speculation_steps": self.speculation_steps}}


def json_body(request: HttpRequest) -> dict:
    """The request's JSON object, within json_input's bounds (NaN, Infinity and deep nesting refused)."""
    try:
        raw = request.body
    except (RequestDataTooBig, RawPostDataException):
        raise errors.RequestTooLarge("The request body is too large.") from None
    try:
        data = json_input.parse(raw)
    except json_input.JsonInputError as exc:
        raise errors.InvalidJson(f"The body is not valid JSON: {exc}.") from None
    if not isinstance(data, dict):
        raise errors.InvalidJson("The body must be a JSON object.")
    return data


def _flag(data: dict, name: str) -> bool:
    value = data.get(name)
    if value is not None and not isinstance(value, bool):
        raise errors.InvalidType(f"{name} must be a boolean, not {type(value).__name__}.", param=name)
    return bool(value)


def _check_supported(data: dict) -> None:
    for name, neutral in NEUTRAL.items():
        value = data.get(name)
        if value is None or any(value == ok and type(value) is type(ok) for ok in neutral):
            continue
        reason = WHY_NOT.get(name, "not supported by this server")
        raise errors.UnsupportedValue(f"{name}={json.dumps(value)[:40]} is not supported: {reason}.", param=name)
    for name in ("functions", "logit_bias"):
        if data.get(name):
            raise errors.UnsupportedValue(f"{name} is not supported by this server.", param=name)


def _grammar(data: dict) -> tuple[Grammar, str] | None:
    """The grammar the answer is held to, and the field that gave it: OpenAI's response_format
    (json_object, json_schema), or this server's `regex` / `grammar` (EBNF, xgrammar's dialect)."""
    given = [name for name in ("regex", "grammar") if data.get(name) is not None]
    response_format = data.get("response_format")
    if response_format is not None:
        if not isinstance(response_format, dict) or not isinstance(response_format.get("type"), str):
            raise errors.InvalidType("response_format must be an object with a type.", param="response_format")
        if response_format["type"] != "text":
            given.insert(0, "response_format")
    if len(given) > 1:
        raise errors.InvalidValue(f"{' and '.join(given)} each set the answer's format: send one.", param=given[1])
    if not given:
        return None
    name = given[0]
    if name == "response_format":
        return Grammar(kind="json_schema", text=_json_schema(data["response_format"])), name
    text = data[name]
    if not isinstance(text, str) or not text.strip():
        raise errors.InvalidType(f"{name} must be a non-empty string.", param=name)
    return Grammar(kind="regex" if name == "regex" else "ebnf", text=text), name


def _json_schema(response_format: dict) -> str:
    kind = response_format["type"]
    if kind == "json_object":
        return json.dumps({"type": "object"})
    if kind != "json_schema":
        raise errors.InvalidValue(f"response_format.type must be text, json_object or json_schema; got "
                                  f"{json.dumps(kind)[:40]}.", param="response_format.type")
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict):
        raise errors.MissingParameter("response_format.json_schema must be an object with a schema.",
                                      param="response_format.json_schema")
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise errors.InvalidType("response_format.json_schema.schema must be a JSON schema object.",
                                 param="response_format.json_schema.schema")
    return json.dumps(schema)


MAX_TOP_LOGPROBS = {True: 20, False: 5}  # chat's top_logprobs, completions' logprobs: OpenAI's bounds


def _logprobs(data: dict, *, chat: bool) -> tuple[bool, int]:
    """Whether the answer carries its tokens' log probabilities, and how many alternatives at each position
    (chat: logprobs true and top_logprobs N; completions: logprobs N)."""
    value = data.get("logprobs")
    if chat:
        if value is not None and not isinstance(value, bool):
            raise errors.InvalidType("logprobs must be a boolean.", param="logprobs")
        top = data.get("top_logprobs")
        if top is not None and (not isinstance(top, int) or isinstance(top, bool)):
            raise errors.InvalidType("top_logprobs must be an integer.", param="top_logprobs")
        if top and not value:
            raise errors.InvalidValue("top_logprobs needs logprobs: true.", param="top_logprobs")
        return bool(value), _bounded_top(top or 0, param="top_logprobs", chat=chat)
    if value is None:
        return False, 0
    if not isinstance(value, int) or isinstance(value, bool):
        raise errors.InvalidType("logprobs must be an integer (how many alternatives at each position; 0: none).",
                                 param="logprobs")
    return True, _bounded_top(value, param="logprobs", chat=chat)


def _bounded_top(top: int, *, param: str, chat: bool) -> int:
    if not 0 <= top <= MAX_TOP_LOGPROBS[chat]:
        raise errors.InvalidValue(f"{param} must be between 0 and {MAX_TOP_LOGPROBS[chat]}.", param=param)
    return top


def _checked_grammar(data: dict, *, tool_call: Grammar | None, requester: str) -> dict:
    """GenerationOptions' grammar fields, once the library compiles the grammar within the budget
    (engines/grammar/checks.py: an uncompilable one would fail every request in its batch). `tool_call`: the one
    a forced tool call holds the answer to; `requester`: who asks (engines/grammar/checks.py keeps one from
    holding every checker)."""
    found = _grammar(data)
    if tool_call is not None:
        if found is not None:
            raise errors.InvalidValue(f"tool_choice and {found[1]} each set the answer's format: send one.",
                                      param=found[1])
        found = tool_call, "tools"
    if found is None:
        return {}
    grammar, name = found
    param = "response_format.json_schema.schema" if name == "response_format" else name
    require_compiled(grammar, param=param, requester=requester)
    return {"grammar_kind": grammar.kind, "grammar_text": grammar.text}


def _completion_prompt(data: dict) -> str:
    prompt = data.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if prompt is None:
        raise errors.MissingParameter("prompt is required.", param="prompt")
    if isinstance(prompt, list):
        raise errors.InvalidType("prompt must be one string (no batches or token ids; send one request per prompt).",
                    param="prompt")
    if not isinstance(prompt, str):
        raise errors.InvalidType(f"prompt must be a string, not {type(prompt).__name__}.", param="prompt")
    return prompt


def _message_text(content, index: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(part["text"] for part in content)
    raise errors.InvalidType("A message's content must be a string or a list of text parts.",
                param=f"messages[{index}].content")


def _chat_messages(data: dict) -> list[dict]:
    messages = data.get("messages")
    if messages is None:
        raise errors.MissingParameter("messages is required.", param="messages")
    if not isinstance(messages, list) or not messages:
        raise errors.InvalidType("messages must be a non-empty list.", param="messages")
    turns: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise errors.InvalidType("Each message must be an object.", param=f"messages[{index}]")
        role = message.get("role")
        if not isinstance(role, str) or role not in CHAT_ROLES:  # an object or a list cannot be looked up
            raise errors.InvalidValue(f"role must be one of {', '.join(CHAT_ROLES)}; got {json.dumps(role)[:40]}.",
                        param=f"messages[{index}].role")
        calls = _tool_calls(message, index) if role == "assistant" else []
        if role == "tool" and not any(turn.get("tool_calls") for turn in turns):
            raise errors.InvalidValue("A tool message answers a tool call: an earlier assistant message must make "
                                      "one (its tool_calls).", param=f"messages[{index}].role")
        content = message.get("content")
        turn = {"role": CHAT_ROLES[role], "content": "" if calls and content is None else _message_text(content, index)}
        turns.append({**turn, "tool_calls": calls} if calls else turn)
    if not any(turn["content"].strip() or turn.get("tool_calls") for turn in turns):
        raise errors.EmptyPrompt("The messages hold no text.", param="messages")
    return turns


def _tool_calls(message: dict, index: int) -> list[dict]:
    """An assistant turn's earlier tool calls, checked (each names a function and its arguments are a
    JSON object in text, as OpenAI sends them back) and in the shape chat templates take: arguments
    as an object."""
    calls = message.get("tool_calls")
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise errors.InvalidType("tool_calls must be a list.", param=f"messages[{index}].tool_calls")
    checked = []
    for number, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        where = f"messages[{index}].tool_calls[{number}]"
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise errors.InvalidType("A tool call must be {\"type\": \"function\", \"function\": {\"name\", "
                                     "\"arguments\"}}.", param=where)
        text = function.get("arguments", "{}")
        try:
            arguments = json_input.parse(text) if isinstance(text, str) else None
        except json_input.JsonInputError as exc:
            raise errors.InvalidValue(f"A tool call's arguments must be a JSON object in a string: {exc}.",
                                      param=f"{where}.function.arguments") from None
        if not isinstance(arguments, dict):
            raise errors.InvalidValue("A tool call's arguments must be a JSON object in a string.",
                                      param=f"{where}.function.arguments")
        checked.append({"type": "function", "function": {"name": function["name"], "arguments": arguments}})
    return checked


def _check_alternatives(*, pair: ModelPair, options: web.GenerationOptions, param: str) -> None:
    """Alternatives come from the own engine alone (the library computes none): it needs the pair's draft
    model, and takes K rather than a confidence threshold."""
    if not pair.draft_dir:
        raise errors.InvalidValue(f"{param} needs a pair with a draft model: {reasons.ALTERNATIVES}.", param=param)
    if options.assistant_confidence_threshold is not None:
        raise errors.InvalidValue(f"{param} cannot be combined with assistant_confidence_threshold: "
                                  f"{reasons.ALTERNATIVES}, which takes num_assistant_tokens.", param=param)


def parse(data: dict, *, chat: bool, requester: str) -> ApiRequest:
    """A checked completions (chat=False) or chat completions request body, sent by `requester` (its API key).
    Reads the database and the pair's tokenizer: call it off the event loop."""
    model = data.get("model")
    if not isinstance(model, str) or not model:
        error = errors.MissingParameter if model is None else errors.InvalidType
        raise error("model must name a pair (see GET /v1/models).", param="model")
    _check_supported(data)
    stream = _flag(data, "stream")
    stream_options = data.get("stream_options")
    if stream_options is not None:
        if not isinstance(stream_options, dict):
            raise errors.InvalidType("stream_options must be an object.", param="stream_options")
        if not stream:
            raise errors.InvalidValue("stream_options is only allowed with stream: true.", param="stream_options")
    include_usage = (stream_options or {}).get("include_usage")
    if include_usage is not None and not isinstance(include_usage, bool):
        raise errors.InvalidType("stream_options.include_usage must be a boolean.",
                                 param="stream_options.include_usage")
    background = _flag(data, "background")
    if not chat and (data.get("tools") or data.get("tool_choice")):
        raise errors.InvalidValue("Tools are for /chat/completions.", param="tools")
    tool_request = tools.parse(data, requester=requester) if chat else None
    logprobs, top_logprobs = _logprobs(data, chat=chat)
    grammar = _checked_grammar(data, tool_call=tool_request.grammar if tool_request else None, requester=requester)
    messages = _chat_messages(data) if chat else []
    completion_prompt = "" if chat else _completion_prompt(data)
    speculation_steps = _flag(data, "speculation_steps")
    # The API's own checks are done: what the chat shares (decoding options, the pair, its template) follows.
    options = replace(web.parse_options(data, max_tokens_names=("max_tokens", "max_completion_tokens")),
                      logprobs=logprobs, top_logprobs=top_logprobs, **grammar)
    pair = web.find_pair(slug=model)
    if top_logprobs:
        _check_alternatives(pair=pair, options=options, param="top_logprobs" if chat else "logprobs")
    if chat:
        prompt = web.chat_prompt(pair=pair, messages=messages, tools=tool_request.tools if tool_request else None)
    else:
        prompt = completion_prompt
    return ApiRequest(pair=pair, prompt=prompt, options=options, chat=chat, stream=stream,
                      include_usage=bool(include_usage), background=background, tool_calls=tool_request is not None,
                      speculation_steps=speculation_steps)
