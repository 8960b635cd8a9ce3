"""Chat actions: a message sent, an answer regenerated or continued, a message edited starts a generation on
the shared path. None deletes anything: a regenerated answer or an edited message is a new version of its
turn (see models.Message), and the conversation shows, and prompts with, one path through them.

A conversation writes one answer at a time, so that each answer's prompt holds the whole conversation
before it; a user has at most CHAT_MAX_CONCURRENT answers in flight (in different conversations). Both
are checked under the user's slot lock, in the transaction that records the new answer: two actions at
once (two tabs, a double click) cannot both pass. The prompt each answer is written from is made in
prompts.py; who watches an answer being written, and when nobody does, in watching.py.
"""

import unicodedata
from dataclasses import replace
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from chatsite.chat import selectors
from chatsite.chat.models import TITLE_MAX_LENGTH, Conversation, Message
from chatsite.chat.prompts import ChatPrompt, prompt_within_context
from inference import errors, limits, pair_checks, transport
from inference.limits import FinishReason
from inference.models import Generation, ModelPair
from inference.serving import web
from inference.serving.records import fail_if_stalled


def answer_slot(*, user):
    """Inside: the user has a free slot for one more answer (see web.in_flight_slot)."""
    return web.in_flight_slot(
        lock=transport.slot_lock("chat", user.pk), limit=settings.CHAT_MAX_CONCURRENT,
        generations=Generation.objects.filter(user=user, source=Generation.Source.CHAT),
        refusal="You already have {count} answers being written (at most {limit} at once): wait for one to "
                "finish, or stop it.")


def send_message(*, user, conversation_id: int | None, pair_slug: str, text: str,
                 options: web.GenerationOptions) -> Message:
    """Add the user's message after the shown path, and a streaming answer; on any error nothing is saved."""
    _check_message_text(text, param="prompt")
    pair = web.find_pair(slug=pair_slug)
    options = chat_options(pair=pair, options=options)
    with answer_slot(user=user):
        conversation = None
        if conversation_id is not None:  # 0 is an id like any other: no such conversation, not a new one
            conversation = _owned(user=user, conversation_id=conversation_id)
            _refuse_if_answering(conversation=conversation)
        earlier = selectors.history(conversation=conversation) if conversation else []
        prompt = prompt_within_context(pair=pair, messages=[*earlier, {"role": "user", "content": text}],
                                       options=options, param="prompt")
        with transaction.atomic():
            if conversation is None:
                conversation = Conversation.objects.create(user=user, pair=pair, title=first_message_title(text))
            else:
                conversation.pair = pair
                if not conversation.messages.exists():  # made first for its system prompt: titled by this message
                    conversation.title = first_message_title(text)
                conversation.save(update_fields=["pair", "title", "updated_at"])
            last = selectors.messages_of(conversation=conversation).last()
            message = Message.objects.create(conversation=conversation, parent=last, role=Message.Role.USER,
                                             content=text)
            return _answer(user=user, pair=pair, conversation=conversation, after=message, options=options,
                           prompt=prompt)


def regenerate(*, user, message_id: int, options: web.GenerationOptions) -> Message:
    """A new version of a shown answer, written after the same message; the old one stays a version of it."""
    with answer_slot(user=user):
        message = _shown_message(user=user, message_id=message_id, role=Message.Role.ASSISTANT)
        conversation = message.conversation
        pair = web.find_pair(slug=conversation.pair.slug if conversation.pair else "")
        options = _kept_budget(pair=pair, message=message, options=chat_options(pair=pair, options=options))
        prompt = prompt_within_context(pair=pair, messages=selectors.history(conversation=conversation, before=message),
                                       options=options, param="message")
        with transaction.atomic():
            conversation.save(update_fields=["updated_at"])
            return _answer(user=user, pair=pair, conversation=conversation, after=message.parent, options=options,
                           prompt=prompt)


