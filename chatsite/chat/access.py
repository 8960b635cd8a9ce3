"""Whether an open chat socket's session still stands: Django checks a session on every HTTP request,
a websocket only when it opens, so open sockets ask this again every ACCESS_RECHECK_S."""

from __future__ import annotations

from importlib import import_module

from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model, load_backend
from django.utils.crypto import constant_time_compare

DEACTIVATED = "Your account was deactivated: this chat is closed."
SESSION_ENDED = "Your session has ended (a logout, or a password change): this chat is closed. Log in again."


def session_ended(*, session_key: str | None, user_id) -> str | None:
    """Why the session a socket opened with no longer lets it in (its message for the user), or None
    while it does: the session deleted or expired (a logout, an admin clearing sessions), logged in as
    someone else, its password hash changed, or the user deactivated. Read only, as Django's
    `get_user` is on a request, but without its side effects (a flush, a new key the browser would
    not get)."""
    if not get_user_model().objects.filter(pk=user_id, is_active=True).exists():
        return DEACTIVATED
    if not session_key:
        return SESSION_ENDED
    data = import_module(settings.SESSION_ENGINE).SessionStore(session_key=session_key).load()  # {} once gone
    backend_path = data.get(BACKEND_SESSION_KEY)
    if str(data.get(SESSION_KEY)) != str(user_id) or backend_path not in settings.AUTHENTICATION_BACKENDS:
        return SESSION_ENDED
    user = load_backend(backend_path).get_user(user_id)  # None if the backend no longer lets them in
    if user is None:
        return DEACTIVATED
    session_hash = data.get(HASH_SESSION_KEY) or ""
    hashes = [user.get_session_auth_hash(), *user.get_session_auth_fallback_hash()]
    if not session_hash or not any(constant_time_compare(session_hash, known) for known in hashes):
        return SESSION_ENDED
    return None
