"""The library engine's step process: it serves like the pipeline it holds, a crash fails only its own
requests (the next request loads it again), and it never outlives the worker that started it."""

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

from django.conf import settings

from inference.engines.base import DecodingParams, Finished, PairSpec, StepTokens
from inference.engines.registry import EngineRegistry

DEMO = settings.MODELS_ROOT / settings.DEMO_PAIR_DIR
SPEC = PairSpec(slug="step-process", main_dir=str(DEMO / "main"), draft_dir=str(DEMO / "draft"))
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
                                                                 num_assistant_tokens=3))
    assert isinstance(running.events.get(timeout=60), StepTokens)
    os.kill(engine._process.pid, signal.SIGKILL)
    _, finished = drain(running, timeout=10)
    assert finished.finish_reason == "error" and "engine process exited" in finished.error

    again = registry.get(SPEC)
    assert again is not engine and again.alive
    tokens, finished = drain(again.submit(prompt=PROMPT, params=DecodingParams(max_new_tokens=24,
                                                                               num_assistant_tokens=3)))
    assert finished.finish_reason in ("stop", "length")
    assert again.tokenizer.decode(tokens) == main_alone_greedy(PROMPT, 24)  # greedy: exactly the main's answer
    again.close()


def test_the_step_process_does_not_outlive_a_killed_worker(tmp_path):
    script = (
        "import sys, time\n"
        "from inference.engines.base import PairSpec\n"
        "from inference.engines.library import PairEngine\n"
        f"engine = PairEngine(PairSpec(slug='orphan', main_dir={SPEC.main_dir!r}, draft_dir={SPEC.draft_dir!r}))\n"
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
    request = engine.submit(prompt=prompt, params=DecodingParams(max_new_tokens=24, num_assistant_tokens=3))
    assert request.prompt_tokens > 32
    tokens, finished = drain(request)
    assert finished.finish_reason in ("stop", "length")
    assert engine.tokenizer.decode(tokens) == main_alone_greedy(prompt, 24)
    engine.close()
