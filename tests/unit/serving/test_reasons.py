"""A plan's reasons, each with its sentence."""

from inference.serving.planning import Asked, Load, plan
from inference.serving.reasons import SENTENCES, Reason, Why, sentence
from tests.unit.serving.planning import OWN, PROFILED, live, pair


def test_every_reason_has_its_sentence_and_the_sentences_read_as_before():
    assert set(SENTENCES) == set(Reason)
    at_two = plan(pair=pair(**PROFILED), asked=Asked(), load=Load(streams=16, running_speculative=3))
    assert at_two.reason == ("the main alone is faster at 16+ streams (measured); 16 running here; "
                             "joins the running speculative batch with K=2 (its highest-load K)")
    figures = plan(pair=pair(), asked=Asked(), load=Load(streams=8), live=live({0: 150.0, 2: 201.0, 5: 206.0}))
    assert figures.reason == "K=2 is fastest (measured here lately at 8 streams: K=2 201 tok/s, the main alone 150 tok/s)"
    assert plan(pair=pair(**OWN), asked=Asked(), load=Load(streams=3)).reason == (
        "3 of the pair's answers running here; the main alone, batched on SpecChat's own engine (more of the pair's "
        "answers here than it speculates for); speculating at K=4 once the others have ended")
    assert sentence((Why(Reason.K_ASKED), Why(Reason.FAST_MODE))) == (
        "K asked by the request; fast mode: tokens may differ from the main alone's where two are near-tied")
