"""The chat websocket: send, follow (resume after an event id), stop, regenerate.

Each answer's events are read from its Redis stream, so a browser that reconnects asks to follow
from the last event id it rendered and gets exactly the rest.
"""

import asyncio
import json
import uuid

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from chatsite.chat import services
from inference.selectors import generation_for_user
from inference import errors
from inference.serving import web
from inference.transport import valid_entry_id


class ChatConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        if not self.scope["user"].is_authenticated:
            await self.close(code=4401)
            return
        self.followers: dict[str, asyncio.Task] = {}
        await self.accept()

    async def disconnect(self, code):
        for task in getattr(self, "followers", {}).values():
            task.cancel()

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        try:
            content = json.loads(text_data or bytes_data or "")
        except ValueError:
            await self.send_json({"type": "error", "message": "Messages must be JSON.", "param": None,
                                  "code": "invalid_json"})
            return
        await self.receive_json(content)

    async def receive_json(self, content, **kwargs):
        action = content.get("action") if isinstance(content, dict) else None
        handler = {"send": self.send_message, "follow": self.follow, "stop": self.stop,
                   "regenerate": self.regenerate}.get(action)
        try:
            if handler is None:
                raise errors.InvalidValue(f"Unknown action {action!r}.", param="action")
            await handler(content)
        except errors.ServiceError as exc:
            await self.send_json({"type": "error", "message": exc.message, "param": exc.param, "code": exc.code,
                                  "ref": content.get("ref") if isinstance(content, dict) else None})

    async def send_message(self, content):
        options = web.parse_options(content.get("settings") or {})
        conversation = content.get("conversation")
        if conversation is not None and (not isinstance(conversation, int) or isinstance(conversation, bool)):
            raise errors.InvalidValue("conversation must be an id.", param="conversation")
        text = content.get("text")
        if not isinstance(text, str):
            raise errors.InvalidValue("text must be a string.", param="text")
        message = await database_sync_to_async(services.send_message)(
            user=self.scope["user"], conversation_id=conversation, pair_slug=str(content.get("pair") or ""),
            text=text, options=options)
        await self.started(message, content)

    async def regenerate(self, content):
        options = web.parse_options(content.get("settings") or {})
        message = await database_sync_to_async(services.regenerate)(
            user=self.scope["user"], message_id=content.get("message"), options=options)
        await self.started(message, content)

    async def started(self, message, content):
        generation_id = str(message.generation_id)
        await self.send_json({"type": "started", "conversation": message.conversation_id, "message": message.id,
                              "generation": generation_id, "ref": content.get("ref")})
        self.start_following(generation_id, "0-0")

    async def owned_generation(self, content):
        generation = await database_sync_to_async(generation_for_user)(
            generation_id=_uuid_or_none(content.get("generation")), user=self.scope["user"])
        if generation is None:
            raise errors.NotFound("No such answer.", param="generation")
        return generation

    async def follow(self, content):
        generation = await self.owned_generation(content)
        after = content.get("after") or "0-0"
        if not valid_entry_id(after):
            raise errors.InvalidValue("after must be an event id.", param="after")
        self.start_following(str(generation.id), after)

    async def stop(self, content):
        generation = await self.owned_generation(content)
        await database_sync_to_async(web.request_stop)(generation=generation)

    def start_following(self, generation_id: str, after: str):
        previous = self.followers.pop(generation_id, None)
        if previous:
            previous.cancel()
        self.followers[generation_id] = asyncio.create_task(self.pump(generation_id, after))

    async def pump(self, generation_id: str, after: str):
        async for entry_id, event in web.follow_generation(generation_id=generation_id, after=after):
            if entry_id is not None:
                await self.send_json({"type": "event", "generation": generation_id, "id": entry_id, "event": event})
            elif event["type"] in {"ended", "error"}:  # past the end, or Redis lost: said, never silence
                await self.send_json({"type": "event", "generation": generation_id, "id": after,
                                      "event": {"type": "error", "message": event["message"]}})
        self.followers.pop(generation_id, None)


def _uuid_or_none(value):
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None