def edit_and_resend(*, user, message_id: int, text: str, options: web.GenerationOptions) -> Message:
    """A shown user message rewritten and answered anew: a branch. The new text becomes a version of that
    turn, shown with its answer; the old message and everything after it stay reachable as the other version."""
    _check_message_text(text, param="text")
    with answer_slot(user=user):
        message = _shown_message(user=user, message_id=message_id, role=Message.Role.USER)
        conversation = message.conversation
        pair = web.find_pair(slug=conversation.pair.slug if conversation.pair else "")
        options = chat_options(pair=pair, options=options)
        earlier = selectors.history(conversation=conversation, before=message)
        prompt = prompt_within_context(pair=pair, messages=[*earlier, {"role": "user", "content": text}],
                                       options=options, param="text")
        with transaction.atomic():
            conversation.save(update_fields=["updated_at"])  # the title stays: the old branch is still there
            edited = Message.objects.create(conversation=conversation, parent=message.parent, role=Message.Role.USER,
                                            content=text)
            _show(edited)
            return _answer(user=user, pair=pair, conversation=conversation, after=edited, options=options,
                           prompt=prompt)


def _check_message_text(text: str, *, param: str) -> None:
    """Before anything is tokenized or written: tokenizing megabytes took seconds of the web process."""
    web.check_prompt_text(text, param=param)
    if len(text) > limits.MESSAGE_MAX_CHARS:
        raise errors.InvalidValue(f"A message has at most {limits.MESSAGE_MAX_CHARS:,} characters; this one has "
                                  f"{len(text):,}.", param=param)


def continue_answer(*, user, message_id: int, options: web.GenerationOptions) -> Message:
    """An answer cut at its max tokens or stopped, written further: a new generation whose prompt is the
    conversation with that answer as the assistant's unfinished turn. The last answer is written further in place
    (the cut text moves to `earlier_text`, the message's generation is the newest part); an earlier one, which the
    turns after it followed as it was, becomes a new version of its turn holding its text and going on from there
    (the old version and what followed it stay reachable)."""
    with answer_slot(user=user), transaction.atomic():
        message = _shown_message(user=user, message_id=message_id, role=Message.Role.ASSISTANT)
        conversation = message.conversation
        if message.generation is None or message.generation.finish_reason not in CONTINUABLE:
            raise errors.InvalidValue("Only an answer that reached the max tokens or was stopped can be continued.",
                                      param="message")
        if not message.text:
            raise errors.InvalidValue("This answer was stopped before its first word: regenerate it instead.",
                                      param="message")
        pair = web.find_pair(slug=conversation.pair.slug if conversation.pair else "")
        options = chat_options(pair=pair, options=options)
        if message.replies.filter(shown=True).exists():
            message = Message.objects.create(conversation=conversation, parent=message.parent,
                                             role=Message.Role.ASSISTANT, earlier_text=message.text)
            _show(message)
        prompt = prompt_within_context(pair=pair, messages=selectors.history(conversation=conversation),
                                       options=options, param="message", continuing=True)
        message.earlier_text = message.text
        message.generation = web.start_generation(pair=pair, prompt=prompt.text, prompt_ids=prompt.ids,
                                                  options=options, user=user, source=Generation.Source.CHAT,
                                                  add_special_tokens=False)
        message.messages_left_out = prompt.left_out
        message.save(update_fields=["earlier_text", "generation", "messages_left_out"])
        conversation.save(update_fields=["updated_at"])
        return message


CONTINUABLE = (FinishReason.LENGTH, FinishReason.STOPPED, FinishReason.REPEATING)


SAMPLING_SETTINGS = tuple(pair_checks.CHAT_SAMPLING)  # those a pair's chat defaults hold


def parse_chat_settings(value) -> web.GenerationOptions:
    """The chat's Options as its page sends them; where they set no sampling, the answer samples as the pair's
    publisher advises (chat_options)."""
    if value is not None and not isinstance(value, dict):  # [] too, as [1] is
        raise errors.InvalidType("settings must be an object.", param="settings")
    value = value or {}
    return replace(web.parse_options(value), pair_sampling=not any(name in value for name in SAMPLING_SETTINGS))


def chat_options(*, pair: ModelPair, options: web.GenerationOptions) -> web.GenerationOptions:
    """A chat answer that names no max tokens may run to the pair's cap (start_generation keeps it within what
    the context leaves): the API's short default cut chat answers mid-sentence, where peers let them finish. One that
    names no sampling samples as the pair's publisher advises (ModelPair.chat_sampling; greedy code models looped to
    the cap on their first coding question), as LM Studio, Ollama and Open WebUI do."""
    if options.pair_sampling and pair.chat_sampling:
        sampling = pair.chat_sampling
        options = replace(options, temperature=float(sampling.get("temperature", 1.0)),
                          top_p=float(sampling.get("top_p", 1.0)), top_k=int(sampling.get("top_k", 0)),
                          repetition_penalty=float(sampling.get("repetition_penalty", 1.0)))
    if options.max_new_tokens is not None:
        return options
    return replace(options, max_new_tokens=pair.max_new_tokens_cap)


