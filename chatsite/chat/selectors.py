import re

import redis
from django.db.models import Exists, OuterRef, Q

from chatsite.chat.models import Conversation, Message
from inference import selectors as inference_selectors
from inference import transport
from inference.engines.speculation_stats import FIGURES
from inference.models import JobStatus, ModelPair
from inference.serving import calibrated


def conversations_for(*, user):
    return Conversation.objects.filter(user=user).only("id", "title", "updated_at")


SEARCH_MAX_WORDS = 8
SEARCH_MAX_CHARS = 256  # what the sidebar's search box sends is a few words


def conversations_matching(*, user, words: list[str]) -> list[int]:
    """The ids of the user's conversations holding every word (case aside) in the title or in a message
    of the path each shows, the answers' text included."""
    conversations = Conversation.objects.filter(user=user)
    for word in words[:SEARCH_MAX_WORDS]:
        in_messages = Message.objects.filter(conversation=OuterRef("pk"), shown=True).filter(
            Q(content__icontains=word) | Q(earlier_text__icontains=word) | Q(generation__text__icontains=word))
        conversations = conversations.filter(Q(title__icontains=word) | Exists(in_messages))
    return list(conversations.values_list("id", flat=True))


def conversation_for(*, user, conversation_id) -> Conversation | None:
    return Conversation.objects.filter(user=user, id=conversation_id).first()


def messages_of(*, conversation: Conversation):
    """The path the conversation shows (one version of each turn), in order: what the page lists, the next
    prompt reads and the exports keep."""
    return conversation.messages.filter(shown=True).select_related("generation", "generation__pair")


def history(*, conversation: Conversation, before: Message | None = None) -> list[dict]:
    """The shown path as chat-template messages (failed or empty answers left out, as an answer not yet
    written is), after the conversation's system prompt if it has one; only what precedes `before` (a shown
    message) if given: what a new version of that turn follows."""
    messages = list(messages_of(conversation=conversation))
    if before is not None:
        messages = messages[:[m.id for m in messages].index(before.id)]
    system = [{"role": "system", "content": conversation.system_prompt}] if conversation.system_prompt.strip() else []
    return system + [{"role": m.role, "content": m.text} for m in messages if m.text]


def shown_path_json(*, conversation: Conversation) -> list[dict]:
    """The shown path as the page's script renders it, each message with the ids of its turn's versions
    (oldest first), for its arrows (1/2)."""
    versions: dict[int | None, list[int]] = {}
    for message_id, parent_id in conversation.messages.order_by("created_at", "id").values_list("id", "parent_id"):
        versions.setdefault(parent_id, []).append(message_id)
    return [{**message_json(m), "versions": versions[m.parent_id]} for m in messages_of(conversation=conversation)]


def message_json(message: Message) -> dict:
    """What the page's script needs to show a kept message (and resume its answer if still running)."""
    data = {"id": message.id, "role": message.role, "text": message.text, "earlier_text": message.earlier_text,
            "messages_left_out": message.messages_left_out}
    generation = message.generation
    if generation is not None:
        data["generation"] = {
            "id": str(generation.id), "status": generation.status, "done": generation.is_done,
            "finish_reason": generation.finish_reason, "error": generation.error, "steps": generation.steps,
            **{name: getattr(generation, name) for name in FIGURES},
            "pair": generation.pair.slug, "speculative_mode": generation.speculative_mode,
            "speculative_reason": generation.speculative_reason, "speculative_k": generation.speculative_k,
            "speculative_route": generation.speculative_route,
            "speculative_reason_codes": generation.speculative_reason_codes,
        }
    return data


def chat_pairs() -> list[dict]:
    """The enabled pairs as the chat's picker shows them, the admin's default first, each with whether
    a worker serves it now (None when Redis cannot be asked: the page still opens) and what its workers' host
    measured of it (host_figures)."""
    pairs = sorted(ModelPair.objects.filter(enabled=True), key=lambda p: (not p.is_default, p.name))
    try:
        workers = inference_selectors.live_workers(client=transport.sync_client())
    except redis.RedisError:
        workers = None
    return [{
        "slug": p.slug, "name": p.name, "description": p.description, "completes_text": p.completes_text,
        "max_new_tokens_cap": p.max_new_tokens_cap, "num_assistant_tokens": p.num_assistant_tokens,
        "chat_sampling": p.chat_sampling,
        "served": None if workers is None else inference_selectors.pair_state(pair=p, workers=workers).served,
        **host_figures(pair=p, workers=workers or []),
    } for p in pairs]


