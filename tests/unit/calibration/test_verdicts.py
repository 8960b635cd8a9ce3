"""What a calibration's figures decide: where the main alone serves, the K answers get in the own engine's batch."""

from inference.calibration.verdicts import best_batch_k, library_alone, long_context_from


def test_the_main_alone_moves_to_the_library_only_where_it_is_faster_and_its_first_tokens_no_later():
    """At several streams the library prefills every prompt before it decodes: 1.06x the tokens a second of the own
    engine's batch came with first tokens twice as late (the AVX2 host), which no user of a chat calls faster."""
    configs = {"f32": {"tokens_per_s": 8.9, "streams": 4, "tokens_per_s_streams": 14.6}}

    def verdict(library: dict, own: dict) -> dict[str, bool]:
        return library_alone({"configs": configs, "fastest": "f32", "fastest_again": library, "own_main_alone": own})

    own = {"tokens_per_s": 7.5, "first_token_ms": 1200.0, "tokens_per_s_streams": 13.8, "first_token_ms_streams": 3000.0}
    library = {"tokens_per_s": 8.7, "first_token_ms": 1150.0, "tokens_per_s_streams": 14.6}
    assert verdict({**library, "first_token_ms_streams": 2900.0}, own) == {"1": True, "4": True}
    assert verdict({**library, "first_token_ms_streams": 6100.0}, own) == {"1": True, "4": False}
    assert verdict({**library, "first_token_ms": 1300.0, "first_token_ms_streams": 2900.0}, own) == {"1": False, "4": True}
    assert verdict({**library, "tokens_per_s_streams": 14.0, "first_token_ms_streams": 2900.0}, own)["4"] is False
    untimed = {key: value for key, value in own.items() if not key.startswith("first_token")}  # calibrated before
    assert verdict(library, untimed) == {"1": True, "4": True}


def test_answers_speculate_in_the_batch_at_the_k_that_beat_the_own_batch_under_load_with_the_same_answers():
    """Four at once (the Intel host, model 167): the own engine's batched main alone 31.3 tok/s, the library's 34.4;
    a K in the batch counts only where its answers were the batched main alone's, and above it: the batched main
    alone is what serves those answers otherwise, the library's computing another answer (changed 2026-11-30: it had
    to beat the library's too)."""
    configs = {"f32-dynamic": {"tokens_per_s": 12.9, "streams": 4, "tokens_per_s_streams": 35.8}}
    own = {"tokens_per_s": 10.5, "tokens_per_s_streams": 31.3}
    library = {"tokens_per_s": 11.9, "tokens_per_s_streams": 34.4}

    def results(**batch_ks: tuple[float, int]) -> dict:
        measured_ = {k.removeprefix("k"): {"tokens_per_s": rate, "identical": same, "answers": 4}
                     for k, (rate, same) in batch_ks.items()}
        found = {"configs": configs, "fastest": "f32-dynamic", "fastest_again": library, "own_main_alone": own,
                 "batch_ks": measured_}
        return found | {"batch_k": best_batch_k(found)}

    assert results(k1=(41.0, 4), k2=(44.5, 4))["batch_k"] == 2
    assert results(k1=(41.0, 4), k2=(44.5, 3))["batch_k"] == 1  # K=2 parted from the main alone at a near-tie
    assert results(k1=(33.0, 4), k2=(34.0, 4))["batch_k"] == 2  # above the own batch, not above the library's
    assert results(k1=(30.0, 4), k2=(31.0, 4))["batch_k"] == 0  # below the own batch
    assert results()["batch_k"] == 0  # calibrated before it measured the batch
    faster_library = {**library, "tokens_per_s_streams": 40.0}
    beaten = results(k2=(44.5, 4)) | {"fastest_again": faster_library}
    assert library_alone(beaten)["4"] is False  # the burst speculates in the own engine's batch: one engine
    assert library_alone({**beaten, "batch_k": 0})["4"] is True


def test_long_answers_go_to_the_main_alone_from_where_the_gain_falls_to_nothing():
    """The Intel model 207 host: K=6 1.25x the main alone after ~60-token prompts, 0.79x after 2,000 tokens: the gain
    reaches nothing about halfway (the verify and the rollback of rejected tokens cost more as the context grows)."""
    def results(*, short: float, long: float, long_k: int = 0) -> dict:
        return {"configs": {"defaults": {"tokens_per_s": 15.3}}, "fastest": "defaults",
                "fastest_again": {"tokens_per_s": 14.8}, "own_main_alone": {"tokens_per_s": 12.6},
                "ks": {"6": {"tokens_per_s": short}}, "best_k": {"1": 6}, "prompt_tokens": 60,
                "long_context": {"tokens": 2000, "k": long_k, "drafted": {"tokens_per_s": long},
                                 "own_main_alone": {"tokens_per_s": 9.53}, "fastest": {"tokens_per_s": 11.65}}}

    assert long_context_from(results(short=18.5, long=9.15)) == 1104
    assert long_context_from(results(short=15.0, long=9.15)) == 175  # a slim gain is gone soon
    assert long_context_from(results(short=18.5, long=12.0, long_k=6)) is None  # still paying: the K long answers get
    assert long_context_from({**results(short=18.5, long=9.15), "prompt_tokens": None}) is None  # calibrated before
    assert long_context_from({**results(short=18.5, long=9.15), "best_k": {"1": 0}}) is None  # no K to give up
