from django.contrib.auth import get_user_model

from chatsite.chat.models import Conversation, Message


def user_is_active(*, user) -> bool:
    """Asked again every few seconds by open chat connections, which close once it is not."""
    return get_user_model().objects.filter(pk=user.pk, is_active=True).exists()


def conversations_for(*, user):
    return Conversation.objects.filter(user=user).only("id", "title", "updated_at")


def conversation_for(*, user, conversation_id) -> Conversation | None:
    return Conversation.objects.filter(user=user, id=conversation_id).first()


def messages_of(*, conversation: Conversation):
    return conversation.messages.select_related("generation", "generation__pair")


def history(*, conversation: Conversation, before: Message | None = None) -> list[dict]:
    """The conversation as chat-template messages (failed or empty answers left out)."""
    messages = messages_of(conversation=conversation)
    if before is not None:
        messages = messages.filter(id__lt=before.id)
    return [{"role": m.role, "content": m.text} for m in messages if m.text]
