"""The library engine's step process: it serves like the pipeline it holds, a crash fails only its own
requests (the next request loads it again), and it never outlives the worker that started it."""

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import pytest
from django.conf import settings

from inference.benchmark.memory import mapped_weight_bytes
from inference.engines.decoding import DecodingParams, Speculation
from inference.engines.interface import Finished, StepTokens
from inference.engines.spec import PairSpec
from inference.limits import Route
from inference.serving.registry import EngineRegistry

pytestmark = pytest.mark.no_database

DEMO = settings.MODELS_ROOT / settings.DEMO_PAIR_DIR
SPEC = PairSpec(slug="step-process", main_dir=str(DEMO / "main"), draft_dir=str(DEMO / "draft"),
                pair_default=Route.LIBRARY_SPECULATIVE)
PROMPT = "def moving_average(values, window):\n"


def drain(request, timeout: float = 60) -> tuple[list[int], Finished]:
    tokens: list[int] = []
    deadline = time.monotonic() + timeout
    while True:
        event = request.events.get(timeout=max(deadline - time.monotonic(), 0.01))
        if isinstance(event, Finished):
            return tokens, event
        assert isinstance(event, StepTokens)
        tokens += event.token_ids


def test_a_crashed_step_process_fails_its_requests_and_the_next_request_loads_it_again(main_alone_greedy):
    registry = EngineRegistry()
    engine = registry.get(SPEC)
    running = engine.submit(prompt=PROMPT, params=DecodingParams(max_new_tokens=2000, ignore_eos=True,
                                                                 speculation=Speculation(k=3)))
    assert isinstance(running.events.get(timeout=60), StepTokens)
    os.kill(engine._process.pid, signal.SIGKILL)
    _, finished = drain(running, timeout=10)
    assert finished.finish_reason == "error" and "engine process exited" in finished.error

    again = registry.get(SPEC)
    assert again is not engine and again.alive
    tokens, finished = drain(again.submit(prompt=PROMPT, params=DecodingParams(max_new_tokens=24,
                                                                               speculation=Speculation(k=3))))
    assert finished.finish_reason in ("stop", "length")
    assert again.tokenizer.decode(tokens) == main_alone_greedy(PROMPT, 24)  # greedy: exactly the main's answer
    again.close()


def test_a_stop_signalled_to_the_process_group_lets_the_running_answer_finish(main_alone_greedy):
    """systemd and compose signal a worker's whole group: its warm shutdown waits for the answers, and the step
    process must outlive the signal to finish them (issue 66 saw `the engine process exited (code -15)`)."""
    engine = EngineRegistry().get(SPEC)
    running = engine.submit(prompt=PROMPT, params=DecodingParams(max_new_tokens=48, speculation=Speculation(k=3)))
    first = running.events.get(timeout=60)
    assert isinstance(first, StepTokens)
    for stop in (signal.SIGTERM, signal.SIGINT):
        os.kill(engine._process.pid, stop)
    tokens, finished = drain(running)
    assert finished.finish_reason in ("stop", "length"), finished
    assert engine.tokenizer.decode(first.token_ids + tokens) == main_alone_greedy(PROMPT, 48)
    engine.close()


