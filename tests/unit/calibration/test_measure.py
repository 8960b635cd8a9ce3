"""Which configurations of the main alone a calibration measures again after a round; the prompts it measures on."""

import json

from django.conf import settings

from inference.calibration.measure import CALIBRATION_PROMPTS, Line, _contenders, chat_prompts
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
