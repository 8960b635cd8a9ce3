"""A pair's own engine (ModelPair.own_engine_streams): with the CPU's dynamic quantization (int8
activations, the fastest way to run an int8 main alone), its greedy answers with the draft are the main
alone's token for token, because rejected tokens are taken back by shortening the main's sequence and every row the
main computes is bitwise the same whichever answers share its step (engines/own/kv_cache.py); and a worker serving
such a pair answers one stream on it alone: one copy of the weights, no step process."""

import json
import re
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import requests
from django.conf import settings

from inference.benchmark.memory import process_tree
from inference.benchmark.modes import compare_modes
from inference.engines.decoding import DecodingParams, Speculation
from inference.engines.interface import Finished, JoinedBatch, LeftBatch
from inference.engines.own import engine as own_engine
from inference.engines.own.engine import OwnEngine
from inference.engines.own.payoff import WINDOW
from inference.engines.own.proposers.chain import Drafting
from inference.engines.own.proposers.prompt_lookup import LOOKUP_TOKENS, PromptLookup
from inference.engines.own.scheduler import SHARED_CHUNK_TOKENS
from inference.engines.spec import PairSpec
from inference.limits import Drafter, Route
from inference.selectors import live_workers
from inference.serving.reasons import SENTENCES, Reason
from tests.test_api import chunk_text, client, post, sse_events
from tests.test_engines_library_watchdog import pair_on_a_worker_of_its_own

PAIR = Path(settings.MODELS_ROOT) / settings.DEMO_PAIR_DIR
SPEC = PairSpec(slug="own", main_dir=str(PAIR / "main"), draft_dir=str(PAIR / "draft"), route=Route.OWN_SPECULATIVE,
                pair_default=Route.OWN_SPECULATIVE, dynamic_quantization=True)
LOWER_CASE_CODE = {"grammar_kind": "regex", "grammar_text": r"[a-z_ ().=:\[\]\n+\-/0-9]{20,400}"}
PROMPTS = ("def quicksort(numbers):", "class Stack:\n    def push(self, item):", "import os\n\ndef walk(root):")


@pytest.fixture(scope="module")
def engine():
    assert SPEC.device_properties(device="CPU").get("DYNAMIC_QUANTIZATION_GROUP_SIZE") is None  # the CPU's default: on
    return OwnEngine(SPEC)


def answer(engine, prompt: str, k: int, **held) -> list[int]:
    """An answer at K (0: the main alone)."""
    request = engine.submit(prompt=prompt, params=DecodingParams(max_new_tokens=40, ignore_eos=not held,
                                                                 speculation=Speculation(k=k) if k else None, **held))
    tokens: list[int] = []
    while not isinstance(event := request.events.get(timeout=120), Finished):
        tokens += event.token_ids
    assert event.finish_reason == ("stop" if held.get("grammar_kind") == "regex" else "length"), event
    return tokens


@pytest.mark.no_database
def test_rejected_tokens_taken_back_leave_no_trace(engine):
    """After each step the main's sequence holds the accepted tokens alone (drop_last shortens it; the next step writes
    over the rejected tokens' slots): two sequences that rejected different proposals, and one fed a token at a time,
    give bitwise the same next logits (the main's exact sequence runs every row on the multi-token kernel)."""
    ids = engine.tokenizer.encode(PROMPTS[0]).input_ids.data[0].tolist()
    rng = np.random.default_rng(0)
    clean = engine.main.sequence(exact=True)
    cuts = [engine.main.sequence(exact=True) for _ in range(2)]
    for sequence in (clean, *cuts):
        sequence.feed(ids)
    for token in rng.integers(100, 1000, 6).tolist():
        expected = clean.feed([token])[-1].copy()
        got = []
        for cut in cuts:
            got.append(cut.feed([token, *rng.integers(100, 1000, 3).tolist()])[0].copy())  # 3 proposals, rejected
            cut.drop_last(3)
            assert cut.position == clean.position
        assert np.array_equal(got[0], got[1])
        assert np.array_equal(got[0], expected)
    for sequence in (clean, *cuts):
        sequence.close()


def each_steps(works) -> None:
    """Run `works` (functions of no argument) at once, each in its own thread."""
    threads = [threading.Thread(target=work) for work in works]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)


def pools_empty(*engines) -> bool:
    """Every block of the engines' pools back, none held by a sequence (cached ones included: they are free)."""
    return all(model.pool.free_count == model.pool.blocks for engine in engines for model in (engine.main, engine.draft))


