"""Chat actions: a message sent or an answer regenerated starts a generation on the shared path."""

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from chatsite.chat import selectors
from chatsite.chat.models import Conversation, Message
from inference import errors
from inference.serving import web
from inference.models import Generation


def send_message(*, user, conversation_id: int | None, pair_slug: str, text: str,
                 options: web.GenerationOptions) -> Message:
    """Add the user's message and a streaming answer; on any error nothing is saved."""
    web.check_prompt_text(text, param="prompt")
    pair = web.find_pair(slug=pair_slug)
    with transaction.atomic():
        if conversation_id:
            conversation = selectors.conversation_for(user=user, conversation_id=conversation_id)
            if conversation is None:
                raise errors.NotFound("No such conversation.", param="conversation")
            conversation.pair = pair
            conversation.save(update_fields=["pair", "updated_at"])
        else:
            conversation = Conversation.objects.create(user=user, pair=pair, title=text.strip()[:80])
        Message.objects.create(conversation=conversation, role=Message.Role.USER, content=text)
        prompt = web.chat_prompt(pair=pair, messages=selectors.history(conversation=conversation))
        generation = web.start_generation(pair=pair, prompt=prompt, options=options, user=user,
                                                source=Generation.Source.CHAT, add_special_tokens=False)
        return Message.objects.create(conversation=conversation, role=Message.Role.ASSISTANT, generation=generation)


def regenerate(*, user, message_id: int, options: web.GenerationOptions) -> Message:
    """Answer the last user message again, in place of the last answer."""
    message = Message.objects.select_related("conversation", "generation__pair").filter(
        id=message_id, conversation__user=user, role=Message.Role.ASSISTANT).first()
    if message is None:
        raise errors.NotFound("No such answer.", param="message")
    conversation = message.conversation
    if conversation.messages.filter(created_at__gt=message.created_at).exists():
        raise errors.InvalidValue("Only the last answer can be regenerated.", param="message")
    if message.generation and not message.generation.is_done:
        raise errors.InvalidValue("This answer is still being written; stop it first.", param="message")
    pair = web.find_pair(slug=conversation.pair.slug if conversation.pair else "")
    with transaction.atomic():
        prompt = web.chat_prompt(pair=pair, messages=selectors.history(conversation=conversation, before=message))
        message.generation = web.start_generation(pair=pair, prompt=prompt, options=options, user=user,
                                                        source=Generation.Source.CHAT, add_special_tokens=False)
        message.save(update_fields=["generation"])
        conversation.save(update_fields=["updated_at"])
    return message


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
