"""What a worker reads of the other workers' heartbeats."""

import pytest

from inference.serving.lifecycle import answers_on_this_host

BEATS = [{"name": "vm:100", "active": 2}, {"name": "vm:200", "active": 3}, {"name": "other-vm:100", "active": 5},
         {"name": "vm:300"}, {"name": "vm.example:400", "active": 1}]


@pytest.mark.parametrize(("me", "answers"), [
    ("vm:100", 3),  # vm:200's; its own two, another host's five, a beat without a count and a longer host name aside
    ("vm:200", 2),
    ("other-vm:100", 0),  # alone on its host
    ("vm:999", 5),  # a worker whose first beat is not in yet: every other one of its host
    ("new-host:1", 0),
])
def test_the_answers_of_the_other_workers_on_the_same_host(me, answers):
    assert answers_on_this_host(BEATS, name=me) == answers