@pytest.mark.no_database
def test_rows_sharing_a_step_compute_what_each_would_alone(engine):
    """Answers of the main alone share one inference a step (engines/own/scheduler.py): prompts of different lengths
    join, one leaves early, one joins late, one is late to a step (the others step without it); every sequence's
    logits are bitwise those of its own sequence stepped alone, and every block is back in the pool after."""
    forced = np.random.default_rng(1).integers(100, 1000, 8).tolist()
    prompt_ids = [engine.tokenizer.encode(text).input_ids.data[0].tolist() for text in (*PROMPTS, "x = [")]
    got: dict[int, list[np.ndarray]] = {}
    steps = engine.main.scheduler.steps

    def run(index: int, steps: int, delay: float = 0.0) -> None:
        time.sleep(delay)
        sequence = engine.main.sequence(exact=True)
        got[index] = [sequence.feed(prompt_ids[index])[-1].copy()]
        for step, token in enumerate(forced[:steps]):
            if index == 2 and step == 3:
                time.sleep(0.2)  # the others step without it meanwhile
            got[index].append(sequence.feed([token])[-1].copy())
        sequence.close()

    each_steps([lambda args=args: run(*args) for args in ((0, 8), (1, 3), (2, 8), (3, 6, 0.3))])
    fed = sum(map(len, got.values()))
    assert engine.main.scheduler.steps - steps < fed, "no two sequences shared a step"
    for index, rows in got.items():
        alone = engine.main.sequence(exact=True)
        expected = [alone.feed(prompt_ids[index])[-1]] + [alone.feed([token])[-1].copy() for token in forced]
        alone.close()
        assert len(rows) == {1: 4, 3: 7}.get(index, 9)
        for step, (mine, theirs) in enumerate(zip(rows, expected, strict=False)):
            assert np.array_equal(mine, theirs), (index, step, float(np.abs(mine - theirs).max()))
    assert pools_empty(engine)


@pytest.mark.no_database
def test_long_prompts_sent_together_are_read_first_come_first(engine):
    """Four pastes sent together: the two that came first are read first (a step holds two prompts' chunks) and get
    their first token while the last has read nothing yet, as vLLM's scheduler orders prompts; chunks taken in turns
    would give all four their first token at the end of the last read."""
    chunk = engine.main.scheduler.chunk_tokens
    text = engine.tokenizer.encode("def add(x, y):\n    return x + y\n\n" * 300).input_ids.data[0].tolist()
    prompts = [[100 + index, *text[: 3 * chunk]] for index in range(4)]  # starts of their own: no block shared
    read_so_far = dict.fromkeys(range(4), 0)
    others_when_read: dict[int, dict[int, int]] = {}

    def read(index: int) -> None:
        time.sleep(0.1 * index)  # the order they come in
        sequence = engine.main.sequence(exact=True)
        sequence.prefill(prompts[index], on_chunk=lambda done, _total: read_so_far.__setitem__(index, done))
        others_when_read[index] = dict(read_so_far)
        sequence.close()

    each_steps([lambda index=index: read(index) for index in range(4)])
    assert others_when_read[0][3] == others_when_read[1][3] == 0, others_when_read
    assert others_when_read[3][0] == others_when_read[3][1] == len(prompts[0]), others_when_read
    assert pools_empty(engine)


@pytest.mark.no_database
def test_an_answer_steps_on_while_another_users_paste_is_read_in_small_chunks(engine):
    """An answer streaming while another user's paste is read gets a token every small chunk of it (Sarathi-Serve's
    stall-free batching), not one every full chunk; the paste's logits are those it reads alone, in full chunks."""
    scheduler = engine.main.scheduler
    text = engine.tokenizer.encode("def mul(x, y):\n    return x * y\n\n" * 300).input_ids.data[0].tolist()
    paste = [99, *text[: 4 * scheduler.chunk_tokens]]
    answer = engine.main.sequence(exact=True)
    answer.feed(engine.tokenizer.encode(PROMPTS[0]).input_ids.data[0].tolist())
    started, read = threading.Event(), threading.Event()
    steps_during_read = 0
    got: list[np.ndarray] = []

    def stream() -> None:
        nonlocal steps_during_read
        for token in np.random.default_rng(2).integers(100, 1000, 400).tolist():
            answer.feed([token])
            steps_during_read += started.is_set() and not read.is_set()
            if read.is_set():
                return

    def read_paste(progress: list[int]) -> None:
        time.sleep(0.2)  # the answer is streaming
        sequence = engine.main.sequence(exact=True)
        started.set()
        got.append(sequence.prefill(paste, on_chunk=lambda done, _total: progress.append(done))[-1].copy())
        read.set()
        sequence.close()

    beside: list[int] = []
    each_steps([stream, lambda: read_paste(beside)])
    answer.close()
    chunks = np.diff([0, *beside])
    assert max(chunks) <= SHARED_CHUNK_TOKENS < scheduler.chunk_tokens, chunks
    assert steps_during_read >= len(chunks) - 1, (steps_during_read, chunks)  # a token between every two chunks
    alone: list[int] = []
    sequence = engine.main.sequence(scope="alone", exact=True)
    assert np.array_equal(got[0], sequence.prefill(paste, on_chunk=lambda done, _total: alone.append(done))[-1])
    sequence.close()
    assert max(np.diff([0, *alone])) == scheduler.chunk_tokens
    assert pools_empty(engine)


