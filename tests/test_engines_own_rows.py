"""The own engine's rows of logits (engines/own/kv_cache.py on the PagedAttention op), on the demo pair's main as the
engine compiles it (dynamic quantization on): each case computes the same logits two ways, which must be bitwise
equal, in either arrangement of the main's rows. Greedy speculation gives the main alone's tokens, a warm prompt the
cold one's, an answer under load its answer alone, only as long as these hold (docs/exactness.md). A control case
shows the comparison tells logits apart."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import openvino as ov
import pytest
from django.conf import settings

from inference.engines.decoding import DecodingParams, Speculation
from inference.engines.interface import Finished
from inference.engines.own.draft_head import compile_draft
from inference.engines.own.engine import OwnEngine
from inference.engines.own.kv_cache import PagedModel, PagedSequence
from inference.engines.own.model_runner import ModelRunner
from inference.engines.own.scheduler import Scheduler
from inference.engines.spec import PairSpec
from inference.limits import Route
from tests.test_engines_prefix_cache import FILE

pytestmark = pytest.mark.no_database

PAIR = Path(settings.MODELS_ROOT) / settings.DEMO_PAIR_DIR
SPEC = PairSpec(slug="own-rows", main_dir=str(PAIR / "main"), draft_dir=str(PAIR / "draft"),
                route=Route.OWN_SPECULATIVE, pair_default=Route.OWN_SPECULATIVE, dynamic_quantization=True,
                kv_pool_mb=64)
CODE = FILE[: FILE.index('    with open(tmp, "w")')]  # the pasted module's first lines: under two blocks
# Tokens to feed after a prompt (the answer's, or proposals), and proposals the main rejects
ANSWER = [1012, 2203, 318, 64, 1500, 2857, 911, 4001]
OPENER, QUESTION = "\n### Answer:\n", "\n### Question: and the other way round?"
REJECTED = [[7, 8, 9], [3001, 3002], [17]]


def arrange(engine: OwnEngine, *, token_rows: bool, opener: tuple[int, ...] | None = None) -> None:
    """The engine's main in this arrangement of its rows (engines/own/model_runner.py, `arranged`), whichever this
    host's costs pick; `opener`: where its prompts' answers begin (engines/own/answer_layout.py), in place of its
    template's. One-token sequences are not alike everywhere: where the engine's check finds them parting from the
    main alone's rows, it must never pick them, and the cases run in the arrangement it serves."""
    if opener is not None:
        engine.main.answer_opener, engine.main.answer_ends = opener, frozenset(engine.eos_ids)
    runner = engine.main.runner
    runner.steady = runner.arranged(token_rows=token_rows)
    if token_rows and not runner.alike_as_tokens(runner.steady):
        assert not runner.arranged().token_rows, "it picked an arrangement that parts from the main alone"
        pytest.skip("one-token sequences part from the main alone's rows on this host and configuration: "
                    "the engine serves queries here")
    engine.main.scheduler = Scheduler(runner)  # its chunks within the arrangement's sizes


@pytest.fixture(scope="module", params=["queries", "one-token sequences", "answers one-token, the rest queries"])
def engine(request) -> OwnEngine:
    """The engine in each arrangement of the main's rows it may serve here: every case holds in each. The demo's
    template opens no answer (its prompts are read as one-token sequences); the third gives it an opener, as Qwen's
    `<|im_start|>assistant\n` is the real pair's."""
    engine = OwnEngine(SPEC)
    opener = tuple(engine.tokenizer.encode(OPENER, add_special_tokens=False).input_ids.data[0].tolist())
    arrange(engine, token_rows=request.param != "queries", opener=opener if request.param.startswith("answers") else None)
    return engine


@pytest.fixture(scope="module")
def prompt(engine: OwnEngine) -> list[int]:
    ids = engine.tokenizer.encode(CODE).input_ids.data[0].tolist()
    assert 2 * engine.main.pool.block_tokens - 10 < len(ids) < 2 * engine.main.pool.block_tokens, len(ids)
    return ids


