"""How the benchmark's summary tells answers that loop (which any draft predicts) from real ones."""

from inference.benchmark.inprocess import Sample, Variant, VariantResult
from inference.benchmark.prompts import Prompt
from inference.benchmark.summary import loop_warning, summarize
from inference.limits import Route


def sample(prompt: str, text: str, accepted: int | None = None, route: str = "") -> Sample:
    return Sample(prompt=Prompt(prompt), text=text, tokens=16, started_at=0, duration_s=1, ttft_ms=10,
                  token_latency_ms=1, main_steps=8, accepted=accepted, proposed=None if accepted is None else 10,
                  route=route)


def test_loop_warning_gives_acceptance_on_the_least_repetitive_prompts():
    looping, fresh = "a = b\n" * 12, "def f(values):\n    return sorted(set(values))[::-1]"
    plain = VariantResult(Variant("plain", False), [sample("p1", looping), sample("p2", looping), sample("p3", fresh)])
    k3 = VariantResult(Variant("K=3", True, num_assistant_tokens=3),
                       [sample("p1", looping, 10), sample("p2", looping, 10), sample("p3", fresh, 4)])
    warning = loop_warning({"plain": plain, "K=3": k3})
    assert warning and "Outputs loop" in warning and "K=3 0.40 (all prompts 0.80)" in warning
    calm = VariantResult(Variant("plain", False), [sample("p3", fresh)])
    assert loop_warning({"plain": calm, "K=3": k3}) is None


def test_the_summary_counts_the_answers_whose_text_parted_from_the_main_alones():
    plain = VariantResult(Variant("plain", False), [sample("p1", "a"), sample("p2", "b"), sample("p3", "c")])
    k3 = VariantResult(Variant("K=3", True, num_assistant_tokens=3),
                       [sample("p1", "a", 8), sample("p2", "b but parted", 8), sample("p3", "c", 8)])
    rows = {row["variant"]: row for row in summarize({"plain": plain, "K=3": k3})}
    assert (rows["K=3"]["texts_differing_from_plain"], rows["K=3"]["identical_to_plain"]) == (1, False)
    assert (rows["plain"]["texts_differing_from_plain"], rows["plain"]["identical_to_plain"]) == (0, True)
    sampled = summarize({"plain": plain, "K=3": k3}, greedy=False)
    assert {row["texts_differing_from_plain"] for row in sampled} == {None}  # the distribution test covers them


def test_an_answer_of_the_own_engine_is_compared_with_the_own_engines_main_alone():
    """The library's main alone and the own engine's compute one model in other kernels: where they part at a
    near-tie, the own engine's speculation is still exact, and the summary says so by comparing like with like."""
    library = {"p1": "a", "p2": "b"}
    own = {"p1": "a", "p2": "b, parted at a near-tie"}
    k3 = VariantResult(Variant("K=3", True, num_assistant_tokens=3),
                       [sample("p1", "a", 8, Route.OWN_SPECULATIVE), sample("p2", own["p2"], 8, Route.OWN_SPECULATIVE)])
    threshold = VariantResult(Variant("threshold=0.5", True, assistant_confidence_threshold=0.5),
                              [sample("p1", "a", 8, Route.LIBRARY_SPECULATIVE), sample("p2", own["p2"], 8)])
    plain = VariantResult(Variant("plain", False), [sample("p1", "a"), sample("p2", "b")])
    results = {"plain": plain, "K=3": k3, "threshold=0.5": threshold}
    rows = {row["variant"]: row for row in summarize(results, reference=library, own_reference=own)}
    assert rows["K=3"]["texts_differing_from_plain"] == 0 and rows["threshold=0.5"]["texts_differing_from_plain"] == 1
    unknown = {row["variant"]: row for row in summarize(results, reference=library)}  # no own main alone measured
    assert unknown["K=3"]["texts_differing_from_plain"] == 1
