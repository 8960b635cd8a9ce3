"""A reader's place in an answer's steps when Redis lost the stream and the worker wrote it again."""

import pytest

from inference.serving.readers import INTERRUPTED, StepAligner


def delta(at, *steps, replay=False):
    event = {"type": "delta", "at": at, "steps": [["", s] for s in steps]}
    return {**event, "replay": True} if replay else event


def texts(events):
    return ["".join(main for _, main in e["steps"]) for e in events if e and e["type"] == "delta"]


def test_a_live_reader_skips_what_it_has_of_the_replay_and_reads_the_rest():
    reader = StepAligner(known=0, resumed=False)
    seen = [reader.align(e) for e in (
        {"type": "start"}, delta(0, "a", "b"), delta(2, "c"),
        # Redis restarted after "c" was read and before "d" was: the new stream holds the replay, then "e"
        {"type": "start"}, delta(0, "a", "b", "c", "d", replay=True), delta(4, "e"))]
    assert [e["type"] for e in seen if e] == ["start", "delta", "delta", "delta", "delta"]  # one start only
    assert "".join(texts(seen)) == "abcde"


def test_a_reader_that_says_how_many_steps_it_has_resumes_exactly():
    reader = StepAligner(known=3, resumed=True)
    seen = [reader.align(e) for e in ({"type": "start"}, delta(0, "a", "b", "c", "d", replay=True), delta(4, "e"))]
    assert texts(seen) == ["d", "e"]


def test_a_gap_waits_for_the_replay_that_fills_it():
    reader = StepAligner(known=0, resumed=False)
    assert reader.align(delta(0, "a")) is not None
    assert reader.align(delta(3, "d")) is None  # steps 1-2 are missing: not passed on out of order
    assert texts([reader.align(delta(0, "a", "b", "c", "d", replay=True))]) == ["bcd"]


def test_a_resuming_reader_that_cannot_be_placed_in_a_replay_is_told_so():
    reader = StepAligner(known=None, resumed=True)
    with pytest.raises(ValueError, match="interrupted") as caught:
        reader.align(delta(0, "a", "b", replay=True))
    assert str(caught.value) == INTERRUPTED
    placed = StepAligner(known=None, resumed=True)  # an ordinary delta tells where the reader is
    assert texts([placed.align(delta(5, "f")), placed.align(delta(6, "g"))]) == ["f", "g"]
