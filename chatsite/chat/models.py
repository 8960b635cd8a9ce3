from django.conf import settings
from django.db import models

from inference.models import Generation, ModelPair

TITLE_MAX_LENGTH = 200


class Conversation(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations")
    title = models.CharField(max_length=TITLE_MAX_LENGTH)
    system_prompt = models.TextField(blank=True, help_text="Given to the model before the conversation's messages.")
    pair = models.ForeignKey(ModelPair, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]

    def __str__(self) -> str:
        return self.title


class Message(models.Model):
    class Role(models.TextChoices):
        USER = "user"
        ASSISTANT = "assistant"

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="messages")
    role = models.CharField(max_length=10, choices=Role.choices)
    content = models.TextField(blank=True, help_text="The user's text; an answer's text lives in its generation.")
    generation = models.OneToOneField(Generation, null=True, blank=True, on_delete=models.SET_NULL,
                                      related_name="message")
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
            return self.generation.text if self.generation else ""
        return self.content