def fresh_main(engine: OwnEngine, *, chunk_tokens: int | None = None) -> PagedModel:
    """The engine's compiled main with cache tensors and a pool of its own, caching nothing; `chunk_tokens`: a prompt
    read in chunks of that many (the scheduler's budget two chunks, as it sets it)."""
    model = PagedModel(ModelRunner(engine.main.runner.compiled, pool_bytes=16 * 2**20,
                                   steady=engine.main.runner.steady), caching=False)
    model.answer_opener, model.answer_ends = engine.main.answer_opener, engine.main.answer_ends
    if chunk_tokens:
        model.scheduler.chunk_tokens, model.scheduler.step_tokens = chunk_tokens, 2 * chunk_tokens
    return model


def alone(model: PagedModel, prompt: list[int], tokens: list[int], *, scope: str) -> list[np.ndarray]:
    """The main alone: the prompt's last row, then one feed a token (the engine's main alone, K = 0)."""
    sequence = model.sequence(scope=scope, exact=True)
    rows = [sequence.prefill(prompt)[-1]]
    rows += [sequence.feed([token])[-1] for token in tokens]
    sequence.close()
    return rows


# ---------------------------------------------------------------------------------------------------- the cases
Rows = tuple[list[np.ndarray], list[np.ndarray]]


def verify_vs_main_alone(engine: OwnEngine, prompt: list[int]) -> Rows:
    """A verify of K proposals (one sequence of K+1 tokens) gives each token the row the main alone gives it."""
    verify = engine.main.sequence(scope="verify", exact=True)
    rows = [verify.prefill(prompt)[-1], *verify.feed(ANSWER[:5])]
    verify.close()
    return rows, alone(engine.main, prompt, ANSWER[:5], scope="alone")


def chunks_vs_whole(engine: OwnEngine, prompt: list[int]) -> Rows:
    """A prompt read in chunks (other answers stepping between them) computes what it does read whole, and leaves the
    same keys and values (the tokens after it alike)."""
    chunked = fresh_main(engine, chunk_tokens=5)
    got = alone(chunked, prompt, ANSWER[:3], scope="")
    assert chunked.scheduler.steps >= len(prompt) // 5 + 3  # it was read in chunks
    return got, alone(fresh_main(engine), prompt, ANSWER[:3], scope="")


def beside_others_vs_alone(engine: OwnEngine, prompt: list[int]) -> Rows:
    """Sequences stepping together in one inference (a prefill, the main alone's tokens, a verify, of different
    lengths) each compute what they do alone."""
    prompts = [prompt, prompt[:20], prompt[5:], prompt[:3]]

    def walk(index: int, scope: str) -> list[np.ndarray]:
        sequence = engine.main.sequence(scope=f"{scope}{index}", exact=True)
        rows = [sequence.prefill(prompts[index])[-1]]
        for token in ANSWER[index:index + 3]:
            rows.append(sequence.feed([token])[-1])
        rows += [*sequence.feed(ANSWER[:index + 2])]
        sequence.close()
        return rows

    expected = [walk(index, "alone") for index in range(len(prompts))]
    got: dict[int, list[np.ndarray]] = {}
    start = threading.Barrier(len(prompts))

    def run(index: int) -> None:
        start.wait()
        got[index] = walk(index, "beside")

    steps = engine.main.scheduler.steps
    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    asks = 5 * len(prompts)
    assert engine.main.scheduler.steps - steps < asks, "the sequences never shared a step"
    return ([row for index in range(len(prompts)) for row in got[index]],
            [row for rows in expected for row in rows])