def _kept_budget(*, pair: ModelPair, message: Message, options: web.GenerationOptions) -> web.GenerationOptions:
    """A continued answer regenerated keeps the length it was given over its parts (the max tokens asked now
    would cut the new version where the old one was first cut)."""
    if not message.earlier_text or options.max_new_tokens is None:
        return options
    written = len(web.encode_prompt(pair=pair, prompt=message.text, add_special_tokens=False))
    return replace(options, max_new_tokens=min(pair.max_new_tokens_cap, max(options.max_new_tokens, written)))


def show_version(*, user, message_id: int) -> Conversation:
    """Show this version of its turn (and, below it, the versions shown last there): the page, the next
    prompt and the exports follow it. Not while an answer is being written: its prompt is the shown path."""
    with answer_slot(user=user), transaction.atomic():
        message = Message.objects.select_related("conversation").filter(id=message_id, conversation__user=user).first()
        if message is None:
            raise errors.NotFound("No such message.", param="message")
        if message.parent is not None and not message.parent.shown:
            raise errors.InvalidValue("That version is not in the conversation shown.", param="message")
        _refuse_if_answering(conversation=message.conversation)
        _show(message)
        return message.conversation


def _answer(*, user, pair: ModelPair, conversation: Conversation, after: Message | None,
            options: web.GenerationOptions, prompt: ChatPrompt) -> Message:
    """A new answer after `after`, shown, its generation started with `prompt` (the shown path it follows,
    counted before the transaction: see prompt_within_context)."""
    answer = Message.objects.create(conversation=conversation, parent=after, role=Message.Role.ASSISTANT)
    _show(answer)
    answer.generation = web.start_generation(pair=pair, prompt=prompt.text, prompt_ids=prompt.ids, options=options,
                                             user=user, source=Generation.Source.CHAT, add_special_tokens=False)
    answer.messages_left_out = prompt.left_out
    answer.save(update_fields=["generation", "messages_left_out"])
    return answer


def _show(message: Message) -> None:
    """Make `message` its turn's shown version: the path below its parent is unmarked, then marked again
    from `message` down, following at each fork the version shown last."""
    path = list(selectors.messages_of(conversation=message.conversation).values_list("id", "parent_id"))
    fork = next((i for i, (_, parent_id) in enumerate(path) if parent_id == message.parent_id), len(path))
    Message.objects.filter(id__in=[message_id for message_id, _ in path[fork:]]).update(shown=False)
    now = timezone.now()
    shown: Message | None = message
    while shown is not None:
        Message.objects.filter(id=shown.id).update(shown=True, shown_at=now)
        shown = shown.replies.order_by("-shown_at", "-id").first()
    message.shown, message.shown_at = True, now


def _shown_message(*, user, message_id: int, role: str) -> Message:
    """The user's message to write a new answer from, under the user's slot lock."""
    message = Message.objects.select_related("conversation", "conversation__pair", "generation").filter(
        id=message_id, conversation__user=user, role=role).first()
    if message is None:
        raise errors.NotFound("No such answer." if role == Message.Role.ASSISTANT else "No such message.",
                              param="message")
    _refuse_if_answering(conversation=message.conversation)  # first: the likelier reason, said in its words
    if not message.shown:
        raise errors.InvalidValue("That version is not the one shown: show it first.", param="message")
    return message


def new_conversation(*, user, system_prompt: str) -> Conversation:
    """An empty conversation, made before its first message when that message needs a system prompt;
    the first message titles it."""
    web.check_prompt_text(system_prompt, param="system_prompt")
    _check_system_prompt_length(system_prompt)
    return Conversation.objects.create(user=user, title="New chat", system_prompt=system_prompt)


INVISIBLE = {"Cf", "Cc", "Co", "Cs", "Cn"}  # format (zero-width, bidi controls), control, private, surrogate, none


