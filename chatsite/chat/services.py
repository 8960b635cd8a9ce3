"""Chat actions: a message sent or an answer regenerated starts a generation on the shared path.

A conversation writes one answer at a time, so that each answer's prompt holds the whole conversation
before it; a user has at most CHAT_MAX_CONCURRENT answers in flight (in different conversations). Both
are checked under the user's slot lock, in the transaction that records the new answer: two actions at
once (two tabs, a double click) cannot both pass. The chat connections following an answer
mark it watched in Redis; once the last one has closed and none came back within a grace period (a
reload, a network blip), the answer is stopped.
"""

import time
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from chatsite.chat import selectors
from chatsite.chat.models import TITLE_MAX_LENGTH, Conversation, Message
from inference import errors, transport
from inference.models import Generation
from inference.serving import web
from inference.serving.records import fail_if_stalled


def answer_slot(*, user):
    """Inside: the user has a free slot for one more answer (see web.in_flight_slot)."""
    return web.in_flight_slot(
        lock=transport.slot_lock("chat", user.pk), limit=settings.CHAT_MAX_CONCURRENT,
        generations=Generation.objects.filter(user=user, source=Generation.Source.CHAT),
        refusal="You already have {count} answers being written (at most {limit} at once): wait for one to "
                "finish, or stop it.")


def send_message(*, user, conversation_id: int | None, pair_slug: str, text: str,
                 options: web.GenerationOptions) -> Message:
    """Add the user's message and a streaming answer; on any error nothing is saved."""
    web.check_prompt_text(text, param="prompt")
    pair = web.find_pair(slug=pair_slug)
    with answer_slot(user=user), transaction.atomic():
        if conversation_id:
            conversation = _owned(user=user, conversation_id=conversation_id)
            _refuse_if_answering(conversation=conversation)
            conversation.pair = pair
            if not conversation.messages.exists():  # made first for its system prompt: titled by this message
                conversation.title = _title_from(text)
            conversation.save(update_fields=["pair", "title", "updated_at"])
        else:
            conversation = Conversation.objects.create(user=user, pair=pair, title=_title_from(text))
        Message.objects.create(conversation=conversation, role=Message.Role.USER, content=text)
        prompt = web.chat_prompt(pair=pair, messages=selectors.history(conversation=conversation))
        generation = web.start_generation(pair=pair, prompt=prompt, options=options, user=user,
                                                source=Generation.Source.CHAT, add_special_tokens=False)
        return Message.objects.create(conversation=conversation, role=Message.Role.ASSISTANT, generation=generation)


def regenerate(*, user, message_id: int, options: web.GenerationOptions) -> Message:
    """Answer the last user message again, in place of the last answer."""
    with answer_slot(user=user), transaction.atomic():
        message = Message.objects.select_related("conversation").filter(
            id=message_id, conversation__user=user, role=Message.Role.ASSISTANT).first()
        if message is None:
            raise errors.NotFound("No such answer.", param="message")
        conversation = message.conversation
        if conversation.messages.filter(created_at__gt=message.created_at).exists():
            raise errors.InvalidValue("Only the last answer can be regenerated.", param="message")
        _refuse_if_answering(conversation=conversation)
        pair = web.find_pair(slug=conversation.pair.slug if conversation.pair else "")
        prompt = web.chat_prompt(pair=pair, messages=selectors.history(conversation=conversation, before=message))
        message.generation = web.start_generation(pair=pair, prompt=prompt, options=options, user=user,
                                                        source=Generation.Source.CHAT, add_special_tokens=False)
        message.save(update_fields=["generation"])
        conversation.save(update_fields=["updated_at"])
    return message


def edit_and_resend(*, user, conversation_id: int, text: str, options: web.GenerationOptions) -> Message:
    """The conversation's last user message rewritten and answered anew: the answers after it leave
    the conversation (their generations stay until purge_history, as any unlisted answer's do)."""
    web.check_prompt_text(text, param="text")
    with answer_slot(user=user), transaction.atomic():
        conversation = _owned(user=user, conversation_id=conversation_id)
        message = conversation.messages.filter(role=Message.Role.USER).last()
        if message is None:
            raise errors.InvalidValue("This conversation has no message to edit.", param="conversation")
        _refuse_if_answering(conversation=conversation)
        pair = web.find_pair(slug=conversation.pair.slug if conversation.pair else "")
        if conversation.title == _title_from(message.content):
            conversation.title = _title_from(text)
        message.content = text
        message.save(update_fields=["content"])
        conversation.messages.filter(id__gt=message.id).delete()
        prompt = web.chat_prompt(pair=pair, messages=selectors.history(conversation=conversation))
        generation = web.start_generation(pair=pair, prompt=prompt, options=options, user=user,
                                          source=Generation.Source.CHAT, add_special_tokens=False)
        conversation.save(update_fields=["title", "updated_at"])
        return Message.objects.create(conversation=conversation, role=Message.Role.ASSISTANT, generation=generation)


