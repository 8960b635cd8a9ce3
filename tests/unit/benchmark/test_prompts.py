"""How the benchmark tells answers that loop (which any draft predicts) from real ones."""

import json

import pytest

from inference.benchmark.inprocess import Sample, Variant, VariantResult
from inference.benchmark.prompts import Prompt, prompts_from_file, repeated_ngram_share
from inference.benchmark.summary import loop_warning


def test_repeated_ngram_share_is_zero_for_fresh_text_and_high_for_a_loop():
    assert repeated_ngram_share("def area(radius):\n    return math.pi * radius ** 2") == 0
    loop = "x = x + 1\n" * 10
    assert repeated_ngram_share(loop) > 0.8
    assert repeated_ngram_share("too short") == 0


def sample(prompt: str, text: str, accepted: int | None = None) -> Sample:
    return Sample(prompt=Prompt(prompt), text=text, tokens=16, started_at=0, duration_s=1, ttft_ms=10,
                  token_latency_ms=1, main_steps=8, accepted=accepted, proposed=None if accepted is None else 10)


def test_loop_warning_gives_acceptance_on_the_least_repetitive_prompts():
    looping, fresh = "a = b\n" * 12, "def f(values):\n    return sorted(set(values))[::-1]"
    plain = VariantResult(Variant("plain", False), [sample("p1", looping), sample("p2", looping), sample("p3", fresh)])
    k3 = VariantResult(Variant("K=3", True, num_assistant_tokens=3),
                       [sample("p1", looping, 10), sample("p2", looping, 10), sample("p3", fresh, 4)])
    warning = loop_warning({"plain": plain, "K=3": k3})
    assert warning and "Outputs loop" in warning and "K=3 0.40 (all prompts 0.80)" in warning
    calm = VariantResult(Variant("plain", False), [sample("p3", fresh)])
    assert loop_warning({"plain": calm, "K=3": k3}) is None


def test_prompts_file_takes_json_or_json_lines_of_text_or_chat(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(["def f():", {"prompt": "class A:"}, {"messages": [{"role": "user", "content": "hi"}]}]))
    prompts = prompts_from_file(path, render_chat=lambda messages: "<user>" + messages[0]["content"])
    assert [p.text for p in prompts] == ["def f():", "class A:", "<user>hi"] and {p.set for p in prompts} == {"mine"}
    path.write_text('{"prompt": "a"}\n\n{"prompt": "b"}\n')
    assert [p.text for p in prompts_from_file(path, render_chat=str)] == ["a", "b"]
    for content, message in (("", "no prompts"), ("[3]", "item 1"), ('["ok", {"prompt": " "}]', "item 2"),
                             ("[1,", "not JSON")):
        path.write_text(content)
        with pytest.raises(ValueError, match=message):
            prompts_from_file(path, render_chat=str)
