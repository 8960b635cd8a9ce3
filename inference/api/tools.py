"""Tool calls in OpenAI's shapes, on pairs whose chat template takes `tools` and asks for calls in the
Hermes format Qwen uses: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`.

The request's tools go to the chat template; `tool_choice` "required" or a named function holds the
answer to one call with a grammar (engines/grammar/grammar.py), so even a model that would not call gets the
call's shape and the function's parameters right; "auto" leaves the choice to the model and the
answer is read for calls; "none" describes no tools.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from inference import errors, json_input
from inference.engines.grammar.checks import require_compiled
from inference.engines.grammar.grammar import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, Grammar

NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_TOOLS = 64
CALL = re.compile(re.escape(TOOL_CALL_OPEN.strip()) + r"\s*(\{.*?\})\s*" + re.escape(TOOL_CALL_CLOSE.strip()), re.S)


@dataclass(frozen=True)
class ToolRequest:
    tools: list[dict]  # as OpenAI sends them, for the chat template
    grammar: Grammar | None  # one call forced (tool_choice required or named)


def parse(data: dict, *, requester: str) -> ToolRequest | None:
    """The request's tools and how the answer may use them; None without tools (or tool_choice none).
    `requester`: who asks, for the grammar checks (engines/grammar/checks.py)."""
    tools, choice = data.get("tools"), data.get("tool_choice")
    if tools is None:
        if choice not in (None, "none"):
            raise errors.InvalidValue("tool_choice needs tools.", param="tool_choice")
        return None
    if not isinstance(tools, list) or not 0 < len(tools) <= MAX_TOOLS:
        raise errors.InvalidType(f"tools must be a list of 1 to {MAX_TOOLS} functions.", param="tools")
    functions = {_function_name(tool, index, requester=requester): tool["function"]
                 for index, tool in enumerate(tools)}
    if len(functions) < len(tools):
        raise errors.InvalidValue("Two tools have the same name.", param="tools")
    parallel = data.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise errors.InvalidType("parallel_tool_calls must be a boolean.", param="parallel_tool_calls")
    if choice is None or choice == "auto":
        return ToolRequest(tools=tools, grammar=None)
    if choice == "none":
        return None
    if choice == "required":
        return ToolRequest(tools=tools, grammar=_one_call_of(functions))
    function = choice.get("function") if isinstance(choice, dict) else None
    named = function.get("name") if isinstance(function, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(named, str):
        raise errors.InvalidValue('tool_choice must be "none", "auto", "required" or {"type": "function", '
                                  '"function": {"name": ...}}.', param="tool_choice")
    if named not in functions:
        raise errors.InvalidValue(f"tool_choice names {named!r}, which is not among the tools.", param="tool_choice")
    return ToolRequest(tools=tools, grammar=_one_call_of({named: functions[named]}))


def _function_name(tool, index: int, *, requester: str) -> str:
    """The tool's function name, once the tool is checked: whether or not a call is forced, its parameters
    must compile as a JSON schema (the model may call it, and a later request may force the call)."""
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
        raise errors.InvalidType('Each tool must be {"type": "function", "function": {...}}.', param=f"tools[{index}]")
    name = function.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise errors.InvalidValue("A function's name is 1-64 letters, digits, _ or -.",
                                  param=f"tools[{index}].function.name")
    parameters = function.get("parameters", {})
    if not isinstance(parameters, dict):
        raise errors.InvalidType("A function's parameters must be a JSON schema object.",
                                 param=f"tools[{index}].function.parameters")
    require_compiled(Grammar(kind="json_schema", text=json.dumps(parameters or {"type": "object"})),
                     param=f"tools[{index}].function.parameters", requester=requester)
    return name


def _one_call_of(functions: dict[str, dict]) -> Grammar:
    calls = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
              "properties": {"name": {"const": name},
                             "arguments": function.get("parameters") or {"type": "object"}}}
             for name, function in functions.items()]
    return Grammar(kind="tool_call", text=json.dumps(calls[0] if len(calls) == 1 else {"anyOf": calls}))


def split_calls(text: str, *, ids: str) -> tuple[str | None, list[dict]]:
    """An answer's text without its tool calls (None if nothing else is left), and the calls in OpenAI's
    shape, with ids made from `ids` (the same however often the answer is read). A block that is not a
    call object is left in the text."""
    calls: list[dict] = []
    kept, last = [], 0
    for match in CALL.finditer(text):
        try:
            call = json_input.parse(match.group(1))
        except json_input.JsonInputError:  # model output: however deep it nests, left in the text
            continue
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            continue
        arguments = call.get("arguments", {})
        calls.append({"id": f"call_{ids}_{len(calls)}", "type": "function",
                      "function": {"name": call["name"],
                                   "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}})
        kept.append(text[last:match.start()])
        last = match.end()
    kept.append(text[last:])
    content = "".join(kept).rstrip() if calls else text  # rstrip: what CallStream streams is a prefix of it
    return content or None, calls


class CallStream:
    """A tool-reading answer's content streamed as it is written: the text before its first call, held back
    where a call may be beginning (a tail that could open `<tool_call>`) and at trailing whitespace, which the
    whole answer drops before a call. What is sent is always a prefix of split_calls' content; the calls
    and any content after them come whole once the answer ends (`rest`). The steps behind the text (their
    logprobs and provenance) go out with the next content let out, the rest with the end (`held_steps`)."""

    OPEN = TOOL_CALL_OPEN.strip()

    def __init__(self) -> None:
        self.text = ""
        self.sent = ""
        self.steps: list = []  # steps whose text has not gone out with content yet

    def content(self, piece: str, steps: list | None = None) -> str:
        """The content that `piece`, the answer's next text (from `steps`), lets out."""
        self.text += piece
        self.steps += steps or []
        start = self.text.find(self.OPEN)
        if start < 0:
            start = len(self.text) - next((n for n in range(len(self.OPEN) - 1, 0, -1)
                                           if self.text.endswith(self.OPEN[:n])), 0)
        safe = self.text[:start].rstrip()
        new, self.sent = safe[len(self.sent):], max(self.sent, safe, key=len)
        return new

    def rest(self, content: str | None) -> str:
        """What is left to send of the whole answer's content."""
        return (content or "")[len(self.sent):]

    def held_steps(self) -> list:
        """The steps not sent yet, once: to go out with the content they let out, or with the answer's end."""
        steps, self.steps = self.steps, []
        return steps
