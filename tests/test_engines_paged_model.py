"""The IR as the own engine runs it (engines/own/paged_model.py: OpenVINO's PagedAttention op, its head computing the
rows the engine reads), on the demo pair's models: a prefill returns the last prompt token's logits alone, a verify
every fed token's, a draft's sequence the last one's, each what the exported IR computes for that token; and the
cache is the runner's tensors, written in place in the blocks a table names. That the op's rows are bitwise the same
however they were fed and whoever shares their step, with dynamic quantization as the engine runs: see
tests/test_engines_own_rows.py."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import numpy as np
import openvino as ov
import pytest

from inference.engines.own.kv_cache import PagedModel
from inference.engines.own.model_runner import ModelRunner, Preempted, Steady, Work
from inference.engines.own.paged_model import cache_layout, read_paged
from tests.test_engines_exact import PAIR, SPEC

pytestmark = pytest.mark.no_database

PROMPT = list(range(300, 420))  # 120 tokens
PROPOSALS = [17, 40, 2048, 5]
POOL_BLOCKS = 16


def paged(role: str, *, dynamic_quantization: bool, caching: bool = True) -> PagedModel:
    core = ov.Core()
    props = replace(SPEC, dynamic_quantization=dynamic_quantization).device_properties(device="CPU")
    compiled = core.compile_model(read_paged(core, str(PAIR / role)), "CPU", props)
    return PagedModel(ModelRunner(compiled, pool_bytes=POOL_BLOCKS * cache_layout(compiled).block_bytes),
                      caching=caching)


def whole_ir_logits(role: str, ids: list[int]) -> np.ndarray:
    """The exported (stateful) IR's logits for every token of `ids`, in one inference, f32."""
    core = ov.Core()
    props = replace(SPEC, dynamic_quantization=False).device_properties(device="CPU")
    request = core.compile_model(str(PAIR / role / "openvino_model.xml"), "CPU", props).create_infer_request()
    request.infer({"input_ids": np.array([ids]), "attention_mask": np.ones((1, len(ids)), np.int64),
                   "position_ids": np.arange(len(ids))[None], "beam_idx": np.zeros(1, np.int32)})
    return request.get_output_tensor(0).data[0].copy()


TOLERANCE = 5e-5  # the op's rows against the IR's: 1.05e-5 apart on AMD Zen 3 (AVX2), under 1e-5 on AVX-512 hosts


@pytest.mark.parametrize("role", ["main", "draft"])
def test_a_prefill_a_verify_and_a_drafts_step_read_the_rows_the_ir_computes(role):
    """In f32 (the op's attention against the IR's: to 5e-5, as AVX2 hosts round each kernel otherwise): a prefill gets the last prompt token's row alone, a
    verify (the main's exact sequence) a row per fed token, a draft's sequence the last fed token's alone."""
    model = paged(role, dynamic_quantization=False)
    expected = whole_ir_logits(role, PROMPT + PROPOSALS)
    main, draft = model.sequence(exact=True), model.sequence()
    prefilled = [sequence.prefill(PROMPT) for sequence in (main, draft)]
    verified, drafted = main.feed(PROPOSALS), draft.feed(PROPOSALS)
    for got in prefilled:
        assert got.shape == (1, expected.shape[1])
        assert np.allclose(got[0], expected[len(PROMPT) - 1], rtol=0, atol=TOLERANCE), float(
            np.abs(got[0] - expected[len(PROMPT) - 1]).max())
    assert verified.shape == (len(PROPOSALS), expected.shape[1]) and drafted.shape == (1, expected.shape[1])
    assert np.allclose(verified, expected[len(PROMPT):], rtol=0, atol=TOLERANCE)
    assert np.allclose(drafted[0], expected[-1], rtol=0, atol=TOLERANCE)
    assert (verified.argmax(-1) == expected[len(PROMPT):].argmax(-1)).all()
    for sequence in (main, draft):
        sequence.close()
    assert model.pool.free_count == model.pool.blocks


def test_the_cache_is_the_runners_tensors_written_in_the_blocks_a_table_names():
    """One key and one value tensor a layer of [blocks, kv heads, 32 tokens, head size] on the CPU, sized by the pool
    the runner was given; an inference writes its tokens' keys and values in the blocks of its table, no other.
    The main as the engine compiles it: dynamic quantization on (precision.EXACT_ON_OWN_ENGINE)."""
    model = paged("main", dynamic_quantization=True)
    runner = model.runner
    layout = runner.layout
    assert layout.block_tokens == model.pool.block_tokens == 32 and runner.pool.blocks == POOL_BLOCKS
    assert layout.names[:2] == ("key_cache.0", "value_cache.0") and len(layout.names) % 2 == 0
    assert layout.block_bytes == sum(int(np.prod(shape)) for shape in layout.block_shapes) * 4  # f32 blocks
    views = {name: np.asarray(tensor.data) for name, tensor in runner.cache.items()}  # the tensors' own memory
    for view in views.values():
        view[...] = 0  # whatever the memory held before (an allocation need not be zeroed)
    taken = runner.pool.allocate(4)
    table = taken[2:]  # blocks 2 and 3
    rows = runner.run([Work(table, 0, PROMPT[:40], rows=3)])
    assert [row.shape for row in rows] == [(3, runner.compiled.output(0).get_partial_shape()[-1].get_length())]
    for name, view in views.items():
        written = {int(block) for block in np.flatnonzero(np.abs(view).reshape(POOL_BLOCKS + 1, -1).max(1))}
        assert written == set(table) == {2, 3}, name  # the block past the pool's is a padded step's (below)
    runner.pool.release(taken)
    assert runner.pool.free_count == POOL_BLOCKS


