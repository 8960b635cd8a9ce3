"""The soak's clients: one generation as a user or a script runs it (the chat's websocket, SSE,
non-streaming, background + resume), with the behaviour drawn for it (leave, reconnect, stop, cancel,
log out mid-answer), and what it saw."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
from django.conf import settings

from inference.benchmark.servers import Credentials

TIMEOUT = aiohttp.ClientTimeout(total=300, sock_read=120)
# A chat socket is quiet while its answer waits (no keep-alives): a client that hears nothing this long is broken,
# reported with its answer's story, not a soak that waits for ever.
SOCKET_SILENCE_S = 120
WS_TIMEOUT = aiohttp.ClientWSTimeout(ws_receive=SOCKET_SILENCE_S, ws_close=10)
LOGOUT_CLOSE_WAIT_S = 15  # how long a logged-out client waits for the site to close its socket


@dataclass
class Outcome:
    kind: str
    behaviour: str
    generation_id: str = ""
    text: str = ""
    ended: str = ""  # done, error, left (the client went away on purpose), broken (closed without an end)
    http_status: int = 200
    error: str = ""
    last_event_at: float = field(default_factory=time.monotonic)  # the request's start, then each event's arrival
    previous_event_at: float = field(default_factory=time.monotonic)  # the event before the last one
    ended_at: float = 0.0
    surfaced_s: float | None = None  # for a failure: how long its client waited for the error since the last event
    logout_closed_s: float | None = None  # for a logout: from the logout to the site closing the socket

    def seen(self) -> None:
        self.previous_event_at, self.last_event_at = self.last_event_at, time.monotonic()

    def end(self, how: str, error: str = "") -> Outcome:
        self.ended, self.error, self.ended_at = how, error, time.monotonic()
        if how in {"error", "broken"}:
            self.surfaced_s = self.ended_at - self.previous_event_at
        return self


class SoakClient:
    def __init__(self, *, base_url: str, credentials: Credentials, pair: str, open_session: Callable[[], str]):
        self.base_url = base_url.rstrip("/")
        self.credentials = credentials
        self.open_session = open_session  # a new logged-in session's cookie, for a client that logs out
        self.pair = pair
        self.auth = {"Authorization": f"Bearer {credentials.api_key}"}

    async def run(self, *, kind: str, behaviour: str, prompt: str, max_tokens: int) -> Outcome:
        outcome = Outcome(kind=kind, behaviour=behaviour)
        try:
            async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
                if kind == "websocket" and behaviour == "logout":
                    return await self._logout_mid_answer(http, outcome, prompt, max_tokens)
                if kind == "websocket":
                    return await self._websocket(http, outcome, prompt, max_tokens)
                if kind == "blocking":
                    return await self._blocking(http, outcome, prompt, max_tokens)
                return await self._sse(http, outcome, prompt, max_tokens)
        except TimeoutError:
            return outcome.end("broken", f"nothing heard for {time.monotonic() - outcome.last_event_at:.0f} s")
        except (aiohttp.ClientError, ConnectionError) as exc:
            return outcome.end("broken", f"{type(exc).__name__}: {exc}")

    async def _blocking(self, http, outcome: Outcome, prompt: str, max_tokens: int) -> Outcome:
        body = {"model": self.pair, "prompt": prompt, "max_tokens": max_tokens}
        async with http.post(f"{self.base_url}/v1/completions", json=body, headers=self.auth) as resp:
            outcome.http_status, outcome.generation_id = resp.status, resp.headers.get("X-Generation-Id", "")
            data = await resp.json(content_type=None)
        outcome.seen()
        if resp.status != 200:
            return outcome.end("error", (data.get("error") or {}).get("message", str(data)))
        outcome.text = data["choices"][0]["text"]
        return outcome.end("done")

    async def _sse(self, http, outcome: Outcome, prompt: str, max_tokens: int) -> Outcome:
        """SSE: `background` leaves after the first chunk and resumes with Last-Event-ID; `leave`
        goes away for good (its answer is stopped); `cancel` asks the API to stop it."""
        background = outcome.kind == "background"
        body = {"model": self.pair, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
                "background": background}
        async with http.post(f"{self.base_url}/v1/completions", json=body, headers=self.auth) as resp:
            outcome.http_status, outcome.generation_id = resp.status, resp.headers.get("X-Generation-Id", "")
            if resp.status != 200:
                return outcome.end("error", (await resp.text())[:300])
            last_id, ended = await self._read_sse(resp, outcome,
                                                  stop_after_first=background or outcome.behaviour != "plain")
        if ended:
            return outcome
        if outcome.behaviour == "leave":
            return outcome.end("left")
        if outcome.behaviour == "cancel":
            async with http.post(f"{self.base_url}/v1/completions/{outcome.generation_id}/cancel",
                                 headers=self.auth) as resp:
                outcome.http_status = resp.status
        await asyncio.sleep(random.uniform(0, 1))
        headers = {**self.auth, "Last-Event-ID": last_id} if last_id else self.auth
        async with http.get(f"{self.base_url}/v1/completions/{outcome.generation_id}/events",
                            headers=headers) as resp:
            outcome.http_status = resp.status
            if resp.status != 200:
                return outcome.end("error", (await resp.text())[:300])
            _, ended = await self._read_sse(resp, outcome, stop_after_first=False)
        return outcome if ended else outcome.end("broken", "the resumed stream closed before [DONE]")

    @staticmethod
    async def _read_sse(resp, outcome: Outcome, *, stop_after_first: bool) -> tuple[str, bool]:
        last_id = ""
        async for raw in resp.content:
            line = raw.decode().strip()
            if line.startswith("id:"):
                last_id = line[3:].strip()
            if not line.startswith("data:"):
                continue
            outcome.seen()
            payload = line[5:].strip()
            if payload == "[DONE]":
                if not outcome.ended:
                    outcome.end("done")
                return last_id, True
            chunk = json.loads(payload)
            if chunk.get("error"):
                outcome.end("error", chunk["error"].get("message", ""))
                continue
            outcome.text += "".join(choice.get("text") or "" for choice in chunk.get("choices") or [])
            if stop_after_first and outcome.text and last_id:
                return last_id, False
        if outcome.ended:
            return last_id, True
        return last_id, bool(outcome.end("broken", "the stream closed before [DONE]"))

    async def _websocket(self, http, outcome: Outcome, prompt: str, max_tokens: int) -> Outcome:
        """The chat: `reconnect` drops the socket after the first delta and follows again from its
        last event; `stop` asks for a stop after the first delta."""
        url = self.base_url.replace("http", "ws", 1) + "/ws/chat/"
        headers = {"Cookie": self.credentials.session_cookie}
        state = {"after": "0-0", "steps": 0}
        message: dict[str, object] = {"action": "send", "pair": self.pair, "text": prompt,
                                      "settings": {"max_tokens": max_tokens}}
        for attempt in range(2):
            async with http.ws_connect(url, origin=self.base_url, headers=headers, timeout=WS_TIMEOUT) as ws:
                await ws.send_json(message)
                left = await self._read_socket(ws, outcome, state, drop_after_first=attempt == 0 and
                                               outcome.behaviour == "reconnect")
            if outcome.ended or not left:
                return outcome if outcome.ended else outcome.end("broken", "the socket closed without an end")
            message = {"action": "follow", "generation": outcome.generation_id, "after": state["after"],
                       "steps": state["steps"]}
        return outcome

    async def _read_socket(self, ws, outcome: Outcome, state: dict, *, drop_after_first: bool) -> bool:
        """True if it left on purpose (to reconnect)."""
        async for raw in ws:
            if raw.type != aiohttp.WSMsgType.TEXT:
                return False
            data = json.loads(raw.data)
            outcome.seen()
            if data.get("type") == "error":
                if data.get("code") == "internal_error":
                    outcome.http_status = 500  # what the API would have answered
                outcome.end("error", data.get("message", ""))
                return False
            outcome.generation_id = outcome.generation_id or data.get("generation") or ""
            event = data.get("event") or {}
            if data.get("id"):
                state["after"] = data["id"]
            if event.get("type") == "delta":
                state["steps"] += len(event["steps"])
                outcome.text += "".join(draft + main for draft, main, *_ in event["steps"])
                if drop_after_first:
                    return True
                if outcome.behaviour == "stop" and not state.get("stopped"):
                    state["stopped"] = True
                    await ws.send_json({"action": "stop", "generation": outcome.generation_id})
            elif event.get("type") == "done":
                outcome.end("done")
                return False
            elif event.get("type") == "error":
                outcome.end("error", event.get("message", ""))
                return False
        return False

    async def _logout_mid_answer(self, http, outcome: Outcome, prompt: str, max_tokens: int) -> Outcome:
        """A chat user with a session of their own logs out (as the chat's button does) after the first
        delta: the site must close the socket, and the answer, followed by nobody, must still end."""
        cookie = await asyncio.to_thread(self.open_session)
        url = self.base_url.replace("http", "ws", 1) + "/ws/chat/"
        async with http.ws_connect(url, origin=self.base_url, headers={"Cookie": cookie}, timeout=WS_TIMEOUT) as ws:
            await ws.send_json({"action": "send", "pair": self.pair, "text": prompt,
                                "settings": {"max_tokens": max_tokens}})
            async for raw in ws:
                if raw.type != aiohttp.WSMsgType.TEXT:
                    return outcome.end("broken", "the socket closed before the first delta")
                data = json.loads(raw.data)
                outcome.seen()
                outcome.generation_id = outcome.generation_id or data.get("generation") or ""
                event = data.get("event") or {}
                if data.get("type") == "error" or event.get("type") == "error":
                    return outcome.end("error", data.get("message") or event.get("message", ""))
                if event.get("type") == "done":  # ended before its first delta (an answer of no tokens)
                    return outcome.end("done")
                if event.get("type") == "delta":
                    break
            await self._logout(http, cookie)
            logged_out_at = time.monotonic()
            while (left := logged_out_at + LOGOUT_CLOSE_WAIT_S - time.monotonic()) > 0:
                message = await ws.receive(timeout=left)
                if message.type in {aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING}:
                    outcome.logout_closed_s = time.monotonic() - logged_out_at
                    return outcome.end("left")
        return outcome.end("broken", f"the socket stayed open {LOGOUT_CLOSE_WAIT_S} s after its session ended")

    async def _logout(self, http, cookie: str) -> None:
        """POST the logout form with the CSRF token the chat page hands out."""
        async with http.get(f"{self.base_url}/", headers={"Cookie": cookie}) as page:
            token = page.cookies[settings.CSRF_COOKIE_NAME].value
        headers = {"Cookie": f"{cookie}; {settings.CSRF_COOKIE_NAME}={token}", "X-CSRFToken": token,
                   "Origin": self.base_url}
        async with http.post(f"{self.base_url}/accounts/logout/", headers=headers, allow_redirects=False) as resp:
            if resp.status != 302:
                raise aiohttp.ClientError(f"the logout answered {resp.status}")


BEHAVIOURS = {"websocket": (("plain", 6), ("reconnect", 3), ("stop", 1), ("logout", 1)),
              "sse": (("plain", 7), ("leave", 1), ("cancel", 2)),
              "blocking": (("plain", 1),),
              "background": (("plain", 1),)}
KIND_WEIGHTS = {"websocket": 4, "sse": 3, "blocking": 1, "background": 2}
