"""The benchmark's prompts: a user's file of them, and the measure of an answer that loops."""

import json

import pytest

from inference.benchmark.prompts import prompts_from_file, repeated_ngram_share


def test_repeated_ngram_share_is_zero_for_fresh_text_and_high_for_a_loop():
    assert repeated_ngram_share("def area(radius):\n    return math.pi * radius ** 2") == 0
    loop = "x = x + 1\n" * 10
    assert repeated_ngram_share(loop) > 0.8
    assert repeated_ngram_share("too short") == 0


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