def rename_conversation(*, user, conversation_id: int, title: str) -> Conversation:
    title = " ".join(title.split())
    if not title:
        raise errors.InvalidValue("A conversation needs a title.", param="title")
    if any(unicodedata.category(character) in INVISIBLE for character in title):
        raise errors.InvalidValue("A title cannot hold invisible or direction-changing characters (zero-width "
                                  "spaces, right-to-left overrides): what the list shows must be what it says.",
                                  param="title")
    if len(title) > TITLE_MAX_LENGTH:
        raise errors.InvalidValue(f"A title has at most {TITLE_MAX_LENGTH} characters.", param="title")
    conversation = _owned(user=user, conversation_id=conversation_id)
    conversation.title, conversation.title_source = title, Conversation.TitleSource.USER  # never written over
    conversation.save(update_fields=["title", "title_source"])  # not moved to the top of the list: nothing was said
    return conversation


TITLE_REQUEST = "Write a title of three to six words for this conversation. Answer with the title alone."
TITLE_MAX_TOKENS = 12


def start_written_title(*, user, generation_id) -> tuple[int, Generation] | None:
    """After a conversation's first answer (`generation_id`) has ended, the pair writes the conversation a title, as
    Open WebUI does: greedy (the main's own words), a few tokens, asked as a follow-up would be (its prompt is the
    conversation's, which the worker that wrote the answer still holds, and the request), on the engine the pair's
    answers use (`speculative: false` would load the main alone beside it on a pair served by the library's
    pipelines: memory for a title). Once per conversation, never over a title the user gave; it takes no chat slot,
    and none waits for it. The conversation and the title's generation, or None."""
    message = (Message.objects.select_related("conversation", "conversation__pair", "generation")
               .filter(generation_id=generation_id, conversation__user=user, role=Message.Role.ASSISTANT).first())
    ended = (Generation.Status.FINISHED, Generation.Status.STOPPED)  # stopped by its user or for repeating itself too
    if message is None or message.generation is None or message.generation.status not in ended:
        return None
    conversation, pair = message.conversation, message.conversation.pair
    if (pair is None or conversation.title_source != Conversation.TitleSource.FIRST_MESSAGE
            or conversation.messages.filter(role=Message.Role.ASSISTANT).count() != 1):
        return None
    text = web.chat_prompt(pair=pair, messages=[*selectors.history(conversation=conversation),
                                                {"role": "user", "content": TITLE_REQUEST}])
    ids = web.encode_prompt(pair=pair, prompt=text, add_special_tokens=False)
    if len(ids) + TITLE_MAX_TOKENS > web.main_context(pair=pair):
        return None  # the first message's line stays its title
    asked = Conversation.objects.filter(id=conversation.id, title_source=Conversation.TitleSource.FIRST_MESSAGE)
    if not asked.update(title_source=Conversation.TitleSource.ASKED):
        return None  # asked already (another tab followed the same answer)
    # No transaction around the two writes (on SQLite it would hold every writer while the turn is routed): a
    # title not started leaves the first message's line.
    options = web.GenerationOptions(max_new_tokens=TITLE_MAX_TOKENS)
    try:
        return conversation.id, web.start_generation(pair=pair, prompt=text, prompt_ids=ids, options=options,
                                                     user=user, source=Generation.Source.TITLE,
                                                     add_special_tokens=False)
    except errors.ServiceError:
        return None  # nobody serves the pair now


def keep_written_title(*, user, conversation_id: int, generation_id) -> str | None:
    """The title the pair wrote (start_written_title), made the conversation's unless the user renamed it meanwhile
    or the model wrote nothing a title can be; the title kept, or None. It stays where it is in the list."""
    generation = Generation.objects.filter(id=generation_id, user=user, source=Generation.Source.TITLE,
                                           status=Generation.Status.FINISHED).first()
    title = _written_title(generation.text) if generation else ""
    if not title:
        return None
    kept = Conversation.objects.filter(id=conversation_id, user=user, title_source=Conversation.TitleSource.ASKED)
    if not kept.update(title=title, title_source=Conversation.TitleSource.MODEL):  # update: updated_at stays
        return None
    return title


