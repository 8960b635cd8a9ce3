"""The chat websocket: send, follow (resume after an event id), stop, regenerate, continue.

Each answer's events are read from its Redis stream, so a browser that reconnects asks to follow
from the last event id it rendered and gets exactly the rest. A malformed message is answered with
an error naming its field, and the socket stays open. Every ACCESS_RECHECK_S the connection checks
that its session still stands (not logged out, same password, user active; else it closes with an
error) and marks the answers it follows as watched; once it closes, those nobody else watches are
stopped after CHAT_ABANDON_GRACE_S.

Sockets never wait on each other: each connection runs its thread-sensitive database calls (a send,
which may wait on its user's chat lock) in a thread of its own, as Django gives each HTTP request;
short reads and stops run in the shared pool, so they do not queue behind that wait either.
"""

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from asgiref.sync import ThreadSensitiveContext
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.db import DatabaseError, connections

from chatsite.chat import access, selectors, services, watching
from chatsite.chat.handshake import DATABASE_UNAVAILABLE_CLOSE
from inference import errors, json_input, limits, transport
from inference.selectors import generation_for_user
from inference.serving import readers, web
from inference.serving.records import reconnecting
from inference.transport import valid_entry_id

log = logging.getLogger(__name__)
ACTIONS = ("send", "follow", "stop", "regenerate", "continue")
MAX_JSON_DEPTH = 16  # the deepest a chat message nests (the real ones nest 2 levels)
# The longest frame a chat sends: a message's longest text, escaped as JSON (6 characters for "\u0001"), with the
# other fields. A longer one is refused unread; daphne closes the socket (1009) on one over 1 MiB.
MAX_FRAME_CHARS = 6 * limits.MESSAGE_MAX_CHARS + 4096
FOLLOW_FAILED = "Following this answer failed; it has been logged. Reload to see the answer as saved."
REF_MAX_CHARS = 64  # a frame's `ref`, echoed in its answer: the page numbers its frames


def _pooled(func: Callable[..., Any]) -> Callable[..., Any]:
    """A short database call (a read, one write, no lock wait) in the shared pool, not the connection's
    own thread: it must not queue behind a send waiting there for its chat lock."""
    return database_sync_to_async(func, thread_sensitive=False)


