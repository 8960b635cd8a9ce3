"""How an answer speculates, as one value (engines/decoding.py), and what the library's pipeline makes of it
(engines/library/config.py): K or the threshold, never both or none, and no K made up."""

import pytest

from inference.engines.decoding import DecodingParams, Speculation
from inference.engines.library.config import generation_config
from inference.engines.spec import PairSpec
from inference.limits import Route


def test_speculation_takes_a_k_or_a_threshold_and_an_answer_without_it_runs_the_main_alone():
    assert Speculation(k=3).batch_k is None  # beyond the speculating streams it goes on as the main alone
    assert Speculation(threshold=0.4).k is None
    for neither_or_both in ({}, {"k": 3, "threshold": 0.4}):
        with pytest.raises(ValueError, match="a K or a confidence threshold"):
            Speculation(**neither_or_both)
    assert DecodingParams(max_new_tokens=8).speculation is None


def test_the_librarys_speculative_pipeline_gets_the_planned_k_or_threshold_and_no_fallback():
    spec = PairSpec(slug="p", main_dir="m", draft_dir="d", route=Route.LIBRARY_SPECULATIVE)
    assert generation_config(DecodingParams(max_new_tokens=8, speculation=Speculation(k=3)), spec).num_assistant_tokens == 3
    by_threshold = generation_config(DecodingParams(max_new_tokens=8, speculation=Speculation(threshold=0.4)), spec)
    assert by_threshold.assistant_confidence_threshold == pytest.approx(0.4)
    with pytest.raises(ValueError, match="name a K"):  # a plan that forgot it fails loudly, not at a made-up K
        generation_config(DecodingParams(max_new_tokens=8), spec)