def test_the_step_process_does_not_outlive_a_killed_worker(tmp_path):
    script = (
        "import sys, time\n"
        "from inference.engines.spec import PairSpec\n"
        "from inference.engines.library.pipeline import LibraryEngine\n"
        f"engine = LibraryEngine(PairSpec(slug='orphan', main_dir={SPEC.main_dir!r}, draft_dir={SPEC.draft_dir!r}))\n"
        "print(engine._process.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    worker = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    step_pid = int(worker.stdout.readline())
    assert os.path.exists(f"/proc/{step_pid}")
    worker.kill()
    worker.wait()
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{step_pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{step_pid}") or _is_zombie(step_pid), "the step process was left running"


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_smaller_scheduler_budget_prefills_in_chunks_and_keeps_the_answer(main_alone_greedy):
    """A pair's max_num_batched_tokens below its prompt's length: the prompt is prefilled a chunk per step
    beside the running answers, and the greedy answer is still exactly the main's."""
    prompt = PROMPT + ('    """Return the moving averages of `values` over `window` items, for every full\n'
                       '    window, as floats; raise ValueError when the window is not positive."""\n')
    engine = EngineRegistry().get(replace(SPEC, max_num_batched_tokens=32))
    request = engine.submit(prompt=prompt, params=DecodingParams(max_new_tokens=24, speculation=Speculation(k=3)))
    assert request.prompt_tokens > 32
    tokens, finished = drain(request)
    assert finished.finish_reason in ("stop", "length")
    assert engine.tokenizer.decode(tokens) == main_alone_greedy(prompt, 24)
    engine.close()


def test_prefilling_whole_prompts_first_takes_a_prompt_longer_than_the_default_budget(main_alone_greedy):
    """A pair that prefills whole prompts first (dynamic_split_fuse off) gets a step budget of the model's
    context: a prompt over the library's default of 256 tokens, joining a running answer, is served (the
    library fails a step whose prompt exceeds the budget), and both greedy answers are exactly the main's."""
    long_prompt = "".join(f"def helper_{i}(values):\n    return sorted(values)[{i}]\n\n" for i in range(20)) + PROMPT
    engine = EngineRegistry().get(replace(SPEC, prefill_first=True))
    assert engine.spec.step_budget == 1024  # the demo main's context
    running = engine.submit(prompt=PROMPT, params=DecodingParams(max_new_tokens=48, speculation=Speculation(k=3)))
    first = running.events.get(timeout=60)
    assert isinstance(first, StepTokens)
    joining = engine.submit(prompt=long_prompt, params=DecodingParams(max_new_tokens=24, speculation=Speculation(k=3)))
    assert joining.prompt_tokens > 256
    joined_tokens, joined_end = drain(joining)
    running_tokens, running_end = drain(running)
    assert (joined_end.finish_reason, running_end.finish_reason) == ("length", "length"), (joined_end, running_end)
    assert engine.tokenizer.decode(joined_tokens) == main_alone_greedy(long_prompt, 24)
    assert engine.tokenizer.decode(first.token_ids + running_tokens) == main_alone_greedy(PROMPT, 48)
    engine.close()


def test_an_engine_due_for_renewal_waits_for_a_quiet_moment_unless_far_past_due():
    """Building a pipeline takes the cores for seconds: a renewal under load slowed every stream. An engine
    past `renew_after` requests is renewed once the pair runs at most one request, or at any load once it
    has taken twice as many."""
    spec = replace(SPEC, route=Route.LIBRARY_MAIN_ALONE)
    params = DecodingParams(max_new_tokens=64, ignore_eos=True)
    registry = EngineRegistry(renew_after=2)
    engine = registry.get(spec)
    answers = [engine.submit(prompt=PROMPT, params=params) for _ in range(2)]
    assert registry.get(spec) is engine and spec not in registry._renewing  # due, but two answers run
    for answer in answers:
        assert drain(answer)[1].finish_reason == "length"
    assert registry.get(spec) is engine  # quiet now: renewed in the background, the old engine serves meanwhile
    deadline = time.monotonic() + 60
    while registry.get(spec) is engine and time.monotonic() < deadline:
        time.sleep(0.1)
    assert registry.renewed == 1
    renewed = registry.get(spec)
    assert renewed is not engine and renewed.alive

    registry = EngineRegistry(renew_after=1)
    engine = registry.get(spec)
    answers = [engine.submit(prompt=PROMPT, params=params) for _ in range(2)]
    registry.get(spec)  # twice past due with two answers running: renewed anyway
    for answer in answers:
        drain(answer)
    deadline = time.monotonic() + 60
    while registry.get(spec) is engine and time.monotonic() < deadline:
        time.sleep(0.1)
    assert registry.renewed == 1
    for held in (renewed, registry.get(spec)):
        held.close()


FRESH_PROCESS_BURST = """
import sys, threading
from concurrent.futures import ThreadPoolExecutor
from inference.engines.tokenizer import load_tokenizer, prompt_token_ids
together = threading.Barrier(8)
def answer(i):
    together.wait()  # the main's and the draft's tokenizers load at once, as two engines of a fresh worker
    tokenizer = load_tokenizer(sys.argv[1 + i % 2])
    return prompt_token_ids(tokenizer, prompt=f"def f{i}(x):", add_special_tokens=True, prompt_ids=None)
with ThreadPoolExecutor(8) as pool:
    list(pool.map(answer, range(8)))
"""


def test_a_burst_of_requests_at_a_fresh_worker_tokenizes_from_many_threads_at_once():
    """The first tensor turned into numpy in openvino's bindings sets up their numpy API, and threads
    doing that at once deadlock the process (engines.tokenizer sets it up at import). Fresh processes whose 8
    threads load the main's and the draft's tokenizers and encode at once: 3 of 12 hung when each
    tokenizer encoded once as it loaded (the fix before), 0 of 12 with the set-up at import."""
    for _ in range(8):
        fresh = subprocess.run([sys.executable, "-c", FRESH_PROCESS_BURST, SPEC.main_dir, SPEC.draft_dir],
                               cwd=settings.BASE_DIR, timeout=60, check=False)
        assert fresh.returncode == 0


def test_a_pairs_extra_engines_are_freed_when_idle_and_its_default_engine_stays():
    """The main alone and the own engine each hold another copy of the main's weights: a worker frees
    them once unused for a while (never while they run a request), and loads them again when needed."""
    registry = EngineRegistry(release_extra_after_s=0.5)
    default = registry.get(SPEC)
    main_alone = registry.get(replace(SPEC, route=Route.LIBRARY_MAIN_ALONE))
    running = main_alone.submit(prompt=PROMPT, params=DecodingParams(max_new_tokens=2000, ignore_eos=True))
    assert isinstance(running.events.get(timeout=60), StepTokens)
    time.sleep(0.6)
    assert registry.release_idle_extras() == []  # it runs a request
    running.stop()
    drain(running)
    assert registry.release_idle_extras() == [replace(SPEC, route=Route.LIBRARY_MAIN_ALONE)]
    assert main_alone._process.wait(30) == 0  # its step process ended, its memory with it
    assert [e["route"] for e in registry.loaded()] == [Route.LIBRARY_SPECULATIVE] and default.alive
    again = registry.get(replace(SPEC, route=Route.LIBRARY_MAIN_ALONE))
    tokens, finished = drain(again.submit(prompt=PROMPT, params=DecodingParams(max_new_tokens=4)))
    assert finished.finish_reason == "length" and len(tokens) == 4
    registry.unload(SPEC.slug)


def test_the_step_process_gives_back_the_weight_files_pages_and_answers_the_same():
    """The compiled model answers from its own repacked copy of the weights; the file's pages it read while
    repacking would otherwise stay counted in the worker's memory for the engine's life."""
    spec = replace(SPEC, slug="pages", main_dir=str(DEMO / "main-large"), draft_dir="", route=Route.LIBRARY_MAIN_ALONE)
    weights = (DEMO / "main-large" / "openvino_model.bin").stat().st_size
    engine = EngineRegistry().get(spec)

    def held_once_idle() -> int:
        deadline = time.monotonic() + 10
        while (held := mapped_weight_bytes(engine._process.pid)) > 0.02 * weights and time.monotonic() < deadline:
            time.sleep(0.2)  # given back once the step process is idle
        return held

    try:
        params = DecodingParams(max_new_tokens=24, ignore_eos=True)
        first, _ = drain(engine.submit(prompt=PROMPT, params=params))
        assert held_once_idle() < 0.02 * weights, "the weight file's pages are still held"
        again, _ = drain(engine.submit(prompt=PROMPT, params=params))
        assert again == first
        assert held_once_idle() < 0.02 * weights
    finally:
        engine.close()
