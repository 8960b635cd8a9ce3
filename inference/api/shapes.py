"""OpenAI's response, chunk, usage and error objects, built from generations and their events."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from inference import errors
from inference.api.tools import CallStream, split_calls
from inference.limits import FinishReason

# What OpenAI's usage lacks: the speculative figures of the request (null without speculation).
SPECULATIVE_USAGE = ("draft_tokens", "accepted_tokens", "acceptance_rate", "mean_accepted_length", "main_steps",
                     "ngram_draft_tokens", "ngram_accepted_tokens", "ngram_draft_steps", "undrafted_steps",
                     "speculative_mode", "speculative_reason", "speculative_k", "speculative_route",
                     "speculative_reason_codes")
# stopped by the client: vLLM's name; "stop" and "length" are OpenAI's own
FINISH_REASONS: dict[str, str] = {FinishReason.STOPPED: "abort"}


def error_body(exc: errors.ServiceError) -> dict:
    kind = {401: "authentication_error", 404: "invalid_request_error", 429: "rate_limit_error"}.get(
        exc.status, "server_error" if exc.status >= 500 else "invalid_request_error")
    return {"error": {"message": exc.message, "type": kind, "param": exc.param, "code": exc.code}}


def usage(record: Mapping) -> dict:
    """OpenAI's usage plus the speculative figures, from a done event or a Generation's fields."""
    prompt, completion = record["prompt_tokens"], record["completion_tokens"]
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": record.get("cached_tokens") or 0},
            **{name: record.get(name) for name in SPECULATIVE_USAGE}}


@dataclass(frozen=True)
class Shape:
    """How one generation looks to an OpenAI client: a chat completion or a text completion."""

    chat: bool
    model: str
    generation_id: str
    created: int
    logprobs: bool = False  # the request asked for its tokens' log probabilities
    tool_calls: bool = False  # the answer is read for tool calls (api/tools.py): its calls come whole
    speculation_steps: bool = False  # each choice carries its steps: the draft's accepted text, the main's own

    def _calls(self, text: str) -> tuple[str | None, list[dict]]:
        return split_calls(text, ids=self.generation_id.replace("-", "")[:16])

    def _logprobs(self, steps: list) -> dict | None:
        """OpenAI's logprobs object for these steps' tokens (the third element of a step, when asked): each
        token's log probability, and its alternatives' when top_logprobs was asked (the own engine's)."""
        if not self.logprobs:
            return None
        scored = [entry for step in steps for entry in (step[2] if len(step) > 2 else [])]
        if self.chat:
            return {"content": [{"token": token, "logprob": logprob, "bytes": list(token.encode()),
                                 "top_logprobs": [{"token": alt, "logprob": alt_logprob, "bytes": list(alt.encode())}
                                                  for alt, alt_logprob in (rest[0] if rest else [])]}
                                for token, logprob, *rest in scored]}
        asked_alternatives = any(len(entry) > 2 for entry in scored)
        return {"tokens": [token for token, *_ in scored], "token_logprobs": [logprob for _, logprob, *_ in scored],
                "top_logprobs": [dict(rest[0]) if rest else {} for _, _, *rest in scored] if asked_alternatives
                else None, "text_offset": None}

    def _provenance(self, steps: list | None) -> dict:
        """Where each piece of the text came from, per main step: the draft tokens the main accepted ("draft")
        and the one token the main chose itself ("main"); opt-in (`speculation_steps`)."""
        if not self.speculation_steps or steps is None:
            return {}
        return {"speculation_steps": [{"draft": draft, "main": main} for draft, main, *_ in steps]}

    @property
    def id(self) -> str:
        return f"{'chatcmpl' if self.chat else 'cmpl'}-{self.generation_id}"

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def response(self, *, text: str, finish_reason: str, usage: dict, steps: list) -> dict:
        if self.chat:
            content, calls = self._calls(text) if self.tool_calls else (text, [])
            message = {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
            choice = {"index": 0, "message": message}
            finish_reason = "tool_calls" if calls and finish_reason == FinishReason.STOP else finish_reason
        else:
            choice = {"index": 0, "text": text}
        choice.update(logprobs=self._logprobs(steps), finish_reason=FINISH_REASONS.get(finish_reason, finish_reason),
                      **self._provenance(steps))
        return {**self._head("chat.completion" if self.chat else "text_completion"), "choices": [choice],
                "usage": usage}

    def chunk(self, *, delta: dict | None = None, text: str = "", finish_reason: str | None = None,
              with_usage: bool = False, steps: list | None = None) -> dict:
        choice = {"index": 0, "delta": delta or {}} if self.chat else {"index": 0, "text": text}
        choice.update(logprobs=self._logprobs(steps) if steps else None,
                      finish_reason=FINISH_REASONS.get(finish_reason or "", finish_reason), **self._provenance(steps))
        chunk = {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [choice]}
        if with_usage:
            chunk["usage"] = None  # OpenAI sends null on every chunk but the last when usage is asked for
        return chunk

    def payloads(self, event: dict, *, include_usage: bool, calls: CallStream | None = None) -> list[dict | str]:
        """What one transport event becomes on an OpenAI stream; "[DONE]" closes it. `calls`: the stream's
        reading of a tool-reading answer so far (one per stream, fed every event from the first)."""
        kind = event["type"]
        if kind == "start":
            role = self.chunk(delta={"role": "assistant", "content": ""}, with_usage=include_usage)
            return [role] if self.chat else []
        if kind == "delta":
            text = "".join(draft + main for draft, main, *_ in event["steps"])
            if self.tool_calls:
                calls = calls or CallStream()
                if not (content := calls.content(text, event["steps"])):
                    return []
                return [self.chunk(delta={"content": content}, with_usage=include_usage, steps=calls.held_steps())]
            return [self.chunk(delta={"content": text}, text=text, with_usage=include_usage, steps=event["steps"])]
        if kind == "done":
            out, finish_reason = self._whole_answer(event, include_usage=include_usage, calls=calls)
            last = self.chunk(finish_reason=finish_reason, with_usage=include_usage)
            out.append(last)
            if include_usage:
                out.append({**self._head(last["object"]), "choices": [], "usage": usage(event)})
            return [*out, "[DONE]"]
        if kind == "error":
            return [error_body(errors.GenerationFailed(
                f"The generation failed: {event['message']}")), "[DONE]"]
        return []

    def _whole_answer(self, done: dict, *, include_usage: bool,
                      calls: CallStream | None) -> tuple[list[dict | str], str]:
        """A tool-reading answer's content not streamed yet and its calls, as it ends (the done event holds its
        text), and its finish reason; nothing for other answers (their text came in deltas)."""
        if not self.tool_calls:
            return [], done["finish_reason"]
        content, found = self._calls(done["text"])
        calls = calls or CallStream()
        rest, steps = calls.rest(content), calls.held_steps()
        chunks: list[dict | str] = []
        if rest:
            chunks.append(self.chunk(delta={"content": rest}, with_usage=include_usage, steps=steps))
        if found:
            numbered = [{"index": index, **call} for index, call in enumerate(found)]
            chunks.append(self.chunk(delta={"tool_calls": numbered}, with_usage=include_usage,
                                     steps=None if rest else steps))
        elif steps and not rest:  # the held text was whitespace the whole answer drops
            chunks.append(self.chunk(delta={}, with_usage=include_usage, steps=steps))
        return chunks, "tool_calls" if found and done["finish_reason"] == FinishReason.STOP else done["finish_reason"]
