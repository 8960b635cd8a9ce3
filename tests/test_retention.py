"""History is kept for SPECCHAT_RETENTION_DAYS and then deleted; nothing running is touched."""

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from chatsite.chat.models import Conversation, Message
from inference.models import Generation

pytestmark = pytest.mark.django_db


def test_purge_deletes_old_history_and_keeps_recent_and_running(demo_pair, user):
    old = timezone.now() - timedelta(days=40)

    def generation(status, *, days_old=40):
        made = Generation.objects.create(pair=demo_pair, prompt="p", status=status)
        Generation.objects.filter(id=made.id).update(created_at=timezone.now() - timedelta(days=days_old))
        return made

    stale = Conversation.objects.create(user=user, title="stale")
    Message.objects.create(conversation=stale, role="assistant", generation=generation("finished"))
    Conversation.objects.filter(id=stale.id).update(updated_at=old)
    fresh = Conversation.objects.create(user=user, title="fresh")
    kept_answer = generation("finished")
    Message.objects.create(conversation=fresh, role="assistant", generation=kept_answer)
    old_api, running, recent_api = generation("failed"), generation("running"), generation("finished", days_old=1)

    out = StringIO()
    call_command("purge_history", "--days", "30", stdout=out)

    assert "Deleted 1 conversation(s) and 2 other answer(s)" in out.getvalue()
    assert list(Conversation.objects.values_list("title", flat=True)) == ["fresh"]
    left = set(Generation.objects.values_list("id", flat=True))
    assert left == {kept_answer.id, running.id, recent_api.id} and old_api.id not in left
