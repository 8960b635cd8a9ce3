"""Which of a sequence's tokens the main computes as one-token sequences, where its rows are so arranged
(engines/own/model_runner.py, `arranged`): the answers' tokens, and a prompt's text as queries.

A token's keys and values depend on the kernel its attention ran on (docs/exactness.md#one-kernel-path). An answer's
tokens are fed as one-token sequences, where four answers at once cost less; a prompt's text read so costs ~1.2x what
it costs as queries after a pasted file. But a conversation's earlier answers come back in its next prompt: from the
cache they hold the keys and values they were fed with, read cold (evicted, another worker) they must be computed
the same way, or the answer would depend on what the cache held. So the layout is a function of the tokens alone:
after each answer opener of the pair's chat template (Qwen's `<|im_start|>assistant\\n`), up to and including the
answer's end token, one-token sequences; the rest queries. A pair whose template opens no answer (the demo's) reads
every token as a one-token sequence, and blocks whose tokens were computed otherwise than this says (an answer
without an opener before it: a raw completion) are not cached.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence


def answer_opener(tokenizer) -> tuple[int, ...]:
    """The tokens the chat template puts before an answer (what its generation prompt adds), or () where it has
    none or no template."""
    turn = [{"role": "user", "content": "x"}]
    try:
        opened = tokenizer.apply_chat_template(turn, add_generation_prompt=True)
        closed = tokenizer.apply_chat_template(turn, add_generation_prompt=False)
    except RuntimeError:  # no chat template
        return ()
    if not opened.startswith(closed) or opened == closed:
        return ()
    return tuple(int(t) for t in tokenizer.encode(opened[len(closed):], add_special_tokens=False).input_ids.data[0])


def one_token_layout(token_ids: Sequence[int], *, opener: Sequence[int], ends: Collection[int]) -> list[bool]:
    """For each token, whether it is an answer's: after an `opener`, up to and including the first of `ends`."""
    layout, inside, last, width = [], False, opener[-1] if opener else None, len(opener)
    for i, token in enumerate(token_ids):
        layout.append(inside)
        if inside:
            inside = token not in ends
        elif token == last and i + 1 >= width and list(token_ids[i + 1 - width:i + 1]) == list(opener):
            inside = True
    return layout
