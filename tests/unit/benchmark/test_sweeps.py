"""The bursts of a concurrency sweep: every prompt asked at every level, the lines' order turned."""

import asyncio

import pytest

from inference.benchmark import sweeps
from inference.benchmark.inprocess import PLAIN, Sample, Variant
from inference.benchmark.prompts import Prompt
from inference.benchmark.sweeps import concurrency_sweep


@pytest.fixture(autouse=True)
def no_worker_to_forget_its_load(monkeypatch):
    """The sweep waits for a worker's load memory to fade before a smaller burst; these streams have no worker."""
    monkeypatch.setattr(sweeps, "LOAD_MEMORY_S", 0)


@pytest.mark.parametrize(("level", "asked"), [(1, 3), (2, 4), (3, 3), (5, 5)])
def test_a_burst_of_fewer_streams_than_prompts_asks_every_prompt(level, asked):
    """A level's figure is over the same requests as the others': one stream asks each prompt in turn, not the
    first prompt alone (a lone answer's speed on one prompt is no lone answer's speed)."""
    prompts = [Prompt(text) for text in ("a", "b", "c")]
    at_once: list[int] = []
    running = 0

    async def stream(*, prompt: Prompt, variant: Variant, max_new_tokens: int) -> Sample:
        nonlocal running
        running += 1
        at_once.append(running)
        await asyncio.sleep(0.01)
        running -= 1
        return Sample(prompt=prompt, text=prompt.text, tokens=4, started_at=0.0, duration_s=0.01, ttft_ms=1.0,
                      token_latency_ms=1.0, main_steps=4)

    [burst] = concurrency_sweep(stream=stream, prompts=prompts, levels=[level], variants=[PLAIN], max_new_tokens=4,
                                repeats=1)
    assert burst["completed"] == asked and max(at_once) == level
    assert {sample["prompt"] for sample in burst["samples"]} == {"a", "b", "c"}
    assert burst["throughput"] == pytest.approx(4 * asked / burst["wall_s"])


def test_the_bursts_order_changes_which_line_each_follows():
    """Turned by one each repeat, a line would always run right after the same one (and carry what that one leaves
    behind on the host): over the repeats each line follows more than one other."""
    names = ["plain", "K=3", "adaptive", "peer"]
    asked: list[str] = []

    async def stream(*, prompt: Prompt, variant: Variant, max_new_tokens: int) -> Sample:
        asked.append(variant.name)
        return Sample(prompt=prompt, text="", tokens=1, started_at=0.0, duration_s=0.01, ttft_ms=1.0,
                      token_latency_ms=None, main_steps=1)

    concurrency_sweep(stream=stream, prompts=[Prompt("a")], levels=[1], variants=[Variant(name, True) for name in names],
                      max_new_tokens=4, repeats=4)
    measured = asked[len(names):]  # after each line's unrecorded warm-up
    follows = {name: {measured[i - 1] for i in range(1, len(measured)) if measured[i] == name} for name in names}
    assert all(len(before) > 1 for before in follows.values()), follows
    assert sorted(measured) == sorted(names * 4)