class ChatConsumer(AsyncJsonWebsocketConsumer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.followers: dict[str, asyncio.Task] = {}  # generation id -> the task sending its events
        self.connection_id = uuid.uuid4().hex
        self.redis = None
        self.watcher: asyncio.Task | None = None

    async def __call__(self, scope, receive, send):
        """The whole connection in a thread-sensitive context of its own (see the module's docstring)."""
        async with ThreadSensitiveContext():
            await super().__call__(scope, receive, send)

    async def connect(self):
        if not self.scope["user"].is_authenticated:
            await self.close(code=4401)
            return
        self.redis = transport.async_client()
        await self.accept()
        self.watcher = asyncio.create_task(self.watch())

    async def disconnect(self, code):
        tasks = [task for task in (self.watcher, *self.followers.values()) if task is not None]
        for task in tasks:
            task.cancel()
        # Ended before the connection's context closes: a call they made after it would start a thread
        # for a context that is gone.
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.redis is None:
            return
        try:
            if self.followers:
                await watching.leave(client=self.redis, generation_ids=list(self.followers),
                                     connection_id=self.connection_id)
        finally:
            await self.redis.aclose()
            await database_sync_to_async(connections.close_all)()  # the connection's own thread ends with it

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        frame = text_data or bytes_data or ""
        if len(frame) > MAX_FRAME_CHARS:
            await self.send_error(errors.InvalidValue(
                f"A message frame has at most {MAX_FRAME_CHARS:,} characters; this one has {len(frame):,}."))
            return
        try:
            content = json_input.parse(frame, max_depth=MAX_JSON_DEPTH)
        except json_input.JsonInputError as exc:
            await self.send_error(errors.InvalidJson(f"Messages must be JSON: {exc}."))
            return
        if not isinstance(content, dict):
            await self.send_error(errors.InvalidJson("Messages must be JSON objects."))
            return
        await self.receive_json(content)

    async def receive_json(self, content, **kwargs):
        action = content.get("action")
        ref = None  # echoed only once known to be short: a megabyte's ref echoed to a client that reads nothing
        try:
            ref = _ref(content)
            if action not in ACTIONS:
                raise errors.InvalidValue(f"Unknown action {json.dumps(action)[:40]}: use one of {', '.join(ACTIONS)}.",
                            param="action")
            await getattr(self, f"do_{action}")(content)
        except errors.ServiceError as exc:
            await self.send_error(exc, ref=ref)
        except DatabaseError:
            log.exception("chat action %s failed: the database", action)
            await self.send_error(errors.DatabaseUnavailable(errors.DATABASE_DOWN), ref=ref)
        except Exception:
            log.exception("chat action %s failed", action)
            await self.send_error(errors.InternalError("Internal error; it has been logged."), ref=ref)

    async def send_error(self, exc: errors.ServiceError, *, ref=None):
        await self.send_json({"type": "error", "message": exc.message, "param": exc.param, "code": exc.code,
                              "ref": ref})

    async def do_send(self, content):
        options = _options(content)
        conversation = _integer(content, "conversation", required=False)
        text = _string(content, "text", required=True)
        message = await database_sync_to_async(services.send_message)(
            user=self.scope["user"], conversation_id=conversation, pair_slug=_string(content, "pair"), text=text,
            options=options)
        await self.started(message, content)

    async def do_regenerate(self, content):
        options = _options(content)
        message = await database_sync_to_async(services.regenerate)(
            user=self.scope["user"], message_id=_integer(content, "message", required=True), options=options)
        await self.started(message, content)

    async def do_continue(self, content):
        options = _options(content)
        message = await database_sync_to_async(services.continue_answer)(
            user=self.scope["user"], message_id=_integer(content, "message", required=True), options=options)
        await self.started(message, content)

    async def started(self, message, content):
        """Said with the conversation's shown path, which the answer changed (a new message, a new version)."""
        generation_id = str(message.generation_id)
        shown = await _pooled(selectors.shown_path_json)(conversation=message.conversation)
        await self.send_json({"type": "started", "conversation": message.conversation_id, "message": message.id,
                              "title": message.conversation.title,
                              "generation": generation_id, "messages_left_out": message.messages_left_out,
                              "messages": shown, "ref": content.get("ref")})
        await self.start_following(generation_id, "0-0")

    async def owned_generation(self, content):
        generation = await _pooled(generation_for_user)(
            generation_id=_uuid_or_none(content.get("generation")), user=self.scope["user"])
        if generation is None:
            raise errors.NotFound("No such answer.", param="generation")
        return generation

    async def do_follow(self, content):
        after, known_steps = _resume_point(content)
        generation = await self.owned_generation(content)
        await self.start_following(str(generation.id), after, known_steps)

    async def do_stop(self, content):
        generation = await self.owned_generation(content)
        await _pooled(web.request_stop)(generation=generation)

    async def start_following(self, generation_id: str, after: str, known_steps: int | None = None):
        previous = self.followers.pop(generation_id, None)
        if previous:
            previous.cancel()
        self.followers[generation_id] = asyncio.create_task(self.pump(generation_id, after, known_steps))
        await watching.watch(client=self.redis, generation_ids=[generation_id], connection_id=self.connection_id)

    async def pump(self, generation_id: str, after: str, known_steps: int | None):
        """The answer's events to the page, ending with a terminal one whatever happens: a page told nothing waits
        for ever (the socket stays open for the user's other answers)."""
        finished = False
        try:
            async for entry_id, event in readers.follow_generation(generation_id=generation_id, after=after,
                                                               known_steps=known_steps):
                if entry_id is not None:
                    await self.send_json({"type": "event", "generation": generation_id, "id": entry_id,
                                          "event": _for_browser(event)})
                    after, finished = entry_id, event["type"] == "done"
                elif event["type"] in {"ended", "error"}:  # past the end, or Redis lost: said, never silence
                    await self.send_json({"type": "event", "generation": generation_id, "id": after,
                                          "event": {"type": "error", "message": event["message"]}})
        except Exception:
            log.exception("following generation %s failed", generation_id)
            await self.send_json({"type": "event", "generation": generation_id, "id": after,
                                  "event": {"type": "error", "message": FOLLOW_FAILED}})
            finished = False
        # Not when cancelled: a closing socket leaves the answers it follows (disconnect), and a new follow took over
        if self.followers.get(generation_id) is asyncio.current_task():
            del self.followers[generation_id]
        if finished and settings.CHAT_WRITTEN_TITLES:  # a conversation's first answer: its title is written now
            await self.write_title(generation_id)

    async def write_title(self, answer_id: str):
        """After a conversation's first answer, the title the pair writes it (services.start_written_title), said to
        the page once kept."""
        user = self.scope["user"]
        started = await _pooled(services.start_written_title)(user=user, generation_id=answer_id)
        if started is None:
            return
        conversation_id, title = started
        await readers.wait_for(generation_id=title.id)  # a few tokens: it ends, or fails, by itself
        kept = await _pooled(services.keep_written_title)(user=user, conversation_id=conversation_id,
                                                          generation_id=title.id)
        if kept is not None:
            await self.send_json({"type": "title", "conversation": conversation_id, "title": kept})

    async def watch(self):
        """Every ACCESS_RECHECK_S: mark the followed answers watched, and close if the session ended (a
        deactivated user's answers are stopped too; those of a logout are left to the abandon grace,
        another tab may follow them) or could not be checked twice in a row."""
        session_key = self.scope["session"].session_key
        unverified_since: float | None = None
        while True:
            await asyncio.sleep(settings.ACCESS_RECHECK_S)
            user = self.scope["user"]
            if self.followers:
                try:
                    await watching.watch(client=self.redis, generation_ids=list(self.followers),
                                         connection_id=self.connection_id)
                except transport.REDIS_ERRORS:  # marked again at the next recheck
                    log.warning("could not mark a chat socket's answers watched", exc_info=True)
            try:
                ended = await _pooled(reconnecting(access.session_ended))(session_key=session_key, user_id=user.pk)
                unverified_since = None
            except DatabaseError:
                # A session nobody can vouch for is not kept open: after two failed rechecks the socket
                # closes with 4503 and the page reconnects (and resumes) once the database is back.
                unverified_since = unverified_since or time.monotonic()
                if time.monotonic() - unverified_since < settings.ACCESS_RECHECK_S:
                    continue
                await self.send_error(errors.DatabaseUnavailable(errors.DATABASE_DOWN))
                await self.close(code=DATABASE_UNAVAILABLE_CLOSE)
                return
            if ended:
                await self.send_error(errors.AccessRevoked(ended))
                if ended == access.DEACTIVATED:
                    await _pooled(services.stop_all_answers)(user=user)
                await self.close(code=4401)
                return


def _for_browser(event: dict) -> dict:
    """An event as browsers see it: without the worker's host and process (kept in the database)."""
    return {name: value for name, value in event.items() if name != "worker"}


def _resume_point(content) -> tuple[str, int | None]:
    """Where a follow resumes: after an event id this socket sent, with the steps the page already shows."""
    after = _string(content, "after") or "0-0"
    if not valid_entry_id(after):
        raise errors.InvalidValue("after must be an event id this socket sent.", param="after")
    known_steps = _integer(content, "steps", required=False)
    if known_steps is not None and known_steps < 0:
        raise errors.InvalidValue("steps must be the number of steps this answer shows (0 or more).",
                                  param="steps")
    return after, known_steps


def _options(content) -> web.GenerationOptions:
    return services.parse_chat_settings(content.get("settings"))


def _ref(content) -> str | None:
    ref = content.get("ref")
    if ref is not None and not (isinstance(ref, str) and len(ref) <= REF_MAX_CHARS):
        raise errors.InvalidValue(f"ref must be a string of at most {REF_MAX_CHARS} characters.", param="ref")
    return ref


def _integer(content, name: str, *, required: bool) -> int | None:
    value = content.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise errors.InvalidType(f"{name} must be an id (an integer).", param=name)
    return value


def _string(content, name: str, *, required: bool = False) -> str:
    value = content.get(name)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise errors.InvalidType(f"{name} must be a string.", param=name)
    return value


def _uuid_or_none(value):
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None