@pytest.mark.no_database
def test_rows_feeding_several_tokens_compute_what_each_would_alone(engine):
    """Sequences speculating side by side: each step one feeds one to four tokens, the main rejects some (taken back),
    one leaves early: every sequence's logits for its live tokens are bitwise those of a sequence holding those tokens
    alone, fed them at once."""
    got: dict[int, list[tuple[list[int], np.ndarray]]] = {}  # each step's live tokens after it, and its logits
    done: list[int] = []

    def run(index: int, steps: int) -> None:
        rng = np.random.default_rng([2, index])  # its own: the same draws however the threads interleave
        sequence, live = engine.main.sequence(exact=True), list(prompt_ids[index])
        got[index] = [(list(live), sequence.feed(live)[-1:].copy())]
        for _ in range(steps):
            fed = rng.integers(100, 1000, int(rng.integers(1, 5))).tolist()
            logits = sequence.feed(fed)
            kept = int(rng.integers(0, len(fed) + 1))
            got[index] += [([*live, *fed[: n + 1]], logits[n:n + 1].copy()) for n in range(kept)]
            sequence.drop_last(len(fed) - kept)
            live += fed[:kept]
            assert sequence.tokens == live
        sequence.close()
        done.append(index)

    prompt_ids = [engine.tokenizer.encode(text).input_ids.data[0].tolist() for text in PROMPTS]
    each_steps([lambda args=args: run(*args) for args in ((0, 12), (1, 4), (2, 12))])
    assert sorted(done) == [0, 1, 2] and sum(map(len, got.values())) > 30
    for index, rows in got.items():
        for live, logits in rows:
            alone = engine.main.sequence(exact=True)
            assert np.array_equal(logits, alone.feed(live)[-1:]), (index, len(live))
            alone.close()
    assert pools_empty(engine)


@pytest.mark.no_database
def test_answers_speculating_in_the_batch_are_the_main_alones(engine):
    """Beyond the pair's speculating streams, with a K for the batch (Speculation.batch_k), three answers at once
    go on speculating: one inference of the main a step for all (their K+1 tokens each), of the draft too; each
    answer is the main alone's, greedy, and every block of both pools is back once they finished."""
    busy = OwnEngine(replace(SPEC, slug="batched", speculating_streams=1))
    params = DecodingParams(max_new_tokens=60, ignore_eos=True, speculation=Speculation(k=3, batch_k=3))
    requests_ = [busy.submit(prompt=prompt, params=params) for prompt in PROMPTS]
    steps = [steps_of(request) for request in requests_]
    assert max(len(step) for answer_steps in steps for step in answer_steps[3:]) > 1, "none speculated in the batch"
    alone = replace(params, speculation=None)
    for prompt, answer_steps in zip(PROMPTS, steps, strict=True):
        assert flat(answer_steps) == flat(steps_of(engine.submit(prompt=prompt, params=alone))), prompt
    assert busy.active_count == 0 and pools_empty(busy)  # an answer's sequences close before its Finished


