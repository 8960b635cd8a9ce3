"""Messages become versions in a tree: each follows its parent, and the shown path is marked. The messages
kept so far form one path, each following the one before it."""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


def chain_kept_messages(apps, schema_editor):
    Message = apps.get_model("chat", "Message")
    previous: dict[int, int] = {}  # conversation id -> its latest message's id
    for message in Message.objects.order_by("conversation_id", "created_at", "id").iterator():
        Message.objects.filter(id=message.id).update(parent_id=previous.get(message.conversation_id),
                                                     shown_at=message.created_at)
        previous[message.conversation_id] = message.id


class Migration(migrations.Migration):
    dependencies = [("chat", "0003_message_left_out")]

    operations = [
        migrations.AddField(
            model_name="message", name="parent",
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE,
                                    related_name="replies", to="chat.message",
                                    help_text="The message this one follows; none for the conversation's first turn.")),
        migrations.AddField(
            model_name="message", name="shown",
            field=models.BooleanField(default=True, help_text="On the path the conversation shows (and prompts with).")),
        migrations.AddField(
            model_name="message", name="shown_at",
            field=models.DateTimeField(default=django.utils.timezone.now, help_text="When this version was last shown.")),
        migrations.AddField(
            model_name="message", name="earlier_text",
            field=models.TextField(blank=True, help_text="An answer continued after it reached the max tokens: its "
                                                         "text before the current generation's.")),
        migrations.RunPython(chain_kept_messages, migrations.RunPython.noop),
    ]
