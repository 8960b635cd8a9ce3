from chatsite.chat.models import Conversation, Message


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