@pytest.mark.no_database
def test_answers_of_the_main_alone_at_once_each_end_as_asked(engine):
    """Four answers of the main alone at once, sharing the main's steps: each runs to its cap; the first, run alone
    again, is the main's greedy answer with the draft too."""
    answers: dict[str, list[int]] = {}
    threads = [threading.Thread(target=lambda p=p: answers.__setitem__(p, answer(engine, p, 0)))
               for p in (*PROMPTS, "x = [")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(map(len, answers.values())) == [40] * 4
    assert answer(engine, PROMPTS[0], 3) == answer(engine, PROMPTS[0], 0)


@pytest.mark.no_database
def test_greedy_answers_with_the_draft_are_the_main_alones_token_for_token(engine):
    for prompt in PROMPTS:
        alone = answer(engine, prompt, 0)
        assert answer(engine, prompt, 3) == alone and answer(engine, prompt, 5) == alone, prompt


FUNCTION = '''def moving_average(values, window):
    total = sum(values[:window])
    result = [total / window]
    for i in range(window, len(values)):
        total += values[i] - values[i - window]
        result.append(total / window)
    return result
'''
COPYING = ("Repeat this code and add a docstring:\n" + FUNCTION + "\n" + FUNCTION[:70],
           "# Fix the off-by-one error.\n" + FUNCTION + "\n# Fixed:\n" + FUNCTION[:120])


def drafted(engine, prompt: str, k: int, lookup_only: bool = False, **held
            ) -> tuple[list[int], dict[Drafter | None, int]]:
    """An answer's tokens, and the tokens each drafter proposed for it."""
    request = engine.submit(prompt=prompt, params=DecodingParams(max_new_tokens=64, ignore_eos=not held,
        speculation=Speculation(k=k, lookup_only=lookup_only) if k else None, **held))
    tokens: list[int] = []
    proposed: dict[Drafter | None, int] = {}
    while not isinstance(event := request.events.get(timeout=120), Finished):
        tokens += event.token_ids
        proposed[event.drafter] = proposed.get(event.drafter, 0) + (event.proposed or 0)
    assert event.finish_reason != "error", event
    return tokens, proposed


@pytest.mark.no_database
def test_greedy_answers_chained_with_the_prompt_lookup_are_the_main_alones(engine):
    """Where the answer's history repeats (a prompt's code copied), the prompt lookup proposes up to 8 tokens at no
    inference, the draft where it has nothing: token for token the main alone's answer, under a grammar too (the
    lookup's proposals cut at the first token it refuses); with the lookup off, the draft alone proposes."""
    unchained = OwnEngine(replace(SPEC, slug="unchained", chained_lookup=False))
    for prompt in COPYING:
        for held in ({}, LOWER_CASE_CODE):
            alone, _ = drafted(engine, prompt, 0, **held)
            chained, proposed = drafted(engine, prompt, 3, **held)
            assert chained == alone, (prompt, held)
            assert proposed.get(Drafter.NGRAM, 0) > 8 and proposed.get(Drafter.DRAFT, 0) > 0, (prompt, held, proposed)
        draft_only, proposed = drafted(unchained, prompt, 3)
        assert draft_only == drafted(engine, prompt, 0)[0] and set(proposed) == {None, Drafter.DRAFT}


@pytest.mark.no_database
def test_under_a_repetition_penalty_the_draft_and_the_lookup_change_no_greedy_token(engine):
    """A publisher's repetition penalty (engines/own/penalty.py) shapes the main's row at each verified position for
    the proposals before it, as the main alone's for the tokens it wrote: with the draft, and with the lookup chained
    on an answer that copies, token for token the main alone's answer under the same penalty, which is not the
    answer without it. (A strong penalty: at 1.3 no answer here told a step's rows penalised for the proposals before
    them from rows that were not.)"""
    for prompt in (PROMPTS[1], *COPYING):
        alone, _ = drafted(engine, prompt, 0, repetition_penalty=2.0)
        speculated, proposed = drafted(engine, prompt, 3, repetition_penalty=2.0)
        assert speculated == alone, prompt
        assert sum(proposed.values()) > 16, proposed
        assert alone != drafted(engine, prompt, 0)[0], "the penalty changed nothing: the test would prove little"


@pytest.mark.no_database
def test_an_answer_proposing_from_its_conversation_alone_runs_no_draft_and_is_the_main_alones(engine):
    """After a long prompt where the draft did not pay (`lookup_only`, the plan's calibrated-long-context-lookup):
    the lookup proposes where the answer copies, the draft never runs, and the answer is the main alone's."""
    for prompt in COPYING:
        alone, _ = drafted(engine, prompt, 0)
        draft_steps = engine.draft.scheduler.steps
        looked_up, proposed = drafted(engine, prompt, 3, lookup_only=True)
        assert looked_up == alone, prompt
        assert proposed.get(Drafter.NGRAM, 0) > 8 and Drafter.DRAFT not in proposed, proposed
        assert engine.draft.scheduler.steps == draft_steps


@pytest.mark.no_database
def test_a_draft_that_stops_where_it_is_unsure_leaves_the_answer_the_main_alones(engine):
    """With a stop (`draft_stop_below`) the draft proposes up to K but holds back a token it is unsure of: some
    steps propose all K, some fewer, and the answer is the main alone's token for token, under a grammar too (the
    draft's cache then holds the token it held back, and follows the answer all the same)."""
    unchained = OwnEngine(replace(SPEC, slug="draft-only", chained_lookup=False, drafters_judged=False))
    proposed: list[int] = []  # by the draft, each step but an answer's last two (which the cap may shorten)
    for prompt in PROMPTS:
        for held in ({}, LOWER_CASE_CODE):
            request = unchained.submit(prompt=prompt, params=DecodingParams(
                max_new_tokens=64, ignore_eos=not held, speculation=Speculation(k=6, draft_stop_below=0.9), **held))
            steps = []
            while not isinstance(event := request.events.get(timeout=120), Finished):
                steps.append(event)
            assert event.finish_reason != "error", event
            assert flat([step.token_ids for step in steps]) == drafted(engine, prompt, 0, **held)[0], (prompt, held)
            proposed += [step.proposed for step in steps if step.drafter == Drafter.DRAFT][:-2]
    assert 6 in proposed and any(count < 6 for count in proposed), proposed


@pytest.mark.no_database
def test_a_draft_that_does_not_pay_sits_out_and_the_answer_stays_the_main_alones(engine):
    """A draft that agrees with the main on every token but costs more than the main's own step (the demo main
    widened 4x, function-preserving) slows every step it proposes for: within a few steps it sits out and the main
    goes on alone, tried again now and then (engines/own/payoff.py). The answer is the main alone's, token for token."""
    costly = OwnEngine(replace(SPEC, slug="costly-draft", draft_dir=str(PAIR / "main-large"), chained_lookup=False))
    params = DecodingParams(max_new_tokens=128, ignore_eos=True, speculation=Speculation(k=3))
    events = []
    request = costly.submit(prompt=PROMPTS[0], params=params)
    while not isinstance(event := request.events.get(timeout=120), Finished):
        events.append(event)
    proposing = [event.proposed for event in events[1:]]  # after the prompt's token
    assert all(len(event.token_ids) == event.proposed + 1 for event in events[1:] if event.proposed)  # all accepted
    assert proposing.index(0) <= WINDOW, proposing  # a step that times the main alone, then it sits out
    assert proposing.count(0) > len(proposing) // 2, proposing
    assert flat([event.token_ids for event in events]) == flat(steps_of(
        engine.submit(prompt=PROMPTS[0], params=replace(params, speculation=None))))


@pytest.mark.no_database
def test_the_draft_is_fed_every_token_of_the_answer_once_whatever_proposed_it(engine):
    """A main that copies the prompt's function with a few tokens changed, verifying greedily: steps of the lookup
    (the draft infers nothing) and of the draft, proposals kept whole, in part or not at all. The draft's sequence
    then holds the answer's tokens, each once and in order: the logits of a sequence fed them afresh (to the last
    bits: the draft's one-token steps run another kernel than a prompt's)."""
    encode = engine.tokenizer.encode
    history = encode("Repeat this code:\n" + FUNCTION).input_ids.data[0].tolist()
    rng = np.random.default_rng(2)
    copy = [int(rng.integers(100, 1000)) if rng.random() < 0.1 else token
            for token in encode(FUNCTION, add_special_tokens=False).input_ids.data[0].tolist()]
    drafting = Drafting(engine.draft.sequence(), lookup=PromptLookup(history),
                        params=DecodingParams(max_new_tokens=99), speculation=Speculation(k=3), rng=rng, constraint=None)
    drafting.prefill(history)
    answer = copy[:1]
    drafting.lookup.extend(answer)
    seen = set()
    while len(answer) < len(copy) - 12:
        last = answer[-1]
        proposal = drafting.propose(k=3, room=10, last=last)
        expected = copy[len(answer):len(answer) + len(proposal.tokens) + 1]
        accepted = next((i for i, (x, y) in enumerate(zip(proposal.tokens, expected, strict=False)) if x != y),
                        len(proposal.tokens))
        drafting.settle(last=last, proposal=proposal, accepted=accepted, token=expected[accepted], seconds=0.0,
                        verify_seconds=0.0)
        answer += expected[:accepted + 1]
        seen.add((proposal.drafter, "all" if accepted == len(proposal.tokens) else "some" if accepted else "none"))
    assert {(Drafter.NGRAM, "all"), (Drafter.NGRAM, "some"), (Drafter.DRAFT, "some"), (Drafter.DRAFT, "none")} <= seen, seen
    cache = drafting.draft.cache
    logits = cache.feed([*drafting.draft.backlog, answer[-1]])[-1]
    assert cache.position == len(history) + len(answer) and cache.tokens == history + answer
    afresh = engine.draft.sequence()
    expected = afresh.feed(history + answer)[-1]
    assert np.allclose(logits, expected, rtol=0, atol=1e-4), float(np.abs(logits - expected).max())
    for sequence in (cache, afresh):
        sequence.close()


SNIPPET = {"type": "object", "properties": {"lang": {"enum": ["python", "rust", "go"]},
                                            "lines": {"type": "integer", "minimum": 1, "maximum": 99}},
           "required": ["lang", "lines"], "additionalProperties": False}
CODE = r"[a-z]{2,10}-[0-9]{1,3}"


@pytest.mark.no_database
def test_a_k_per_answer_follows_the_hosts_costs_and_leaves_the_answer_the_main_alones(engine):
    """Given the host's costs (engines/own/step_length.py), the draft proposes up to K what the answer's acceptance pays
    for: where each token verified costs as much as a main step, one token a step; where verifying is nearly free,
    the plan's K. Either way the answer is the main alone's, token for token."""
    unchained = OwnEngine(replace(SPEC, slug="draft-only", chained_lookup=False))
    steep, cheap = (1.0, 2.0, 3.0, 4.0, 5.0), (0.05, 1.0, 1.0, 1.0, 1.0)
    for prompt in PROMPTS[:2]:
        alone = drafted(engine, prompt, 0)[0]
        for costs, lengths in ((steep, {1}), (cheap, {4})):
            request = unchained.submit(prompt=prompt, params=DecodingParams(
                max_new_tokens=64, ignore_eos=True, speculation=Speculation(k=4, step_costs=costs)))
            steps = []
            while not isinstance(event := request.events.get(timeout=120), Finished):
                steps.append(event)
            proposed = {step.proposed for step in steps[1:-2] if step.drafter == Drafter.DRAFT and step.proposed}
            assert lengths <= proposed <= ({1} if costs == steep else {1, 2, 3, 4}), (costs, proposed)
            assert flat([step.token_ids for step in steps]) == alone, (prompt, costs)


def steps_of(request, said: list | None = None) -> list[list[int]]:
    """The tokens of each step; what the engine said of the answer on the way (JoinedBatch) goes to `said`."""
    steps = []
    while not isinstance(event := request.events.get(timeout=120), Finished):
        if isinstance(event, JoinedBatch):
            (said if said is not None else []).append(event)
            continue
        steps.append(event.token_ids)
    assert event.finish_reason == "length", event
    return steps


def flat(steps: list[list[int]]) -> list[int]:
    return [token for step in steps for token in step]


@pytest.mark.no_database
def test_a_speculating_answer_joins_the_batch_when_more_answers_come(engine):
    """Beyond the pair's speculating streams, the answer speculating goes on at the K for the batch (0 here: the
    host is not calibrated) with its cache as it is (nothing moves: every answer's steps share the main's inference
    anyway): from then on no draft token, the conversation's lookup alone proposing (at no inference) where the
    answer copies its prompt, a short run (tests/unit/engines/test_prompt_lookup.py), and the same greedy answer; the
    engine says when it joined the batch, that its K fell to 0 there, and that the lookup goes on."""
    busy = OwnEngine(replace(SPEC, slug="busy", speculating_streams=1))
    params = DecodingParams(max_new_tokens=160, ignore_eos=True, speculation=Speculation(k=3))
    speculating = busy.submit(prompt=COPYING[1], params=params)
    before = [speculating.events.get(timeout=120) for _ in range(4)]  # its prefill's token, then three steps
    draft_steps = busy.draft.scheduler.steps
    joining = busy.submit(prompt=PROMPTS[1], params=replace(params, speculation=None))
    said: list[JoinedBatch] = []
    after = []
    while not isinstance(event := speculating.events.get(timeout=120), Finished):
        if isinstance(event, JoinedBatch):
            said.append(event)
        else:
            after.append(event)
    other = steps_of(joining)
    assert max(len(step.token_ids) for step in before) > 1, "it did not speculate while alone"
    assert [(joined.k, joined.k_before, joined.lookup) for joined in said] == [(0, 3, True)]
    assert said[0].token >= len(flat([step.token_ids for step in before]))
    assert busy.draft.scheduler.steps <= draft_steps + 3  # a step may be under way as it joins: K draft tokens
    assert {step.drafter for step in after[1:] if step.proposed} <= {Drafter.NGRAM}, "the draft proposed"
    assert max(len(step.token_ids) for step in after[1:]) <= LOOKUP_TOKENS + 1
    alone = replace(params, speculation=None)
    assert flat([step.token_ids for step in before + after]) == flat(steps_of(engine.submit(prompt=COPYING[1],
                                                                                           params=alone)))
    assert flat(other) == flat(steps_of(engine.submit(prompt=PROMPTS[1], params=alone)))


@pytest.mark.no_database
def test_an_answer_in_the_batch_speculates_again_once_the_other_answers_end(engine, monkeypatch):
    """Once the engine is back within the pair's speculating streams, an answer that went into the batch speculates
    again at its K: the draft proposes again (it read the answer so far), the engine says when (LeftBatch), and the
    greedy answer is the main alone's, token for token. Before, it stayed in the batch to its end: a long answer
    that a short one overlapped for a moment went on at the main alone's speed."""
    monkeypatch.setattr(own_engine, "LEAVE_BATCH_AFTER_S", 0.2)  # the demo writes ~200 tokens a second: it leaves
    calm = OwnEngine(replace(SPEC, slug="host-calm", speculating_streams=1))  # before the draft has too much to read
    params = DecodingParams(max_new_tokens=300, ignore_eos=True, speculation=Speculation(k=3))
    calm.answers_elsewhere = 1  # another worker of this host answers: it starts in the batch
    answer = calm.submit(prompt=PROMPTS[1], params=params)
    said: list = []
    steps = []
    while not isinstance(event := answer.events.get(timeout=120), Finished):
        if isinstance(event, JoinedBatch | LeftBatch):
            said.append(event)
            continue
        steps.append(event)
        if len(steps) == 8:
            calm.answers_elsewhere = 0  # that answer ended
    assert event.finish_reason == "length", event
    assert [type(event) for event in said] == [JoinedBatch, LeftBatch], said
    joined, left = said
    assert (joined.k, joined.k_before, left.k) == (0, 3, 3)
    out_of_it = int(np.searchsorted(np.cumsum([len(step.token_ids) for step in steps]), left.token, side="right"))
    before, after = steps[:out_of_it], steps[out_of_it:]
    assert not [step for step in before[1:] if step.drafter == Drafter.DRAFT and step.proposed], "speculated in it"
    assert [step for step in after if step.drafter == Drafter.DRAFT and step.proposed], "the draft did not rejoin"
    assert max(len(step.token_ids) for step in after) > 1, "it did not speculate again"
    alone = replace(params, speculation=None)
    assert flat([step.token_ids for step in steps]) == flat(steps_of(engine.submit(prompt=PROMPTS[1], params=alone)))
    calm.close()


@pytest.mark.no_database
def test_the_benchmark_runs_a_burst_as_the_pair_ships_it():
    """compare_modes' "as shipped" line: of a burst of answers, the pair's own_engine_streams speculate until
    the rest have come, which run on the main alone, all sharing the main's steps; the same greedy answers."""
    lines = compare_modes(spec=replace(SPEC, slug="shipped"), prompts=list(PROMPTS[:2]), ks=(3,), max_new_tokens=24,
                          repeats=1, modes=("own",), streams=2, own_engine_streams=1, say=lambda _: None)
    alone, speculating, shipped = lines
    assert shipped.name == "own as shipped (K=3 for 1, the rest the main alone)"
    assert len(alone.answers) == 2
    assert alone.answers == speculating.answers == shipped.answers
    assert shipped.identical == speculating.identical == 2


@pytest.mark.no_database
def test_under_a_grammar_the_draft_changes_no_token_and_the_answer_holds_to_it(engine):
    """The draft proposes under the grammar too (engines/grammar/constraint.py): the answer is the main alone's under
    it, token for token. The demo main writes JSON's optional whitespace until its tokens run out; a regex
    answer ends where the grammar allows nothing more."""
    for prompt in PROMPTS:
        for held, holds in (({"grammar_kind": "json_schema", "grammar_text": json.dumps(SNIPPET)},
                             r'\s*\{\s*"lang"\s*:\s*"(python|rust|go)"[\s\S]*'),
                            ({"grammar_kind": "regex", "grammar_text": CODE}, CODE)):
            alone = answer(engine, prompt, 0, **held)
            assert answer(engine, prompt, 3, **held) == alone, (prompt, held)
            text = engine.tokenizer.decode(alone, skip_special_tokens=True)
            assert re.fullmatch(holds, text), text


@pytest.fixture
def own_engine_pair(demo_pair, stack_env, redis_client, tmp_path):
    yield from pair_on_a_worker_of_its_own(demo_pair, stack_env, redis_client, tmp_path, slug="own-engine",
                                           env={}, own_engine_streams=1)


@pytest.mark.django_db(transaction=True)
def test_one_stream_is_served_on_the_own_engine_alone(own_engine_pair, live_server_url, api_key, redis_client):
    pair, worker = own_engine_pair
    api = client(live_server_url, api_key.secret)

    def ask(prompt: str = PROMPTS[1], **extra) -> tuple[str, dict]:
        done = api.completions.create(model=pair.slug, prompt=prompt, max_tokens=32, extra_body=extra)
        return done.choices[0].text, done.usage.model_dump()

    drafted, with_draft = ask()
    alone, without = ask(speculative=False)
    assert drafted == alone
    assert (with_draft["speculative_mode"], without["speculative_mode"]) == ("draft", "off")
    assert (with_draft["speculative_route"], without["speculative_route"]) == ("own-speculative", "own-main-alone")
    assert Reason.OWN_ENGINE in with_draft["speculative_reason_codes"] and Reason.OWN_ENGINE in without[
        "speculative_reason_codes"]
    assert SENTENCES[Reason.OWN_ENGINE] in with_draft["speculative_reason"]  # the sentence made from the codes
    assert with_draft["accepted_tokens"] and without["draft_tokens"] is None
    assert without["ngram_draft_tokens"] is None
    copied, by_drafter = ask(COPYING[1])  # the prompt lookup proposes where the answer repeats, the draft elsewhere
    assert copied == ask(COPYING[1], speculative=False)[0]
    assert 0 < by_drafter["ngram_accepted_tokens"] <= by_drafter["ngram_draft_tokens"] < by_drafter["draft_tokens"]
    assert 0 < by_drafter["ngram_draft_steps"] < by_drafter["main_steps"]
    text = requests.get(f"{live_server_url}/metrics", timeout=30).text
    samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    for drafter in Drafter:
        assert float(samples[f'specchat_spec_decode_num_accepted_tokens_by_drafter_total{{model_name="{pair.slug}",'
                             f'drafter="{drafter}"}}']) > 0, drafter
    sampled = api.completions.create(model=pair.slug, prompt=PROMPTS[1], max_tokens=8, temperature=0.8, seed=3)
    assert sampled.usage.model_dump()["speculative_mode"] == "draft-exact-sampling"
    deadline = time.monotonic() + 10
    while not (engines := next(b["engines"] for b in live_workers(client=redis_client)
                               if b["name"].endswith(f":{worker.proc.pid}"))) and time.monotonic() < deadline:
        time.sleep(0.5)  # the heartbeat after these answers
    assert [(e["slug"], e["route"]) for e in engines] == [(pair.slug, Route.OWN_SPECULATIVE)]
    assert process_tree(worker.proc.pid) == [worker.proc.pid], "a step process holds another copy of the main"


@pytest.mark.django_db(transaction=True)
def test_an_answer_moved_into_the_batch_and_out_again_says_so_in_its_usage(own_engine_pair, live_server_url, api_key):
    """Beyond the pair's one speculating stream the own engine's first answer joins the batch and goes on on the main
    alone (the host is not calibrated: no K for the batch), and once the second answer has ended it speculates again
    at its K: its usage says both moves, and the K it runs at now."""
    pair, _ = own_engine_pair
    events = sse_events(post(live_server_url, "/v1/completions", api_key.secret,
                             {"model": pair.slug, "prompt": PROMPTS[0], "max_tokens": 300, "ignore_eos": True,
                              "stream": True, "stream_options": {"include_usage": True}},
                             stream=True))
    next(event for event in events if chunk_text(event[1]))  # the first is speculating alone
    second = post(live_server_url, "/v1/completions", api_key.secret,
                  {"model": pair.slug, "prompt": PROMPTS[1], "max_tokens": 8})
    usage = json.loads([data for _, data in events if data != "[DONE]"][-1])["usage"]
    assert second.status_code == 200, second.text
    codes = usage["speculative_reason_codes"]
    assert Reason.OWN_ENGINE in codes, codes
    assert codes[-4:] == [Reason.MOVED_INTO_BATCH, Reason.K_LOWERED, Reason.LOOKUP_IN_BATCH, Reason.LEFT_BATCH], codes
    planned_k = re.search(r"down from K=(\d+)", usage["speculative_reason"])[1]
    assert f"speculating again at K={planned_k}" in usage["speculative_reason"]
    assert usage["speculative_k"] == int(planned_k) > 0


@pytest.mark.django_db(transaction=True)
def test_an_answer_that_comes_while_another_runs_speculates_once_that_one_has_ended(own_engine_pair, live_server_url,
                                                                                   api_key):
    """Beyond the pair's one speculating stream an answer starts in the own engine's batch, the main alone there; once
    the answer before it has ended it speculates at a lone answer's K (before, it ran the main alone to its end): its
    usage says so, and its text is the one `speculative: false` gives."""
    pair, _ = own_engine_pair
    events = sse_events(post(live_server_url, "/v1/completions", api_key.secret,
                             {"model": pair.slug, "prompt": PROMPTS[0], "max_tokens": 120, "ignore_eos": True,
                              "stream": True}, stream=True))
    next(event for event in events if chunk_text(event[1]))  # the first runs
    asked = {"model": pair.slug, "prompt": PROMPTS[1], "max_tokens": 900, "ignore_eos": True}  # past the first's end
    later = post(live_server_url, "/v1/completions", api_key.secret, asked)
    assert later.status_code == 200, later.text
    usage = later.json()["usage"]
    codes = usage["speculative_reason_codes"]
    assert codes[:2] == [Reason.BEYOND_OWN_STREAMS, Reason.OWN_BATCH], codes
    assert codes.index(Reason.OWN_BATCH_UNTIL_ALONE) < codes.index(Reason.MOVED_INTO_BATCH), codes
    assert codes[-1] == Reason.LEFT_BATCH, codes
    assert usage["speculative_k"] > 0 and usage["accepted_tokens"], {k: usage[k] for k in ("speculative_k", "accepted_tokens", "draft_tokens", "ngram_draft_tokens", "speculative_reason")}
    alone = post(live_server_url, "/v1/completions", api_key.secret, {**asked, "speculative": False})
    assert later.json()["choices"][0]["text"] == alone.json()["choices"][0]["text"]


@pytest.mark.no_database
def test_a_speculating_answer_joins_the_batch_when_other_workers_on_the_host_answer(engine):
    """The answers of the host's other workers count as the batch's (their heartbeats say how many run: lifecycle's
    answers_on_this_host): they share its cores, and an answer speculating on its own would take its draft's and
    verify's work from them. Alone on the host it speculates; once another worker answers, it goes on without the
    draft, the same greedy answer."""
    busy = OwnEngine(replace(SPEC, slug="host-busy", speculating_streams=1))
    params = DecodingParams(max_new_tokens=160, ignore_eos=True, speculation=Speculation(k=3))
    speculating = busy.submit(prompt=PROMPTS[1], params=params)
    before = [speculating.events.get(timeout=120) for _ in range(4)]  # its prefill's token, then three steps
    busy.answers_elsewhere = 1  # another worker of this host took an answer
    said: list[JoinedBatch] = []
    after = steps_of(speculating, said)
    assert max(len(step.token_ids) for step in before) > 1, "it did not speculate while alone on the host"
    assert [(joined.k, joined.k_before) for joined in said] == [(0, 3)]
    alone = replace(params, speculation=None)
    assert flat([step.token_ids for step in before]) + flat(after) == flat(steps_of(engine.submit(prompt=PROMPTS[1],
                                                                                                  params=alone)))
    busy.close()
