import json
from collections.abc import Callable

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.text import slugify
from django.views.decorators.http import require_POST

from chatsite.chat import selectors, services
from inference import errors, json_input
from inference.serving import web


@login_required
def chat(request, conversation_id: int | None = None):
    conversation = None
    messages = []
    if conversation_id is not None:
        conversation = selectors.conversation_for(user=request.user, conversation_id=conversation_id)
        if conversation is None:  # deleted (in another tab, say): a fresh chat, which says so
            return redirect(f"{reverse('chat')}?gone")
        messages = selectors.shown_path_json(conversation=conversation)
    pairs = selectors.chat_pairs()
    selected = (conversation.pair.slug if conversation and conversation.pair
                else selectors.new_chat_pair(user=request.user, pairs=pairs))
    return render(request, "chat/chat.html", {
        "conversation": conversation,
        "conversations": selectors.conversations_for(user=request.user),
        "page_data": {"conversation": conversation.id if conversation else None, "messages": messages,
                      "pairs": pairs, "pair": selected,
                      "system_prompt": conversation.system_prompt if conversation else "",
                      "gone": "gone" in request.GET},
    })


def _json_action(action: Callable[[dict], dict]):
    """A POST of a JSON object answered with JSON; a ServiceError becomes {"error": {message, param,
    code}} with its status, as the API and the socket word them."""
    @login_required
    @require_POST
    def view(request, **kwargs):
        try:
            body = json_input.parse(request.body or b"{}")
            if not isinstance(body, dict):
                raise errors.InvalidJson("The body must be a JSON object.")
            return JsonResponse(action({**body, **kwargs, "user": request.user}))
        except json_input.JsonInputError as exc:
            error: errors.ServiceError = errors.InvalidJson(f"The body must be JSON: {exc}.")
        except RequestDataTooBig:  # Django's own bound, answered in the page's words rather than its HTML page
            error = errors.RequestTooLarge(f"The body has at most {settings.DATA_UPLOAD_MAX_MEMORY_SIZE:,} bytes.")
        except errors.ServiceError as exc:
            error = exc
        return _error_response(error)
    return view


def _error_response(error: errors.ServiceError) -> JsonResponse:
    return JsonResponse({"error": {"message": error.message, "param": error.param, "code": error.code}},
                        status=error.status)


def _text(body: dict, name: str) -> str:
    value = body.get(name, "")
    if not isinstance(value, str):
        raise errors.InvalidType(f"{name} must be a string.", param=name)
    return value


def _options(body: dict) -> web.GenerationOptions:
    return services.parse_chat_settings(body.get("settings"))


@_json_action
def new_conversation(body: dict) -> dict:
    conversation = services.new_conversation(user=body["user"], system_prompt=_text(body, "system_prompt"))
    return {"conversation": conversation.id}


@_json_action
def rename(body: dict) -> dict:
    conversation = services.rename_conversation(user=body["user"], conversation_id=body["conversation_id"],
                                                title=_text(body, "title"))
    return {"title": conversation.title}


@_json_action
def system_prompt(body: dict) -> dict:
    conversation = services.set_system_prompt(user=body["user"], conversation_id=body["conversation_id"],
                                              system_prompt=_text(body, "system_prompt"))
    return {"system_prompt": conversation.system_prompt}


@_json_action
def delete(body: dict) -> dict:
    services.delete_conversation(user=body["user"], conversation_id=body["conversation_id"])
    return {"deleted": body["conversation_id"]}


@_json_action
def edit(body: dict) -> dict:
    """The answer is started here; the page follows its events on its websocket as any other's."""
    message = services.edit_and_resend(user=body["user"], message_id=body["message_id"], text=_text(body, "text"),
                                       options=_options(body))
    return {"message": message.id, "generation": str(message.generation_id),
            "messages": selectors.shown_path_json(conversation=message.conversation)}


@_json_action
def show_version(body: dict) -> dict:
    """Another version of a turn shown: answered with the conversation's shown path, which the page lists."""
    conversation = services.show_version(user=body["user"], message_id=body["message_id"])
    return {"messages": selectors.shown_path_json(conversation=conversation)}


@login_required
def search(request):
    """The conversations whose title or messages hold every word of `q`: the sidebar's search."""
    query = request.GET.get("q", "")
    if len(query) > selectors.SEARCH_MAX_CHARS:
        return _error_response(errors.InvalidValue(
            f"q has at most {selectors.SEARCH_MAX_CHARS} characters; this one has {len(query):,}.", param="q"))
    if "\x00" in query:  # PostgreSQL refuses it in a query; SQLite matched every conversation
        return _error_response(errors.InvalidValue("q contains a NUL character.", param="q"))
    words = query.split()
    return JsonResponse({"conversations": selectors.conversations_matching(user=request.user, words=words)})


@login_required
def export(request, conversation_id: int, fmt: str):
    conversation = selectors.conversation_for(user=request.user, conversation_id=conversation_id)
    if conversation is None:
        raise Http404("No such conversation")
    if fmt == "json":
        content = json.dumps(selectors.export_json(conversation=conversation), indent=2, ensure_ascii=False)
        content_type = "application/json"
    else:
        content, content_type = selectors.export_markdown(conversation=conversation), "text/markdown; charset=utf-8"
    response = HttpResponse(content, content_type=content_type)
    name = slugify(conversation.title)[:60] or f"conversation-{conversation.id}"
    response["Content-Disposition"] = f'attachment; filename="{name}.{fmt}"'
    return response
