from django.conf import settings
from django.db import models
from django.utils import timezone

from inference.models import Generation, ModelPair

TITLE_MAX_LENGTH = 200


class Conversation(models.Model):
    class TitleSource(models.TextChoices):
        FIRST_MESSAGE = "message"  # cut from the first message, until the model writes one
        ASKED = "asked"  # the model was asked for one after the first answer (kept as it is if none came)
        MODEL = "model"
        USER = "user"  # renamed: never written over

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations")
    title = models.CharField(max_length=TITLE_MAX_LENGTH)
    title_source = models.CharField(max_length=10, choices=TitleSource.choices, default=TitleSource.FIRST_MESSAGE)
    system_prompt = models.TextField(blank=True, help_text="Given to the model before the conversation's messages.")
    pair = models.ForeignKey(ModelPair, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]

    def __str__(self) -> str:
        return self.title


class Message(models.Model):
    """One version of a turn. A conversation is a tree: a message follows its `parent`, and the messages with
    the same parent are the versions of one turn (an answer regenerated, a user message edited: a branch).
    The conversation shows one path through it, the messages marked `shown`; at a fork it follows the version
    shown last (`shown_at`), so a branch left and come back to looks as the user left it."""

    class Role(models.TextChoices):
        USER = "user"
        ASSISTANT = "assistant"

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="messages")
    role = models.CharField(max_length=10, choices=Role.choices)
    content = models.TextField(blank=True, help_text="The user's text; an answer's text lives in its generation.")
    generation = models.OneToOneField(Generation, null=True, blank=True, on_delete=models.SET_NULL,
                                      related_name="message")
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.CASCADE, related_name="replies",
                               help_text="The message this one follows; none for the conversation's first turn.")
    shown = models.BooleanField(default=True, help_text="On the path the conversation shows (and prompts with).")
    shown_at = models.DateTimeField(default=timezone.now, help_text="When this version was last shown.")
    earlier_text = models.TextField(blank=True, help_text="An answer continued after it reached the max tokens: its "
                                                          "text before the current generation's.")
    messages_left_out = models.PositiveIntegerField(
        default=0, help_text="An answer's: how many of the conversation's oldest messages its prompt left out, "
                             "the conversation being longer than the model's context.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.role} message {self.id}"

    @property
    def text(self) -> str:
        if self.role == self.Role.ASSISTANT:
            return self.earlier_text + (self.generation.text if self.generation else "")
        return self.content