def new_conversation(*, user, system_prompt: str) -> Conversation:
    """An empty conversation, made before its first message when that message needs a system prompt;
    the first message titles it."""
    web.check_prompt_text(system_prompt, param="system_prompt")
    return Conversation.objects.create(user=user, title="New chat", system_prompt=system_prompt)


def rename_conversation(*, user, conversation_id: int, title: str) -> Conversation:
    title = " ".join(title.split())
    if not title:
        raise errors.InvalidValue("A conversation needs a title.", param="title")
    if len(title) > TITLE_MAX_LENGTH:
        raise errors.InvalidValue(f"A title has at most {TITLE_MAX_LENGTH} characters.", param="title")
    conversation = _owned(user=user, conversation_id=conversation_id)
    conversation.title = title
    conversation.save(update_fields=["title", "updated_at"])
    return conversation


def set_system_prompt(*, user, conversation_id: int, system_prompt: str) -> Conversation:
    """Used for the answers written from now on (the kept answers stay as they were written)."""
    if "\x00" in system_prompt:
        raise errors.InvalidValue("The system prompt contains a NUL character.", param="system_prompt")
    conversation = _owned(user=user, conversation_id=conversation_id)
    conversation.system_prompt = system_prompt.strip()
    conversation.save(update_fields=["system_prompt", "updated_at"])
    return conversation


def delete_conversation(*, user, conversation_id: int) -> None:
    """Its answers still being written are stopped first: nobody could see them any more."""
    conversation = _owned(user=user, conversation_id=conversation_id)
    for generation in Generation.objects.filter(message__conversation=conversation, status__in=web.IN_FLIGHT):
        web.request_stop(generation=generation)
    conversation.delete()


def _refuse_if_answering(*, conversation: Conversation) -> None:
    """Called under the user's slot lock: an answer still being written in this conversation (one that will
    never end is failed first, so it cannot hold the conversation) refuses a new one."""
    in_flight = Generation.objects.filter(message__conversation=conversation, status__in=web.IN_FLIGHT)
    if any(not fail_if_stalled(generation_id=generation_id)
           for generation_id in in_flight.values_list("id", flat=True)):
        raise errors.AnswerInProgress("An answer is still being written in this chat: wait for it to finish, "
                                      "or stop it.", param="conversation")


def _owned(*, user, conversation_id: int) -> Conversation:
    conversation = selectors.conversation_for(user=user, conversation_id=conversation_id)
    if conversation is None:
        raise errors.NotFound("No such conversation.", param="conversation")
    return conversation


def _title_from(text: str) -> str:
    return " ".join(text.split())[:80]


def stop_all_answers(*, user) -> None:
    """Stop every answer of the user still in flight (their access was revoked)."""
    for generation in Generation.objects.filter(user=user, status__in=web.IN_FLIGHT):
        web.request_stop(generation=generation)


# ------------------------------------------------------------------ who watches an answer
async def watch(*, client, generation_ids, connection_id: str) -> None:
    """Mark the answers watched by this connection now; each connection repeats this every
    ACCESS_RECHECK_S, so the marks of a web process that died go stale."""
    now = time.time()
    pipe = client.pipeline(transaction=False)
    for generation_id in generation_ids:
        pipe.zadd(transport.chat_watchers_key(generation_id), {connection_id: now})
        pipe.expire(transport.chat_watchers_key(generation_id), settings.STREAM_TTL_S)
    await pipe.execute()


async def unwatch(*, client, generation_ids, connection_id: str) -> None:
    pipe = client.pipeline(transaction=False)
    for generation_id in generation_ids:
        pipe.zrem(transport.chat_watchers_key(generation_id), connection_id)
    await pipe.execute()


def stop_unwatched(*, generation_ids) -> None:
    """Stop those of the answers (still in flight) that no chat connection watches."""
    client = transport.sync_client()
    fresh_since = time.time() - 3 * settings.ACCESS_RECHECK_S
    for generation in Generation.objects.filter(id__in=list(generation_ids), status__in=web.IN_FLIGHT):
        if not client.zcount(transport.chat_watchers_key(generation.id), fresh_since, "+inf"):
            web.request_stop(generation=generation)


def purge_history(*, older_than_days: int) -> tuple[int, int]:
    """Delete conversations untouched for that many days, then ended generations as old that no
    kept message shows (API and benchmark answers); running ones are never touched. Returns the
    numbers of conversations and generations deleted."""
    cutoff = timezone.now() - timedelta(days=older_than_days)
    _, conversations = Conversation.objects.filter(updated_at__lt=cutoff).delete()
    _, generations = Generation.objects.filter(
        created_at__lt=cutoff, message__isnull=True,
        status__in=[Generation.Status.FINISHED, Generation.Status.STOPPED, Generation.Status.FAILED],
    ).delete()
    return conversations.get("chat.Conversation", 0), generations.get("inference.Generation", 0)
