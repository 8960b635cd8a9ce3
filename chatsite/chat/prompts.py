"""A conversation as the model reads it: the shown path, rendered with the pair's chat template and tokenized,
its oldest turns left out when it is longer than the model's context (chat actions, services.py, send it)."""

from dataclasses import dataclass

from chatsite.chat.models import Message
from inference import errors, limits
from inference.models import ModelPair
from inference.serving import web


@dataclass(frozen=True, kw_only=True)
class ChatPrompt:
    text: str
    ids: list[int]  # its tokens, counted to fit the context and carried to the worker as they are
    left_out: int  # the conversation's oldest messages the model does not read


def prompt_within_context(*, pair: ModelPair, messages: list[dict], options: web.GenerationOptions, param: str,
                          continuing: bool = False) -> ChatPrompt:
    """`messages` (selectors.history, and the new message if any) as the model reads them. Tokenized outside the
    actions' transactions: on SQLite a transaction that has written holds the write lock of every user and
    worker, and tokenizing a long conversation takes a while. One longer than the model's context leaves
    out its oldest turns (a user message and the answers after it), keeping the system prompt and the newest
    message, until the answer has room for its max tokens (up to half the context): a long conversation goes on
    rather than being refused for good. The newest message alone is still sent when it leaves MIN_ANSWER_TOKENS; one
    that does not is refused (errors.ContextLengthExceeded naming `param`). `continuing`: the shown path ends
    with an answer cut at its max tokens, which the model writes on from its last character."""
    system = messages[:1] if messages and messages[0]["role"] == "system" else []
    turns = messages[len(system):]
    starts = [i for i, m in enumerate(turns) if m["role"] == Message.Role.USER] or [0]  # where a turn begins
    context = web.main_context(pair=pair)
    asked = web.asked_max_new_tokens(pair=pair, options=options)
    room = min(asked, context // 2)

    def from_turn(start: int) -> ChatPrompt:
        text = web.chat_prompt(pair=pair, messages=system + turns[start:])
        if continuing:
            text = _unfinished(text, answer=turns[-1]["content"])
        return ChatPrompt(text=text, ids=web.encode_prompt(pair=pair, prompt=text, add_special_tokens=False),
                          left_out=start)

    whole = from_turn(0)
    if len(whole.ids) + room <= context:
        return whole
    kept = from_turn(starts[-1])
    tokens = len(kept.ids)
    if tokens + room > context:
        if tokens + min(asked, limits.MIN_ANSWER_TOKENS) <= context:
            return kept
        with_system = " with the system prompt" if system else ""
        raise errors.ContextLengthExceeded(
            f"This message is too long for the model: it is {tokens:,} tokens{with_system}, and the model reads "
            f"at most {context:,} (its context), its answer included. Shorten it"
            f"{' or the system prompt' if system else ''}.", param=param)
    low, high = 0, len(starts) - 1  # the fewest turns to leave out: starts[high] is known to fit
    while low < high:
        middle = (low + high) // 2
        candidate = from_turn(starts[middle])
        if len(candidate.ids) + room <= context:
            kept, high = candidate, middle
        else:
            low = middle + 1
    return kept


def _unfinished(prompt: str, *, answer: str) -> str:
    """The rendered conversation cut right after the last answer's text, so that the model goes on writing
    that answer rather than a new one: what transformers' continue_final_message does, for the OpenVINO
    tokenizer's apply_chat_template, which has no such option (the template's end of turn and the next
    generation prompt, if any, are dropped)."""
    at = prompt.rfind(answer)
    if not answer or at == -1:
        raise errors.InvalidValue("This pair's chat template cannot continue an answer.", param="message")
    return prompt[:at + len(answer)]