def rejected_vs_never_fed(engine: OwnEngine, prompt: list[int]) -> Rows:
    """Proposals the main rejected, taken back (drop_last, across a block's end too), leave no trace: the accepted
    tokens' rows and every row after are those of a sequence that never saw them."""
    block = engine.main.pool.block_tokens
    short = prompt[: block - 2]  # its proposals run into the next block, which goes back to the pool
    sequence = engine.main.sequence(scope="rejected", exact=True)
    rows, blocks = [sequence.prefill(short)[-1]], []
    for token, rejected in zip(ANSWER, REJECTED, strict=False):
        rows.append(sequence.feed([token, *rejected])[0])
        sequence.drop_last(len(rejected))
        blocks.append(len(sequence.block_table))
    rows += [sequence.feed([token])[-1] for token in ANSWER[len(REJECTED):]]
    sequence.close()
    # the blocks the rejected tokens ran into went back to the pool (the next step wrote into others' slots then)
    assert blocks == [-(-(len(short) + step) // block) for step in range(1, len(REJECTED) + 1)] == [1, 1, 2]
    return rows, alone(engine.main, short, ANSWER, scope="never-fed")


def cached_vs_cold(engine: OwnEngine, prompt: list[int]) -> Rows:
    """A prompt whose start the pool holds (the same prompt read before) computes what it computes cold."""
    cold = engine.main.sequence(scope="cached", exact=True)
    expected = [cold.prefill(prompt)[-1], *(cold.feed([token])[-1] for token in ANSWER[:3])]
    assert cold.cached == 0
    cold.close()
    warm = engine.main.sequence(scope="cached", exact=True)
    got = [warm.prefill(prompt)[-1], *(warm.feed([token])[-1] for token in ANSWER[:3])]
    assert warm.cached == (len(prompt) - 1) // engine.main.pool.block_tokens * engine.main.pool.block_tokens > 0
    warm.close()
    return got, expected


def fork_vs_cold(engine: OwnEngine, prompt: list[int]) -> Rows:
    """Two prompts alike for a block and a half: the second shares the first's full block (not the partly filled one,
    which each writes its own way), both are answered at once, and each computes what it does cold."""
    block = engine.main.pool.block_tokens
    common = prompt[: block + block // 2]
    first, second = common + ANSWER[:4], common + ANSWER[4:]
    one = engine.main.sequence(scope="fork", exact=True)
    two = engine.main.sequence(scope="fork", exact=True)
    got = [one.prefill(first)[-1], two.prefill(second)[-1]]
    assert (one.cached, two.cached) == (0, block)
    assert two.block_table[0] == one.block_table[0] and two.block_table[1] != one.block_table[1]
    for token in REJECTED[0]:  # each writes on past the common start, in turn
        got += [one.feed([token])[-1], two.feed([token])[-1]]
    one.close()
    two.close()
    cold = fresh_main(engine)
    expected_one, expected_two = alone(cold, first, REJECTED[0], scope=""), alone(cold, second, REJECTED[0], scope="")
    return got, [expected_one[0], expected_two[0], *(row for pair in zip(expected_one[1:], expected_two[1:],
                                                                              strict=True) for row in pair)]


def answered_vs_read_cold(engine: OwnEngine, prompt: list[int]) -> Rows:
    """An answer's tokens, fed as it went, leave the keys and values a prompt holding them after the template's
    answer opener leaves when read cold (a conversation's next turn from the cache or on a worker that never saw
    it): the rows after them alike."""
    asked = prompt + list(engine.main.answer_opener)
    answered = engine.main.sequence(scope="answered", exact=True)
    answered.prefill(asked)
    for token in ANSWER[:4]:
        answered.feed([token])
    got = [*answered.feed(ANSWER[4:7])]
    answered.close()
    cold = fresh_main(engine).sequence(exact=True)
    expected = [cold.prefill(asked + ANSWER[:5])[-1], *cold.feed(ANSWER[5:7])]
    cold.close()
    return got, expected


def conversation(engine: OwnEngine, prompt: list[int]) -> tuple[list[int], list[int]]:
    """A first turn's prompt, and the second's: the first, its answer (to its end token) and a question, opened for
    the next answer (where the engine's template opens one)."""
    opener, end = list(engine.main.answer_opener), min(engine.eos_ids)
    question = engine.tokenizer.encode(QUESTION, add_special_tokens=False).input_ids.data[0].tolist()
    first = prompt + opener
    return first, first + ANSWER * 3 + [end] + question + opener


def conversation_read(engine: OwnEngine, prompt: list[int], *, chunk_tokens: int) -> Rows:
    _, second = conversation(engine, prompt)
    return alone(fresh_main(engine, chunk_tokens=chunk_tokens), second, ANSWER[:3], scope=""), alone(
        fresh_main(engine, chunk_tokens=len(second)), second, ANSWER[:3], scope="")


def conversation_in_chunks_vs_whole(engine: OwnEngine, prompt: list[int]) -> Rows:
    """A conversation, its answer's tokens among the prompt's text, read in chunks of 5 (cut anywhere, inside the
    answer and next to its ends) computes what it computes read whole."""
    return conversation_read(engine, prompt, chunk_tokens=5)


def conversation_cut_after_its_answer_vs_whole(engine: OwnEngine, prompt: list[int]) -> Rows:
    """The same in chunks that would end one token after the answer's end: a query's first token cut from the rest
    of it (engines/own/kv_cache.py, `_chunk_end`)."""
    return conversation_read(engine, prompt, chunk_tokens=len(ANSWER) * 3 + 2)


def follow_up_from_the_cache_vs_cold(engine: OwnEngine, prompt: list[int]) -> Rows:
    """The next turn of a conversation, its answer's blocks cached as the answer was fed, computes what it computes
    read cold (on a worker that never saw it)."""
    first, second = conversation(engine, prompt)
    answered = engine.main.sequence(scope="follow-up", exact=True)
    answered.prefill(first)
    for token in ANSWER * 3:
        answered.feed([token])
    answered.close(keep_ids=first + ANSWER * 3)
    warm = engine.main.sequence(scope="follow-up", exact=True)
    got = [warm.prefill(second)[-1], *(warm.feed([token])[-1] for token in ANSWER[:3])]
    assert warm.cached >= len(first + ANSWER * 3) // engine.main.pool.block_tokens * engine.main.pool.block_tokens
    warm.close()
    return got, alone(fresh_main(engine), second, ANSWER[:3], scope="")


def raw_completion_followed_up_vs_cold(engine: OwnEngine, prompt: list[int]) -> Rows:
    """An answer to a prompt that opens none (a raw completion), continued by a next prompt holding it: where its
    tokens were fed otherwise than a cold read of that prompt computes them (answers one-token, the rest queries),
    its blocks were not cached, and the next prompt computes what it computes cold."""
    answered = engine.main.sequence(scope="raw", exact=True)
    answered.prefill(prompt)
    for token in ANSWER * 3:
        answered.feed([token])
    answered.close(keep_ids=prompt + ANSWER * 3)
    after = prompt + ANSWER * 3 + ANSWER[:2]
    warm = engine.main.sequence(scope="raw", exact=True)
    got = [warm.prefill(after)[-1], *(warm.feed([token])[-1] for token in ANSWER[:3])]
    size = engine.main.pool.block_tokens
    mixed = engine.main.answer_opener and engine.main.runner.steady.token_rows
    assert warm.cached == (len(prompt) // size * size if mixed else len(prompt) + len(ANSWER) * 3)
    warm.close()
    return got, alone(fresh_main(engine), after, ANSWER[:3], scope="")


def control_another_prompt(engine: OwnEngine, prompt: list[int]) -> Rows:
    """The control: a prompt one token apart, in its first block, gives other rows (the comparison can fail)."""
    changed = [prompt[0] + 1, *prompt[1:]]
    return alone(engine.main, changed, ANSWER[:3], scope="control"), alone(fresh_main(engine), prompt, ANSWER[:3],
                                                                           scope="")


CASES: list[tuple[Callable[[OwnEngine, list[int]], Rows], bool]] = [
    (verify_vs_main_alone, True),
    (chunks_vs_whole, True),
    (beside_others_vs_alone, True),
    (rejected_vs_never_fed, True),
    (cached_vs_cold, True),
    (fork_vs_cold, True),
    (answered_vs_read_cold, True),
    (conversation_in_chunks_vs_whole, True),
    (conversation_cut_after_its_answer_vs_whole, True),
    (follow_up_from_the_cache_vs_cold, True),
    (raw_completion_followed_up_vs_cold, True),
    (control_another_prompt, False),
]


@pytest.mark.parametrize(("case", "equal"), CASES, ids=[case.__name__ for case, _ in CASES])
def test_rows_computed_two_ways_are_bitwise_equal(engine: OwnEngine, prompt: list[int], case, equal: bool):
    check_rows(engine, *case(engine, prompt), equal=equal)


def check_rows(engine: OwnEngine, got: list[np.ndarray], expected: list[np.ndarray], *, equal: bool) -> None:
    """Each row of `got` bitwise its twin in `expected` (none of them, for the control)."""
    assert len(got) == len(expected) > 1
    vocabulary = engine.main.runner.compiled.output(0).get_partial_shape()[-1].get_length()
    assert all(row.shape == (vocabulary,) and np.isfinite(row).all() for row in got + expected)
    same = [np.array_equal(mine, theirs) for mine, theirs in zip(got, expected, strict=True)]
    if equal:
        assert all(same), [(index, float(np.abs(got[index] - expected[index]).max()))
                           for index, alike in enumerate(same) if not alike]
    else:
        assert not any(same)
    assert len({row.tobytes() for row in got}) == len(got)  # the rows are the tokens' own, not one repeated


# ---------------------------------------------------------------------------------------------- the draft's head
def test_a_drafts_cut_head_gives_rows_widened_to_the_whole_vocabulary(engine: OwnEngine, prompt: list[int],
                                                                       tmp_path: Path):
    """A draft whose head keeps a third of the vocabulary: its rows come widened back to the whole vocabulary, the
    full head's logits bitwise at the kept tokens, -inf elsewhere (q = 0: never proposed)."""
    kept = np.arange(0, engine.draft.runner.compiled.output(0).get_partial_shape()[-1].get_length(), 3)
    np.save(tmp_path / "head.npy", kept)
    compiled, head = compile_draft(ov.Core(), draft_dir=SPEC.draft_dir, head_ids=str(tmp_path / "head.npy"),
                                   device=SPEC.draft_runs_on, properties=SPEC.device_properties(device="CPU"))
    assert head is not None and compiled.output(0).get_partial_shape()[-1].get_length() == kept.size
    cut = PagedModel(ModelRunner(compiled, pool_bytes=8 * 2**20), head=head, caching=False)

    def draft_rows(sequence: PagedSequence) -> list[np.ndarray]:
        rows = [*sequence.prefill(prompt)]
        for token in ANSWER[:3]:
            rows += [*sequence.feed([token])]  # a draft's feed: the last token's row alone
        sequence.close()
        return rows

    widened, full = draft_rows(cut.sequence()), draft_rows(engine.draft.sequence(scope="head"))
    assert len(widened) == len(full) == 4
    dropped = np.setdiff1d(np.arange(head.width), kept)
    for mine, theirs in zip(widened, full, strict=True):
        assert mine.shape == theirs.shape == (head.width,)
        assert np.array_equal(mine[kept], theirs[kept])
        assert np.isneginf(mine[dropped]).all() and np.isfinite(theirs).all()


# ------------------------------------------------------------------------------------- the operator's arrangement
@pytest.mark.parametrize("asked", ["queries", "one-token"])
def test_the_arrangement_an_operator_asks_for_is_served_where_alike_and_answers_as_the_main_alone(asked: str):
    """SPECCHAT_MAIN_ROWS: an engine loaded asking for one arrangement computes the main's rows that way (one-token
    sequences only where the engine's check finds them alike here), and its greedy answers with the draft are its main
    alone's."""
    engine = OwnEngine(replace(SPEC, main_rows=asked))
    runner = engine.main.runner
    one_token = asked == "one-token" and runner.alike_as_tokens(runner.arranged(token_rows=True))
    assert runner.steady.token_rows == one_token
    answers = {}
    for k in (0, 4):
        request = engine.submit(prompt=CODE, params=DecodingParams(
            max_new_tokens=24, ignore_eos=True, speculation=Speculation(k=k) if k else None))
        answers[k] = []
        while not isinstance(event := request.events.get(timeout=120), Finished):
            answers[k] += event.token_ids
    assert len(answers[0]) == 24 and answers[4] == answers[0]
