"""Which configurations of the main alone a calibration measures again after a round."""

import json

from django.conf import settings

from inference.calibration.measure import (
    CALIBRATION_PROMPTS,
    Line,
    _contenders,
    best_batch_k,
    chat_prompts,
    library_alone,
)
from inference.pairs import catalog


def measured(tokens_per_s: float, *, streams: int = 1) -> Line:
    return Line(engine=None, streams=streams, tokens=int(tokens_per_s * 10), seconds=10.0)  # type: ignore[arg-type]


def test_a_configuration_far_behind_at_one_stream_and_under_load_is_not_measured_again():
    lines = {"f32-dynamic": (measured(11.4), measured(34.0, streams=4)),
             "bf16": (measured(9.5), measured(18.6, streams=4)),  # close enough at one stream
             "defaults": (measured(8.1), measured(30.0, streams=4)),  # close enough under load
             "f16": (measured(5.7), measured(14.7, streams=4))}
    kept = _contenders([line for pair in lines.values() for line in pair])
    assert kept == [line for name in ("f32-dynamic", "bf16", "defaults") for line in lines[name]]


def test_once_one_configuration_is_left_no_round_measures_the_main_alone_again():
    """Its time goes to the own engine's Ks: on the Intel host (model 207) a second round of f32 with int8
    activations alone left each K one answer within the budget."""
    lines = {"f32-dynamic": (measured(11.4), measured(34.0, streams=4)),
             "bf16": (measured(6.5), measured(17.7, streams=4)), "f32": (measured(5.5), measured(16.2, streams=4))}
    assert _contenders([line for pair in lines.values() for line in pair]) == []


def test_a_pair_with_prompts_of_its_own_is_calibrated_on_them(tmp_path):
    """Beside its models a pair may keep requests like its traffic (`make real-pair` places the real pair's); else
    the repository's held-out prompts, code and prose in turn."""
    demo = settings.MODELS_ROOT / settings.DEMO_PAIR_DIR
    (tmp_path / "main").symlink_to(demo / "main")
    generic = chat_prompts(str(tmp_path / "main"), 2)
    assert "def moving_average" in generic[0] and "lighthouse keeper" in generic[1]
    asked = ["Rename the variable x to total in: x = a + b", "Why does my loop never end?"]
    (tmp_path / CALIBRATION_PROMPTS).write_text(json.dumps(
        [{"messages": [{"role": "user", "content": text}]} for text in asked]))
    own = chat_prompts(str(tmp_path / "main"), 2)
    assert [text in prompt for text, prompt in zip(asked, own, strict=True)] == [True, True]


def test_the_real_pairs_calibration_prompts_are_its_tuning_set_not_its_held_out_one():
    assert catalog.QWEN_CODER.calibration_prompts.endswith("chat-a.json")
    assert (settings.BASE_DIR / catalog.QWEN_CODER.calibration_prompts).is_file()


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


def test_answers_speculate_in_the_batch_at_the_k_that_beat_every_main_alone_under_load_with_the_same_answers():
    """Four at once (the Intel host, model 167): the own engine's batched main alone 31.3 tok/s, the library's 34.4;
    a K in the batch counts only where its answers were the batched main alone's, and above both."""
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
    assert results(k1=(33.0, 4), k2=(34.0, 4))["batch_k"] == 0  # above the own batch, not above the library's
    assert results()["batch_k"] == 0  # calibrated before it measured the batch
    faster_library = {**library, "tokens_per_s_streams": 40.0}
    beaten = results(k2=(44.5, 4)) | {"fastest_again": faster_library}
    assert library_alone(beaten)["4"] is False  # the burst speculates in the own engine's batch: one engine
    assert library_alone({**beaten, "batch_k": 0})["4"] is True