def _written_title(text: str) -> str:
    """A model's title as the list shows titles: its first line that says something, without quotes, markdown or a
    "Title:" label."""
    for line in text.splitlines():
        said = line.strip().strip("#*_`\"' ").removeprefix("Title:").removeprefix("title:").strip("#*_`\"'. ")
        if said:
            return first_message_title(said)
    return ""


def set_system_prompt(*, user, conversation_id: int, system_prompt: str) -> Conversation:
    """Used for the answers written from now on (the kept answers stay as they were written)."""
    if "\x00" in system_prompt:
        raise errors.InvalidValue("The system prompt contains a NUL character.", param="system_prompt")
    _check_system_prompt_length(system_prompt)
    conversation = _owned(user=user, conversation_id=conversation_id)
    conversation.system_prompt = system_prompt.strip()
    conversation.save(update_fields=["system_prompt", "updated_at"])
    return conversation


def _check_system_prompt_length(system_prompt: str) -> None:
    length = len(system_prompt.strip())
    if length > limits.SYSTEM_PROMPT_MAX_CHARS:
        raise errors.InvalidValue(f"A system prompt has at most {limits.SYSTEM_PROMPT_MAX_CHARS:,} characters; this "
                                  f"one has {length:,}.", param="system_prompt")


def delete_conversation(*, user, conversation_id: int) -> None:
    """Its answers still being written are stopped first: nobody could see them any more."""
    conversation = _owned(user=user, conversation_id=conversation_id)
    for generation in Generation.objects.filter(message__conversation=conversation, status__in=web.IN_FLIGHT):
        web.request_stop(generation=generation)
    conversation.delete()


def _refuse_if_answering(*, conversation: Conversation) -> None:
    """Called under the user's slot lock: an answer still being written in this conversation (one that will
    never end is failed first, so it cannot hold the conversation) refuses a new one."""
    in_flight = Generation.objects.filter(message__conversation=conversation, status__in=web.IN_FLIGHT)
    if any(not fail_if_stalled(generation_id=generation_id)
           for generation_id in in_flight.values_list("id", flat=True)):
        raise errors.AnswerInProgress("An answer is still being written in this chat: wait for it to finish, "
                                      "or stop it.", param="conversation")


def _owned(*, user, conversation_id: int) -> Conversation:
    conversation = selectors.conversation_for(user=user, conversation_id=conversation_id)
    if conversation is None:
        raise errors.NotFound("No such conversation.", param="conversation")
    return conversation


TITLE_CHARS = 48  # what the sidebar shows of a title on one line


def first_message_title(text: str) -> str:
    """A short title from the first message: its first line outside code fences (a pasted block then its question is
    titled by the question, so two chats on one paste differ), cut at a word, without the invisible characters a
    rename refuses."""
    visible = "".join(character for character in text if unicodedata.category(character) not in INVISIBLE - {"Cc"})
    prose: list[str] = []
    code: list[str] = []
    fenced = False
    for line in visible.splitlines():
        if line.strip().startswith(("```", "~~~")):
            fenced = not fenced
        elif line.strip():
            (code if fenced else prose).append(line)
    first = " ".join((prose or code or [visible])[0].split()) or "New chat"
    if len(first) <= TITLE_CHARS:
        return first
    cut = first[:TITLE_CHARS]
    return (cut.rsplit(" ", 1)[0] if " " in cut else cut).rstrip(" ,.;:(") + "…"


def stop_all_answers(*, user) -> None:
    """Stop every answer of the user still in flight (their access was revoked)."""
    for generation in Generation.objects.filter(user=user, status__in=web.IN_FLIGHT):
        web.request_stop(generation=generation)


def purge_history(*, older_than_days: int) -> tuple[int, int]:
    """Delete conversations untouched for that many days, then ended generations as old that no
    kept message shows (API and benchmark answers); running ones are never touched. Returns the
    numbers of conversations and generations deleted."""
    cutoff = timezone.now() - timedelta(days=older_than_days)
    _, conversations = Conversation.objects.filter(updated_at__lt=cutoff).delete()
    _, generations = Generation.objects.filter(
        created_at__lt=cutoff, message__isnull=True,
        status__in=[Generation.Status.FINISHED, Generation.Status.STOPPED, Generation.Status.FAILED],
    ).delete()
    return conversations.get("chat.Conversation", 0), generations.get("inference.Generation", 0)