def host_figures(*, pair: ModelPair, workers: list[dict]) -> dict:
    """What the server does with the pair on the host of a worker serving it, from the pair's newest finished
    calibration there: the main alone's baseline, as the admin and /v1/config quote it (what an answer's speed is
    weighed against, serving/calibrated.py; None where that host is not calibrated, and no speed-up is claimed),
    and the K an answer alone that names none is planned with there, as that worker's heartbeat says (the worker
    plans; the web does not: 0 the main alone, None the draft going on while confident or no worker yet)."""
    hosts = [_machine(beat.get("host_facts") or {}) for beat in workers if pair.queue in beat.get("queues", ())]
    calibration = next((c for c in pair.calibrations.filter(status=JobStatus.FINISHED).order_by("-finished_at")
                        if c.results.get("fastest") and _machine(c.host_facts) in hosts), None)
    alone = calibrated.summary(calibration).get("main_alone_tokens_per_s") if calibration else None
    planned = next((beat["lone_k"][pair.slug] for beat in workers if pair.slug in beat.get("lone_k", {})), None)
    return {"main_alone_tokens_per_s": alone, "planned_k": planned}


def _machine(facts: dict) -> dict:
    """A host's facts but its device (a calibration is of the pair's device, a heartbeat names the CPU's)."""
    return {name: value for name, value in facts.items() if name != "device"}


def new_chat_pair(*, user, pairs: list[dict]) -> str:
    """The pair a new chat opens on: the one the user last wrote with while it is offered, else the default
    (listed first). The page moves on to a pair that can answer when nobody serves this one."""
    offered = [p["slug"] for p in pairs]
    last = (Conversation.objects.filter(user=user, pair__slug__in=offered).order_by("-updated_at")
            .values_list("pair__slug", flat=True).first())
    return last or (offered[0] if offered else "")


def export_json(*, conversation: Conversation) -> dict:
    """The conversation with each answer's figures, for a file the user keeps."""
    messages = []
    for m in messages_of(conversation=conversation):
        item: dict = {"role": m.role, "content": m.text, "created_at": m.created_at.isoformat()}
        if m.generation is not None:
            g = m.generation
            item["answer"] = {"pair": g.pair.slug, "status": g.status, "finish_reason": g.finish_reason,
                              "completion_tokens": g.completion_tokens, "tokens_per_s": g.tokens_per_s,
                              "acceptance_rate": g.acceptance_rate, "speculative_mode": g.speculative_mode,
                              "speculative_k": g.speculative_k, "error": g.error}
        messages.append(item)
    return {"title": conversation.title, "pair": conversation.pair.slug if conversation.pair else None,
            "system_prompt": conversation.system_prompt, "created_at": conversation.created_at.isoformat(),
            "messages": messages}


def export_markdown(*, conversation: Conversation) -> str:
    """The conversation as a Markdown document: answers as written (a code block an answer left open, cut or
    stopped, closed at its end, so it cannot swallow the turns after it), user messages as quoted text (kept
    verbatim in a fenced block when they hold code, as a completion pair's prompts do)."""
    lines = [f"# {conversation.title}", ""]
    if conversation.pair:
        lines += [f"Pair: {conversation.pair.name}", ""]
    if conversation.system_prompt.strip():
        lines += ["## System prompt", "", _fenced(conversation.system_prompt), ""]
    for m in messages_of(conversation=conversation):
        if m.role == Message.Role.USER:
            lines += ["## You", "", _fenced(m.text), ""]
        else:
            lines += ["## Answer", "", _closed(m.text) if m.text else "*(no text)*", ""]
    return "\n".join(lines)


def _fenced(text: str) -> str:
    """Text in a code fence longer than any run of backticks inside it, so it cannot close early."""
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", text)), default=0))
    return f"{fence}\n{text}\n{fence}"


FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")


def _closed(text: str) -> str:
    """The text with a fenced code block it leaves open closed (CommonMark: a fence closes with the same
    character, at least as many, and nothing after it but spaces)."""
    opened = ""
    for line in text.splitlines():
        match = FENCE.match(line)
        if match is None:
            continue
        fence, rest = match.groups()
        if not opened:
            if not (fence[0] == "`" and "`" in rest):  # a backtick fence's info string holds no backtick
                opened = fence
        elif fence[0] == opened[0] and len(fence) >= len(opened) and not rest.strip():
            opened = ""
    if not opened:
        return text
    return f"{text}{opened}" if text.endswith("\n") else f"{text}\n{opened}"
