"""Calling the REST API from tests: the official client, plain HTTP and Server-Sent Events, on one
prompt and one conversation the demo pair answers."""

import json

import openai
import requests

PROMPT = "def quicksort(numbers):"
MESSAGES = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "Sort a list of numbers."}]


def client(base_url: str, key: str, version: str = "v1", **kwargs) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/{version}", api_key=key, **kwargs)


def post(base_url: str, path: str, key: str | None, body, **kwargs) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    kwargs.setdefault("timeout", 120)
    return requests.post(f"{base_url}{path}", data=data, headers={**headers, "Content-Type": "application/json"},
                         **kwargs)


def sse_events(response: requests.Response):
    """(id or None, data) per Server-Sent Event, as they arrive."""
    event_id, data = None, []
    for line in response.iter_lines(decode_unicode=True):
        if line == "":
            if data:
                yield event_id, "\n".join(data)
            event_id, data = None, []
        elif line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("data: "):
            data.append(line[6:])


def chunk_text(data: str) -> str:
    if data == "[DONE]":
        return ""
    choices = json.loads(data)["choices"]
    return "".join(c.get("text") or (c.get("delta") or {}).get("content") or "" for c in choices)