def test_a_step_padded_to_the_hosts_steady_sizes_returns_its_own_rows_and_writes_only_its_blocks():
    """Where the host's kernels round a row by the step's size (AVX2: ModelRunner.steady_rows), a smaller step is
    padded with a filler in the block past the pool's: each work gets its own rows, as unpadded, and no block of the
    pool is written but its table's; the scheduler then reads prompts in chunks within the steady sizes."""
    model = paged("main", dynamic_quantization=True)
    runner = model.runner
    views = {name: np.asarray(tensor.data) for name, tensor in runner.cache.items()}
    table = runner.pool.allocate(2)
    unpadded = runner.run([Work(table, 0, PROMPT[:40], rows=1)])[0]
    for view in views.values():
        view[runner.scratch] = 0
    steady = Steady(tokens=6, rows=3, most_tokens=80)
    padded = ModelRunner(runner.compiled, pool_bytes=POOL_BLOCKS * runner.layout.block_bytes, steady=steady)
    for tensor in padded.cache.values():
        np.asarray(tensor.data)[...] = 0
    rows = padded.run([Work(table, 0, PROMPT[:2], rows=1), Work([table[1]], 0, PROMPT[:1], rows=1)])
    assert [row.shape for row in rows] == [(1, unpadded.shape[1])] * 2
    for name, tensor in padded.cache.items():
        view = np.asarray(tensor.data).reshape(POOL_BLOCKS + 1, -1)
        written = set(np.flatnonzero(np.abs(view).max(1)).tolist())
        assert written == {*table, padded.scratch}, name  # the filler wrote its own block, past the pool's
    scheduler = PagedModel(padded).scheduler
    assert (scheduler.chunk_tokens, scheduler.step_tokens) == (40, 80)
    runner.pool.release(table)


UNPADDED_TOKEN_ROWS = Steady(token_rows=True)


