from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import render

from chatsite.chat import selectors
from inference.models import ModelPair


def answer_json(message) -> dict:
    """What the page's script needs to show a kept message (and resume it if still running)."""
    data = {"id": message.id, "role": message.role, "text": message.text}
    generation = message.generation
    if generation is not None:
        data["generation"] = {
            "id": str(generation.id), "status": generation.status, "done": generation.is_done,
            "finish_reason": generation.finish_reason, "error": generation.error, "steps": generation.steps,
            "tokens_per_s": generation.tokens_per_s, "ttft_ms": generation.ttft_ms,
            "acceptance_rate": generation.acceptance_rate, "mean_accepted_length": generation.mean_accepted_length,
            "completion_tokens": generation.completion_tokens, "main_steps": generation.main_steps,
            "pair": generation.pair.slug, "speculative_mode": generation.speculative_mode,
            "speculative_reason": generation.speculative_reason, "speculative_k": generation.speculative_k,
        }
    return data


@login_required
def chat(request, conversation_id: int | None = None):
    conversation = None
    messages = []
    if conversation_id is not None:
        conversation = selectors.conversation_for(user=request.user, conversation_id=conversation_id)
        if conversation is None:
            raise Http404("No such conversation")
        messages = [answer_json(m) for m in selectors.messages_of(conversation=conversation)]
    pairs = list(ModelPair.objects.filter(enabled=True).values("slug", "name", "num_assistant_tokens",
                                                                "assistant_confidence_threshold", "max_new_tokens_cap",
                                                                "draft_dir", "prompt_lookup"))
    selected = conversation.pair.slug if conversation and conversation.pair else (pairs[0]["slug"] if pairs else "")
    return render(request, "chat/chat.html", {
        "conversation": conversation,
        "conversations": selectors.conversations_for(user=request.user),
        "page_data": {"conversation": conversation.id if conversation else None, "messages": messages,
                      "pairs": pairs, "pair": selected},
    })
