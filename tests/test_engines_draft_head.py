"""The own engine's draft with its output head cut to a sub-vocabulary (engines/own/draft_head.py), the tokens chosen as
`make real-pair` chooses a real pair's (pairs/head_vocabulary.py), on the demo pair: the cut head computes the full
head's logits at the kept ids, a proposal is always a kept token mapped back to its own id, and the answers do not
change: greedy answers are the main alone's, under a grammar too, while the draft still speculates."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import openvino as ov
import pytest
from django.conf import settings

from inference.benchmark.modes import compare_modes, draft_cost
from inference.engines.decoding import DecodingParams, Speculation
from inference.engines.grammar.constraint import vocabulary
from inference.engines.own.draft_head import cut_head, load_head_ids
from inference.engines.own.engine import OwnEngine
from inference.engines.own.kv_cache import PagedModel
from inference.engines.own.model_runner import ModelRunner
from inference.engines.own.paged_model import cache_layout, read_paged
from inference.engines.spec import PairSpec
from inference.limits import Route
from inference.pairs.head_vocabulary import write_head_vocabulary
from tests.conftest import DEMO_HEAD_TOKENS as HEAD_TOKENS
from tests.test_engines_exact import CODE, PROMPTS, answer, steps_of

pytestmark = pytest.mark.no_database

PAIR = Path(settings.MODELS_ROOT) / settings.DEMO_PAIR_DIR
# Drafters not judged by their pay (engines/own/payoff.py times each step): what the draft proposes is counted, whatever
# else the host runs meanwhile.
SPEC = PairSpec(slug="cut-head", main_dir=str(PAIR / "main"), draft_dir=str(PAIR / "draft"), route=Route.OWN_SPECULATIVE,
                pair_default=Route.OWN_SPECULATIVE, dynamic_quantization=True, drafters_judged=False)


@pytest.fixture(scope="module")
def engine(demo_head_ids):
    return OwnEngine(replace(SPEC, draft_head_ids=str(demo_head_ids)))


def paged(compiled: ov.CompiledModel) -> PagedModel:
    """A compiled model on a pool of its own, of a few blocks."""
    return PagedModel(ModelRunner(compiled, pool_bytes=8 * cache_layout(compiled).block_bytes))


def test_the_list_holds_the_most_frequent_tokens_and_every_token_a_text_needs(demo_head_ids):
    ids = load_head_ids(demo_head_ids)
    tokens, special = vocabulary(str(PAIR / "draft"))
    single_bytes = {i for i, token in enumerate(tokens) if len(token) == 1}
    assert len(single_bytes) == 256 and single_bytes | set(special) <= set(ids.tolist())
    assert HEAD_TOKENS < len(ids) < HEAD_TOKENS + len(single_bytes) + len(special) + 16
    assert json.loads(demo_head_ids.with_suffix(".json").read_text())["size"] == HEAD_TOKENS
    assert write_head_vocabulary(demo_head_ids.parent, size=HEAD_TOKENS) == demo_head_ids  # made once for its size


@pytest.mark.parametrize("role", ["draft", "main"])  # f16 weights; int8 with zero points as the real draft's
@pytest.mark.parametrize("dynamic_quantization", [False, True], ids=["f32", "int8-activations"])
def test_the_cut_heads_logits_are_the_full_heads_at_the_kept_ids(demo_head_ids, role, dynamic_quantization):
    """Both demo heads are tied to their embedding table, which keeps all its rows."""
    ids = load_head_ids(demo_head_ids)
    core, folder = ov.Core(), str(PAIR / role)
    props = replace(SPEC, dynamic_quantization=dynamic_quantization).device_properties(device="CPU")
    model = read_paged(core, folder)
    head = cut_head(model, ids)
    prompt = [5, 100, 200, 300, 999, 17, 40, 2048]
    # the main's exact sequence: a row per fed token; the model's own head, not widened
    full = paged(core.compile_model(read_paged(core, folder), "CPU", props)).sequence(exact=True).feed(prompt)
    cut = paged(core.compile_model(model, "CPU", props)).sequence(exact=True).feed(prompt)
    assert head.width == full.shape[-1] and cut.shape == (len(prompt), len(ids))
    assert np.allclose(cut, full[:, ids], rtol=0, atol=1e-5), float(np.abs(cut - full[:, ids]).max())


def test_a_proposal_is_a_kept_token_and_the_full_drafts_own_choice_when_that_is_kept(engine, demo_head_ids):
    """The engine's draft: its cut head's rows widened to the whole vocabulary, -inf at the rows cut."""
    ids = load_head_ids(demo_head_ids)
    kept = set(ids.tolist())
    assert engine.draft.head is not None and engine.main.head is None
    core = ov.Core()
    whole = core.compile_model(read_paged(core, str(PAIR / "draft")), "CPU", SPEC.device_properties(device="CPU"))
    full, cut = paged(whole).sequence(), engine.draft.sequence()
    feed = engine.tokenizer.encode(PROMPTS[0]).input_ids.data[0].tolist()
    agreed = 0
    for _ in range(24):
        full_row, cut_row = full.feed(feed)[-1], cut.feed(feed)[-1]
        choice = int(np.argmax(cut_row))
        assert choice in kept and np.isneginf(np.delete(cut_row, ids)).all()
        if int(np.argmax(full_row)) in kept:
            assert choice == int(np.argmax(full_row))
            agreed += 1
        feed = [int(np.argmax(full_row))]  # both follow the full draft's own text
    assert agreed >= 12
    cut.close()
    assert engine.draft.pool.free_count == engine.draft.pool.blocks


def test_greedy_answers_with_the_cut_draft_are_the_main_alones_and_it_still_speculates(engine):
    steps = tokens = 0
    for prompt in PROMPTS:
        alone = answer(engine, prompt, 0)
        assert answer(engine, prompt, 5) == alone, prompt
        drafted = steps_of(engine.submit(prompt=prompt, params=DecodingParams(max_new_tokens=40, ignore_eos=True,
                                                                              speculation=Speculation(k=3))))
        assert [token for step in drafted for token in step] == alone, prompt
        steps, tokens = steps + len(drafted), tokens + len(alone)
    assert tokens / steps > 2.2, "the draft's proposals are not the kept tokens' own ids"


def test_under_a_grammar_the_cut_draft_changes_no_token(engine):
    for prompt in PROMPTS:
        held = {"grammar_kind": "regex", "grammar_text": CODE}
        assert answer(engine, prompt, 3, **held) == answer(engine, prompt, 0, **held), prompt



def test_the_benchmark_runs_the_own_engine_with_the_drafts_head_whole_and_cut(demo_head_ids):
    """compare_modes' own-whole-head lines beside own's (the head cut): the same greedy answers; and the draft's
    cost of one token is measured with each head, beside the main's."""
    spec = replace(SPEC, draft_head_ids=str(demo_head_ids))
    lines = compare_modes(spec=spec, prompts=list(PROMPTS[:2]), ks=(3,), max_new_tokens=16, repeats=1,
                          modes=("own", "own-whole-head"), say=lambda _: None)
    assert [line.name for line in lines] == ["own main alone", "own K=3", "own-whole-head main alone",
                                             "own-whole-head K=3"]
    assert all(line.identical == len(line.answers) == 2 for line in lines)
    assert set(draft_cost(spec=spec, mode="own", tokens=4)) == {"main", "whole head", "cut head"}
