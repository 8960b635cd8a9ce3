"""The IR as the own engine steps it (engines/own/stepped_model.py), on the demo pair's models: a prefill computes and
returns the last prompt token's logits alone, the same the whole IR gives that token, a verification every fed
token's, a draft's sequence the last one's."""

from __future__ import annotations

import numpy as np
import openvino as ov
import pytest

from inference.engines.own.kv_cache import KvSequence
from inference.engines.own.prefix_cache import BLOCK_TOKENS, PrefixCache
from inference.engines.own.stepped_model import read_stepped
from tests.test_engines_exact import PAIR, SPEC

pytestmark = pytest.mark.no_database

PROMPT = list(range(300, 420))  # 120 tokens


@pytest.fixture(scope="module")
def models():
    core, props = ov.Core(), SPEC.device_properties(device="CPU")
    folder = str(PAIR / "main")
    return core.compile_model(f"{folder}/openvino_model.xml", "CPU", props), core.compile_model(
        read_stepped(core, folder), "CPU", props)


def whole_ir_logits(compiled: ov.CompiledModel, prompt: list[int], fed: list[int] = ()) -> np.ndarray:
    """The whole IR's logits for `fed` after `prompt` (the last prompt token's if none), the prompt fed in the prefix
    cache's chunks as the engine feeds it."""
    request, rows = compiled.create_infer_request(), []
    chunks = [prompt[start:start + BLOCK_TOKENS] for start in range(0, len(prompt), BLOCK_TOKENS)]
    done = 0
    for ids in [*chunks, list(fed)] if fed else chunks:
        n = len(ids)
        request.infer({"input_ids": np.array([ids]), "attention_mask": np.ones((1, done + n), np.int64),
                       "position_ids": np.arange(done, done + n)[None], "beam_idx": np.zeros(1, np.int32)})
        rows.append(request.get_output_tensor(0).data[0].copy())
        done += n
    return rows[-1]


def test_a_prefill_computes_the_last_tokens_logits_alone_and_the_same(models):
    whole, stepped = models
    expected = whole_ir_logits(whole, PROMPT)
    sequence = KvSequence(stepped, prompts=PrefixCache(capacity_bytes=0))
    got = sequence.prefill(PROMPT)
    assert got.shape == (1, expected.shape[1])
    # bitwise where the CPU computes a row alike alone and among others (AVX-512), else to 1e-5 (docs/exactness.md)
    assert np.allclose(got[0], expected[-1], rtol=0, atol=1e-5), float(np.abs(got[0] - expected[-1]).max())
    assert int(np.argmax(got[0])) == int(np.argmax(expected[-1]))


def test_a_verification_gets_a_row_per_fed_token_and_a_drafts_sequence_the_last_alone(models):
    whole, stepped = models
    proposals = [17, 40, 2048, 5]
    expected = whole_ir_logits(whole, PROMPT, proposals)
    main, draft = KvSequence(stepped, cut_rejected=True), KvSequence(stepped, last_row_only=True)
    for sequence in (main, draft):
        sequence.prefill(PROMPT)
    verified, drafted = main.feed(proposals), draft.feed(proposals)
    assert verified.shape == expected.shape and drafted.shape == (1, expected.shape[1])
    assert np.allclose(verified, expected, rtol=0, atol=1e-5)
    assert np.allclose(drafted[0], expected[-1], rtol=0, atol=1e-5)
