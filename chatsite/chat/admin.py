from django.contrib import admin

from chatsite.chat.models import Conversation, Message


class MessageInline(admin.TabularInline):
    model = Message
    extra = 0
    fields = ("role", "content", "generation")
    readonly_fields = ("generation",)


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ("title", "user", "pair", "updated_at")
    inlines = [MessageInline]
