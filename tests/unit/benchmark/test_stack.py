"""The path an answer was served on, named as the benchmark's lines."""

import pytest

from inference.benchmark.stack import served_path


@pytest.mark.parametrize(("usage", "path"), [
    ({"speculative_mode": "off", "speculative_k": None, "speculative_reason_codes": ["asked-off"]}, "plain"),
    ({"speculative_mode": "draft", "speculative_k": 3, "speculative_reason_codes": ["profile-best-k"]}, "K=3"),
    ({"speculative_mode": "draft-exact-sampling", "speculative_k": 2, "speculative_reason_codes": []}, "K=2"),
    ({"speculative_mode": "off", "speculative_k": None,
      "speculative_reason_codes": ["profile-best-k", "handed-over"]}, "moved to plain"),
    ({"speculative_mode": "draft", "speculative_k": None, "speculative_reason_codes": ["threshold-asked"]}, "draft"),
])
def test_the_path_an_answer_was_served_on_is_named_as_the_benchmarks_lines(usage, path):
    assert served_path(usage) == path
