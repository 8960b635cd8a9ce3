"""The script behind docs/speculation.md's "Speculating under load": what several answers speculating in one batch
would cost on this host, before anyone builds it. Today the second answer moves every answer to the main alone's
batch (engines/own/batch.py), because answers speculating side by side each run their own inferences on the same two
cores. This times, in the own engine's configuration on this host (raw OpenVINO, the stateful IRs as it steps them):

- the main: one inference of n = 1..4 tokens for 1, 2 and 4 answers at once (a batch of that many rows), the
  verify a step of K = n - 1 would cost for all of them;
- the draft (its head cut, its served format): one token for 1, 2 and 4 answers as one batch, and the same answers
  each on its own infer request in its own thread, at once (as answers speculating side by side run today);

and prices a batched step by the arithmetic of docs/speculation.md at the acceptance given: each answer gets
(1 - a^(K+1)) / (1 - a) tokens for one main inference of K+1 tokens a row and K draft inferences of one token a row.
Last, how far a row of the main's batch is from the same tokens on a cache of their own (docs/exactness.md), with and
without the CPU's dynamic quantization: rows of the main alone (a token a step) and rows speculating (three tokens a
step, some masked as rejected), one row in the batch and two.

Usage: DJANGO_SETTINGS_MODULE=chatsite.settings python batch_costs.py PAIR [ACCEPTANCE]"""
import sys
import threading
import time
from statistics import median

import django

django.setup()

import numpy as np  # noqa: E402
import openvino as ov  # noqa: E402
from inference.engines.prefill import PrefillCache  # noqa: E402

from inference.benchmark.modes import infer_cost  # noqa: E402
from inference.engines.own.batch import SharedBatch  # noqa: E402
from inference.engines.own.draft_head import compile_draft  # noqa: E402
from inference.engines.own.kv_cache import KvSequence  # noqa: E402
from inference.engines.own.stepped_model import read_stepped, step_inputs  # noqa: E402
from inference.limits import Route  # noqa: E402
from inference.models import ModelPair  # noqa: E402
from inference.serving.calibrated import host_figures  # noqa: E402
from inference.serving.host import this_host  # noqa: E402
from inference.serving.records import pair_spec  # noqa: E402

SLUG = sys.argv[1]
ACCEPTANCE = float(sys.argv[2]) if len(sys.argv) > 2 else 0.75
ANSWERS, SIZES, CONTEXT, TOKENS = (1, 2, 4), (1, 2, 3, 4), 256, 16

pair = ModelPair.objects.get(slug=SLUG)
host = this_host(pair.runs_on)
spec = pair_spec(pair=pair, route=Route.OWN_SPECULATIVE, calibration=host_figures(pair=pair, host=host))
print(f"{host.described}; main {spec.device_properties(device=spec.device)}, draft {spec.draft_dir}")

main_ms = {answers: infer_cost(main_dir=spec.main_dir, props=spec.device_properties(device=spec.device),
                               device=spec.device, sizes=SIZES, context=CONTEXT, repeats=12, rows=answers)
           for answers in ANSWERS}

core = ov.Core()
draft, _ = compile_draft(core, draft_dir=spec.draft_dir, head_ids=spec.draft_head_ids, device=spec.draft_runs_on,
                         properties=spec.device_properties(device=spec.draft_runs_on))


def warm_request(answers: int) -> ov.InferRequest:
    request = draft.create_infer_request()
    request.infer(step_inputs(np.full((answers, CONTEXT), 100, np.int64),
                              positions=np.tile(np.arange(CONTEXT), (answers, 1)),
                              attention_mask=np.ones((answers, CONTEXT), np.int64), rows=1))
    return request


def draft_tokens(request: ov.InferRequest, answers: int, out: list[float]) -> None:
    for index in range(TOKENS):
        slots = CONTEXT + index
        began = time.perf_counter()
        request.infer(step_inputs(np.full((answers, 1), 101, np.int64), positions=np.full((answers, 1), slots),
                                  attention_mask=np.ones((answers, slots + 1), np.int64), rows=1))
        out.append(time.perf_counter() - began)