def one_token_runner(model: PagedModel, *, steady: Steady = UNPADDED_TOKEN_ROWS) -> tuple[ModelRunner, list[int]]:
    """The main's runner with its rows as one-token sequences (ModelRunner.arranged), and the blocks of a prompt it
    read (four and a part)."""
    runner = ModelRunner(model.runner.compiled, pool_bytes=POOL_BLOCKS * model.runner.layout.block_bytes,
                         steady=steady)
    table = runner.pool.allocate(-(-len(PROMPT) // runner.block_tokens))
    runner.run([Work(table, 0, PROMPT, rows=1, token_rows=True)])
    return runner, table


def test_a_lone_one_token_step_gives_the_row_it_gives_beside_another_answers():
    """OpenVINO's PagedAttention kernel runs a step of one-token sequences, fewer than its threads, on a path of its
    own (`exec_loop_bhl`) that sums a context of several blocks otherwise than the path a verify takes: on the real main
    in bf16 (AMD EPYC Zen 4) a lone token's row parted from the verify's by up to 0.33, on the demo main here too. So a
    lone answer's token, where the main's tokens run as one-token sequences, gets the row it gets beside others. At
    the sizes the host's kernels need for that (padded on AVX2, as the engine serves it: ModelRunner.steady_rows)."""
    model = paged("main", dynamic_quantization=True)
    runner, table = one_token_runner(model, steady=model.runner.arranged(token_rows=True))
    lone = runner.run([Work(table, len(PROMPT), PROPOSALS[:1], rows=1, token_rows=True)])[0]
    beside = runner.run([Work(table, len(PROMPT), PROPOSALS[:1], rows=1, token_rows=True),
                         Work([runner.pool.allocate(1)[0]], 0, PROPOSALS, rows=1, token_rows=True)])[0]
    assert np.array_equal(lone, beside)


@pytest.mark.parametrize("threads", [1, 2, 4, 8])
def test_the_mains_one_token_steps_reach_the_kernel_as_a_step_of_the_verifys_path(threads):
    """For any number of the kernel's threads (a bigger host), a step of the main's one-token sequences reaches it
    with as many sequences as threads or with a sequence of two tokens, adding one filler at most; the main alone's
    2-token queries need none."""
    model = paged("main", dynamic_quantization=True)
    seen: list[list[Work]] = []

    def watched(runner: ModelRunner) -> ModelRunner:
        infer, runner.threads = runner._infer, threads
        runner._infer = lambda works, *rest: seen.append(works) or infer(works, *rest)  # type: ignore[method-assign]
        return runner

    one_token, table = one_token_runner(model)
    watched(one_token)
    for fed in range(1, 6):  # tokens of as many answers, or one answer's verify, as one-token sequences
        one_token.run([Work(table, len(PROMPT), PROPOSALS[:1], rows=1, token_rows=True)] * fed)
        parts = seen[-1]
        assert len(parts) >= threads or any(len(part.tokens) > 1 for part in parts), (fed, parts)
        assert len(parts) - fed <= 1 and sum(len(part.tokens) for part in parts) - fed <= 2  # one filler, 2 tokens
    queries = watched(ModelRunner(model.runner.compiled, pool_bytes=POOL_BLOCKS * model.runner.layout.block_bytes))
    queries.run([Work(queries.pool.allocate(5), len(PROMPT) - 1, PROPOSALS[:2], rows=1)])
    assert [len(part.tokens) for part in seen[-1]] == [2]


def preempting(preempt, work, *, enough) -> int:
    """Runs `work` in a thread, calling `preempt` every few milliseconds until it ends or `enough()` (a read preempted
    all along would never end): how many times it gave way."""
    gave_way = 0

    def running() -> None:
        nonlocal gave_way
        while True:
            try:
                return work()
            except Preempted:
                gave_way += 1

    worker = threading.Thread(target=running)
    worker.start()
    while worker.is_alive() and not enough():
        preempt()
        time.sleep(0.002)
    worker.join(60)
    assert not worker.is_alive()
    return gave_way


def test_an_inference_that_can_wait_gives_way_and_leaves_the_runner_as_it_was():
    """Work that can wait (the draft reading a conversation after its answer) is not run while its `yields_while`
    holds, and one under way is cancelled by `preempt`: the CPU plugin stops it, and the same work run again gives
    the rows of an inference nobody cancelled, bitwise. Work that does not yield is never cancelled."""
    model = paged("main", dynamic_quantization=True)
    runner = model.runner
    table = runner.pool.allocate(POOL_BLOCKS)
    prompt = (PROMPT * 4)[:POOL_BLOCKS * runner.block_tokens - 8]
    expected = runner.run([Work(table, 0, prompt, rows=2)])[0]
    with pytest.raises(Preempted):
        runner.run([Work(table, 0, prompt, rows=2)], yields_while=lambda: True)
    assert runner.gave_way == 1
    got: list[np.ndarray] = []
    yielding = lambda: got.append(runner.run([Work(table, 0, prompt, rows=2)], yields_while=lambda: False)[0])  # noqa: E731
    assert preempting(runner.preempt, yielding, enough=lambda: runner.gave_way > 1) == 1
    assert np.array_equal(got[0], expected)
    held: list[np.ndarray] = []
    holding = lambda: held.append(runner.run([Work(table, 0, prompt, rows=2)])[0])  # noqa: E731
    assert preempting(runner.preempt, holding, enough=lambda: False) == 0
    assert np.array_equal(held[0], expected)
    runner.pool.release(table)


def test_a_read_that_can_wait_gives_way_to_the_prompts_of_the_model_it_yields_to():
    """The draft's catch-up (a prefill given a `pause`) yields to the main's prompts (PagedModel.yield_to): its chunks
    do not start while the main reads one (one under way is cancelled as one starts: the test above), and each is
    read again after: the sequence ends as a read nobody interrupted, bitwise."""
    main = paged("main", dynamic_quantization=True)
    draft = paged("draft", dynamic_quantization=True, caching=False)  # each read whole
    draft.yield_to(main)
    prompt = (PROMPT * 4)[:POOL_BLOCKS * draft.pool.block_tokens - 8]
    steady = draft.sequence()
    expected = steady.prefill(prompt), steady.feed(PROPOSALS[:1])
    steady.close()

    caught_up, got = draft.sequence(), []
    steps = draft.scheduler.steps
    with main.reading_prompt():  # a user's prompt, being read as the catch-up starts
        # a `pause` that does not wait: the chunks themselves must give way while the prompt is read
        reading = threading.Thread(target=lambda: got.append(caught_up.prefill(prompt,
                                                                              pause=lambda: time.sleep(0.001))))
        reading.start()
        time.sleep(0.1)
        assert draft.scheduler.steps > steps and not got  # it asked, and gave way each time
    reading.join(60)
    assert caught_up.position == len(prompt)  # the chunks that gave way were read again
    assert np.array_equal(got[0], expected[0]) and np.array_equal(caught_up.feed(PROPOSALS[:1]), expected[1])