def side_by_side_ms(answers: int) -> float:
    """A token for each of `answers` answers, each on its own request in its own thread: wall time a token."""
    requests, outs = [warm_request(1) for _ in range(answers)], [[] for _ in range(answers)]
    threads = [threading.Thread(target=draft_tokens, args=(request, 1, out))
               for request, out in zip(requests, outs, strict=True)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return (time.perf_counter() - began) / TOKENS * 1000


draft_ms: dict[int, dict[str, float]] = {answers: {"batched": [], "side by side": []} for answers in ANSWERS}
for _ in range(2):  # interleaved: the host drifts
    for answers in ANSWERS:
        out: list[float] = []
        draft_tokens(warm_request(answers), answers, out)
        draft_ms[answers]["batched"].append(median(out[1:]) * 1000)
        draft_ms[answers]["side by side"].append(side_by_side_ms(answers))

print("\nThe main: one inference of n tokens a row, ms (x the same answers' one token)")
print("| answers | " + " | ".join(f"n={n}" for n in SIZES) + " |\n| ---: |" + " ---: |" * len(SIZES))
for answers, costs in main_ms.items():
    print(f"| {answers} | " + " | ".join(f"{ms:.1f} ({ms / costs[1]:.2f}x)" for ms in costs.values()) + " |")
print("\nThe draft: one token for every answer, ms")
print("| answers | one batch | each on its own request, at once |\n| ---: | ---: | ---: |")
for answers, lines in draft_ms.items():
    print(f"| {answers} | {min(lines['batched']):.1f} | {min(lines['side by side']):.1f} |")
print(f"\nA batched step at acceptance {ACCEPTANCE} against the main alone's batch of as many answers "
      "(tokens a second, x):")
print("| answers | " + " | ".join(f"K={n - 1}" for n in SIZES[1:]) + " |\n| ---: |" + " ---: |" * (len(SIZES) - 1))
for answers, costs in main_ms.items():
    ratios = []
    for n in SIZES[1:]:
        tokens = answers * (1 - ACCEPTANCE ** n) / (1 - ACCEPTANCE)
        step_ms = costs[n] + (n - 1) * min(draft_ms[answers]["batched"])
        ratios.append(f"{tokens / step_ms / (answers / costs[1]):.2f}x")
    print(f"| {answers} | " + " | ".join(ratios) + " |")


def largest_deviation(main: ov.CompiledModel, *, rows: int, fed: int) -> tuple[float, float]:
    """Median and largest |logit difference| between rows of a batch, each prefilled and then fed `fed` random tokens a
    step, keeping a random share of them, and the same tokens fed the same way on a cache of their own."""
    batch, got = SharedBatch(main, prompts=PrefillCache(kept_tokens=0)), {}

    def run(index: int) -> None:
        rng, row = np.random.default_rng(index), batch.row()
        prompt = rng.integers(100, 20_000, 60 - 15 * index).tolist()
        row.feed(prompt)
        steps = []  # each step's kept tokens and their rows of logits
        for _ in range(20):
            tokens = rng.integers(100, 20_000, fed).tolist()
            logits = row.feed(tokens)
            kept = int(rng.integers(0, fed + 1)) if fed > 1 else 1
            steps.append((tokens[:kept], logits[:kept].copy()))
            row.drop_last(fed - kept)
        got[index] = (prompt, steps)
        row.close()

    threads = [threading.Thread(target=run, args=(index,)) for index in range(rows)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    gaps = []
    for prompt, steps in got.values():
        alone = KvSequence(main, cut_rejected=True)
        alone.feed(prompt)
        for kept, logits in steps:
            if kept:
                gaps.append(float(np.abs(alone.feed(kept) - logits).max()))
    return float(np.median(gaps)), max(gaps)


print("\nA row of the main's batch against its own cache, |logit difference| median / largest")
print("| main compiled | rows | the main alone (a token a step) | speculating (3 a step, some rejected) |")
print("| --- | ---: | ---: | ---: |")
for label, extra in (("as served", {}), ("no dynamic quantization", {"DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"})):
    compiled = core.compile_model(read_stepped(core, spec.main_dir), spec.device,
                                  {**spec.device_properties(device=spec.device), **extra})
    for answers in (1, 2):
        cells = [largest_deviation(compiled, rows=answers, fed=fed) for fed in (1, 3)]
        print(f"| {label} | {answers} | " + " | ".join(f"{m:.1e} / {x:.1e}" for m, x in cells) + " |")
