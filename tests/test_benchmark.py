"""The benchmark on real parts, tiny runs: the command in-process and through a running stack
(websocket, SSE, concurrency), and a run started from the admin on the Celery worker. Figures are
checked for consistency, never against speed thresholds."""

import io
import json
import shutil
import statistics
import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.utils import timezone

from inference.benchmark import profile as profile_module
from inference.benchmark import report, runs
from inference.benchmark.inprocess import (
    OWN_PLAIN,
    PLAIN,
    InProcessPath,
    Variant,
    expected_tokens_per_step,
    k_variant,
    threshold_variant,
)
from inference.benchmark.prompts import Prompt
from inference.limits import Route
from inference.models import BenchmarkRun, Generation, HostCalibration, JobStatus, ModelPair
from inference.serving.host import this_host
from inference.serving.planning.choice import AS_FAST

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.database_agnostic]
TINY = ["--max-new-tokens", "16", "--repeats", "1", "--ks", "2", "--thresholds", "", "--prompts", "code",
        "--prompts-per-set", "1", "--sampled-ks", "2"]


def run_command(*args) -> str:
    out = io.StringIO()
    call_command("benchmark", "demo-code", *args, stdout=out)
    return out.getvalue()


def check_rows(results: dict, path: str) -> dict[str, dict]:
    """The path's rows, checked against the samples they summarize and against the theory."""
    rows = {r["variant"]: r for r in results["rows"] if r["path"] == path and not r["set"]}
    assert set(rows) == {"plain", "K=2"}
    samples = results["samples"][path]
    medians = {v: statistics.median(s["tokens_per_s"] for s in samples[v]) for v in rows}
    for variant, row in rows.items():
        assert row["tokens_per_s"] == pytest.approx(medians[variant])
        assert row["identical_to_plain"] is True, f"{path} {variant}: greedy speculation changed the text"
        assert all(s["tokens"] == 16 for s in samples[variant])
    k2 = rows["K=2"]
    assert k2["speedup"] == pytest.approx(medians["K=2"] / medians["plain"])
    assert 0 <= k2["acceptance_rate"] <= 1 and 1 <= k2["mean_accepted_length"] <= 3
    [sample] = samples["K=2"]  # one prompt, one repeat: the row's acceptance is this generation's
    assert k2["acceptance_rate"] == pytest.approx(sample["accepted"] / sample["proposed"])
    assert k2["theoretical_speedup"] == pytest.approx(  # Leviathan et al.
        expected_tokens_per_step(k2["acceptance_rate"], 2) / (1 + 2 * results["cost_ratio"]))
    assert k2["of_theoretical"] == pytest.approx(k2["speedup"] / k2["theoretical_speedup"])
    assert rows["plain"]["acceptance_rate"] is None and rows["plain"]["speedup"] == pytest.approx(1)
    return rows


def test_inprocess_benchmark_writes_json_table_plots_and_bars(demo_pair, tmp_path):
    printed = run_command(*TINY, "--no-stack", "--out", str(tmp_path))

    results = json.loads((tmp_path / "results.json").read_text())
    assert results["pair"] == "demo-code" and results["cost_ratio"] > 0
    check_rows(results, "inprocess")
    assert [r["set"] for r in results["by_set"]] == ["code", "code"]
    assert {p.name for p in tmp_path.glob("*.png")} == {"speedup_vs_k.png", "latency.png"}
    assert all((tmp_path / p).read_bytes()[:4] == b"\x89PNG" for p in ("speedup_vs_k.png", "latency.png"))
    markdown = (tmp_path / "results.md").read_text()
    assert "| inprocess | K=2 |" in markdown and "![speedup_vs_k.png](speedup_vs_k.png)" in markdown
    # Without a stack: theory, speedup, acceptance and identity bars, each with PASS/MISS and by how much.
    theory, speedup, acceptance, identity = results["bars"]
    assert theory["bar"].startswith("best K (K=2") and theory["passed"] == (theory["measured"] >= 0.8)
    assert speedup["passed"] == (speedup["measured"] >= 1.5) and acceptance["passed"] == (acceptance["measured"] >= 0.6)
    assert identity["measured"] == 0 and identity["passed"]  # greedy speculative text equals the main alone's
    for bar in results["bars"]:
        assert report.bar_line(bar) in printed
    assert "margin" in printed or "missed by" in printed
    assert "inprocess" in printed and "K=2" in printed
    run = BenchmarkRun.objects.get(pair=demo_pair)
    assert run.status == "finished" and run.results["rows"] == results["rows"]
    # Sampled rows: the main alone and the own engine at T=0.8, and which one a lone request gets.
    sampled = {r["variant"]: r for r in results["sampled"]}
    chosen_k = demo_pair.num_assistant_tokens  # no measured profile yet: the pair's default
    assert set(sampled) == {"T=0.8 plain", "T=0.8 K=2", f"T=0.8 K={chosen_k}"}
    assert sampled["T=0.8 plain"]["speedup"] == 1 and sampled["T=0.8 K=2"]["acceptance_rate"] is not None
    assert [name for name, r in sampled.items() if r["chosen"]] == [f"T=0.8 K={chosen_k}"]
    assert "Sampled (T=0.8)" in printed and "Sampled (T = 0.8)" in markdown


def test_a_calibrated_host_measures_each_engine_as_it_serves_it(demo_pair):
    """The baseline is the main alone in the configuration the host measured fastest, and the sampled rows run on
    the own engine in the one it is served in (int8 activations), not in the pair's registered precision: a slower
    engine than its users get would understate what speculative sampling buys."""
    HostCalibration.objects.create(pair=demo_pair, host=this_host(demo_pair.runs_on).signature,
                                   status=JobStatus.FINISHED, finished_at=timezone.now(),
                                   results={"fastest": "defaults", "own_config": "f32-dynamic", "best_k": {"1": 2}})
    engines, note = runs.benchmark_engines(pair=demo_pair)
    try:
        alone = engines.for_variant(PLAIN).spec
        sampled = engines.for_variant(Variant("T=0.8 K=2", True, num_assistant_tokens=2, temperature=0.8)).spec
        greedy = engines.for_variant(k_variant(2)).spec  # the pair's lone answers run on the library's pipeline
    finally:
        engines.close()
    assert "fastest configuration (the device's defaults)" in note and "the library's speculative pipeline" in note
    assert (alone.inference_precision, alone.route.is_own_engine()) == ("", False)
    assert sampled.route.is_own_engine() and sampled.dynamic_quantization and sampled.inference_precision == "f32"
    assert not sampled.prefix_caching  # every answer prefills, as the main alone's: the prompts repeat
    assert not greedy.route.is_own_engine()

    demo_pair.own_engine_streams = 1  # lone answers on the own engine: the K lines measure it, thresholds stay
    engines, note = runs.benchmark_engines(pair=demo_pair)
    try:
        greedy = engines.for_variant(k_variant(2)).spec
        threshold = engines.for_variant(threshold_variant(0.5)).spec
        path, prompt = InProcessPath(engines), Prompt("def fizzbuzz(n):")
        own_alone, with_draft = (path.run(prompt=prompt, variant=v, max_new_tokens=16) for v in (OWN_PLAIN, k_variant(2)))
    finally:
        engines.close()
    assert "the K lines run on the own engine" in note
    assert greedy.route.is_own_engine() and greedy.dynamic_quantization and not threshold.route.is_own_engine()
    # The own engine's lines are compared with its own main alone (K=0 there), which says where it ran.
    assert (own_alone.route, with_draft.route) == (Route.OWN_MAIN_ALONE, Route.OWN_SPECULATIVE)
    assert own_alone.accepted in (0, None) and own_alone.text == with_draft.text


def test_stack_benchmark_through_websocket_and_sse(demo_pair, celery_worker, live_server_url, tmp_path):
    printed = run_command(*TINY, "--url", live_server_url, "--stack-ks", "2", "--concurrency", "1,2", "--steady-rounds", "2",
                          "--out", str(tmp_path))

    results = json.loads((tmp_path / "results.json").read_text())
    for path in ("inprocess", "websocket", "sse"):
        check_rows(results, path)
    stack = [r for r in results["rows"] if r["path"] != "inprocess"]
    inprocess = {r["variant"]: r for r in results["rows"] if r["path"] == "inprocess"}
    for row in stack:
        base = inprocess[row["variant"]]
        inprocess_ttft = {(s["prompt"], s["repeat"]): s["ttft_ms"] for s in results["samples"]["inprocess"][row["variant"]]}
        assert row["tokens_per_s_vs_inprocess"] == pytest.approx(row["tokens_per_s"] / base["tokens_per_s"])
        added = [sample["ttft_ms"] - inprocess_ttft[sample["prompt"], sample["repeat"]]  # same prompt and repeat
                 for sample in results["samples"][row["path"]][row["variant"]]]
        assert row["ttft_added_ms_p50"] == pytest.approx(statistics.median(added))
    concurrency = {(r["variant"], r["concurrency"]): r for r in results["concurrency"]}
    # Three lines: the main alone, the fixed K, and requests that name no K (the worker plans theirs).
    assert set(concurrency) == {(variant, level) for variant in ("plain", "K=2", "adaptive") for level in (1, 2)}
    assert all(r["lost"] == 0 and r["failed"] == 0 for r in concurrency.values())
    assert all(b["completed"] == b["concurrency"] for b in results["concurrency_bursts"])
    assert concurrency[("K=2", 2)]["speedup"] == pytest.approx(
        concurrency[("K=2", 2)]["throughput"] / concurrency[("plain", 2)]["throughput"])
    assert concurrency[("plain", 1)]["scaling"] == pytest.approx(1)
    names = {b["bar"] for b in results["bars"]}
    assert "websocket K=2: speedup vs the speedup in-process" in names
    assert "lost or failed streams in the concurrency sweep" in names
    assert (tmp_path / "speedup_vs_concurrency.png").is_file()
    assert "Concurrency (sse)" in printed
    # Steady load: the same levels, requests arriving while others run, TTFT against one stream's.
    steady = {(r["variant"], r["concurrency"]): r for r in results["steady"]}
    assert set(steady) == set(concurrency)
    assert all(r["requests"] >= 1 and r["ttft_ms_p50"] > 0 and r["failed"] == 0 for r in steady.values())
    assert steady[("K=2", 1)]["ttft_vs_one"] == pytest.approx(1)
    assert "K=2: TTFT p50 at a steady 2 streams vs 1 stream" not in names  # the bar is at 4 and 8 streams
    assert "Steady load: requests arrive while others run (sse, 2 answers per client)" in printed
    # Where the time to first token goes, at one stream per path and under each burst.
    split = {r["path"]: r for r in results["ttft_profile"]}
    assert {"websocket", "sse", "sse, 2 at once, plain", "sse, 2 at once, K=2"} <= set(split)
    assert split["sse, 2 at once, K=2"]["samples"] == 2
    for row in split.values():
        assert row["web_ms_p50"] > 0 and row["queue_ms_p50"] > 0 and row["engine_ms_p50"] > 0
    # The benchmark's credentials are gone afterwards.
    from inference.models import ApiKey

    assert not ApiKey.objects.filter(name="benchmark").exists()


def test_another_openai_compatible_server_side_by_side(demo_pair, celery_worker, live_server_url, api_key, tmp_path):
    """The peer here is this same stack through its OpenAI API (the only such server on this machine): asked
    with the benchmark's settings it serves the main alone, so its texts must equal the main alone's."""
    peer = ["--compare-url", live_server_url, "--compare-model", "demo-code", "--compare-key", api_key.secret]
    with pytest.raises(CommandError, match="--compare-model"):
        run_command(*TINY, "--no-stack", "--compare-url", live_server_url)
    with pytest.raises(CommandError, match="drop --no-stack"):
        run_command(*TINY, "--no-stack", *peer)

    printed = run_command(*TINY, "--url", live_server_url, "--clients", "sse", "--stack-ks", "2", "--concurrency", "1,2",
                          "--steady-rounds", "0", *peer, "--out", str(tmp_path))

    results = json.loads((tmp_path / "results.json").read_text())
    [one_stream] = [r for r in results["rows"] if r["path"] == "peer" and not r["set"]]
    assert one_stream["identical_to_plain"] is True  # the same requests, greedy: the main alone's texts
    assert all(s["tokens"] == 16 for s in results["samples"]["peer"]["peer"])
    concurrency = {(r["variant"], r["concurrency"]): r for r in results["concurrency"]}
    rows = {r["concurrency"]: r for r in results["peer"]["side_by_side"]}
    assert set(rows) == {1, 2} and results["peer"]["model"] == "demo-code"
    for level, row in rows.items():
        assert row["shipped"] == concurrency[("adaptive", level)]["throughput"]
        assert row["peer"] == concurrency[("peer", level)]["throughput"] and row["peer_lost_or_failed"] == 0
        assert row["ratio"] == pytest.approx(row["shipped"] / row["peer"])
    [bar] = [b for b in results["bars"] if b["bar"].startswith("as it ships vs demo-code")]
    assert bar["bar"].endswith("at 1 stream(s)") and bar["measured"] == pytest.approx(rows[1]["ratio"])
    assert f"Beside demo-code at {live_server_url}" in printed
    assert f"### Beside demo-code at {live_server_url}" in (tmp_path / "results.md").read_text()


def test_conversations_beside_two_named_peers(demo_pair, celery_worker, live_server_url, api_key, tmp_path):
    """A pasted file and a follow-up, on every line: as it ships, `speculative: false` and two peers named on the
    command line (llama-server's main alone and its ngram-mod, as users compare; here this same stack twice). Each
    line's rate is set against `speculative: false` and against each peer, and the follow-up reads the first turn
    from the cache on SpecChat's lines."""
    demo_pair.own_engine_streams = 1  # lone answers on the own engine, whose blocks the pool keeps
    demo_pair.save()
    paste = "\n".join(f"def step_{n}(state, value):\n    state[{n}] = value * {n}\n    return state" for n in range(12))
    chats = tmp_path / "chats.json"
    chats.write_text(json.dumps([{"name": "paste", "system": "You edit code.",
                                  "turns": [f"{paste}\n\nAdd a docstring to step_3.", "Now add type hints."]}]))
    conversations = ["--conversations", str(chats), "--conversations-only", "--conversation-repeats", "1",
                     "--conversation-tokens", "12", "--url", live_server_url, "--out", str(tmp_path)]
    with pytest.raises(CommandError, match="a label of their own"):
        run_command(*conversations, "--compare-url", live_server_url, "--compare-url", f"b={live_server_url}",
                    "--compare-model", "demo-code")
    with pytest.raises(CommandError, match="compares with one --compare-url"):
        run_command(*TINY, "--url", live_server_url, "--compare-url", f"a={live_server_url}",
                    "--compare-url", f"b={live_server_url}", "--compare-model", "demo-code")

    printed = run_command(*conversations, "--compare-url", f"main={live_server_url}",
                          "--compare-url", f"ngram-mod={live_server_url}", "--compare-model", "demo-code",
                          "--compare-key", api_key.secret)

    summary = {s["line"]: s for s in json.loads((tmp_path / "conversations.json").read_text())["summary"]}
    assert set(summary) == {"as it ships", "speculative: false", "peer main", "peer ngram-mod"}
    assert all(s["turns"] == 2 for s in summary.values())
    assert summary["as it ships"]["cached_share"] > 0.5 and summary["speculative: false"]["cached_share"] > 0.5
    assert "vs `speculative: false` | vs `peer main` | vs `peer ngram-mod` |" in printed
    assert f"peer main {live_server_url} (demo-code)" in printed


def test_back_in_a_conversation_after_chats_away_its_prompt_comes_from_the_cache(demo_pair, celery_worker,
                                                                                live_server_url, tmp_path):
    """--come-back-after: before a conversation's last turn the user opens other chats, each a paste under a system
    prompt of its own; the turn they come back with still reads the conversation from the pool, on both lines. The
    chats away are listed per turn, out of the lines' figures."""
    demo_pair.own_engine_streams = 1
    demo_pair.save()
    paste = "\n".join(f"def step_{n}(state, value):\n    state[{n}] = value * {n}\n    return state" for n in range(12))
    chats = tmp_path / "chats.json"
    chats.write_text(json.dumps([{"name": "paste", "system": "You edit code.",
                                  "turns": [f"{paste}\n\nAdd a docstring to step_3.", "Why?", "Now add type hints."]}]))
    for negative in ("--think-s", "--conversations-apart-s"):
        with pytest.raises(CommandError, match="--think-s and --conversations-apart-s 0 or more"):
            run_command("--conversations", str(chats), "--conversations-only", negative, "-1", "--url", live_server_url)
    printed = run_command("--conversations", str(chats), "--conversations-only", "--conversation-repeats", "1",
                          "--conversation-tokens", "8", "--come-back-after", "2", "--url", live_server_url,
                          "--out", str(tmp_path))

    report = json.loads((tmp_path / "conversations.json").read_text())
    summary = {s["line"]: s for s in report["summary"]}
    assert set(summary) == {"as it ships", "speculative: false"}
    for line, figures in summary.items():
        assert figures["turns"] == 3, figures
        assert figures["came_back_cached_share"] > 0.8, figures
        away = [turn for turn in report["turns"] if turn["line"] == line and turn["away"]]
        assert len(away) == 2 and all(turn["cached_tokens"] == 0 for turn in away), away
    assert "back after the chats away: first token (from the cache)" in printed
    assert "after 2 chats away" in printed
    assert "(a chat away)" in (tmp_path / "conversations.md").read_text()


def test_admin_starts_a_benchmark_on_the_worker_and_shows_it(demo_pair, celery_worker, django_user_model):
    admin_user = django_user_model.objects.create_superuser("root", "root@example.com", "root-password")
    client = Client()
    client.force_login(admin_user)
    changelist = "/admin/inference/modelpair/"
    form_page = client.post(changelist, {"action": "run_benchmark", "_selected_action": [demo_pair.pk]})
    assert form_page.status_code == 200 and b'name="max_new_tokens"' in form_page.content
    bad = client.post(changelist, {"action": "run_benchmark", "_selected_action": [demo_pair.pk], "apply": "1",
                                   "max_new_tokens": "16", "repeats": "1", "ks": "two", "prompts_per_set": "1"})
    assert bad.status_code == 200 and b"Invalid options" in bad.content and not BenchmarkRun.objects.exists()

    client.post(changelist, {"action": "run_benchmark", "_selected_action": [demo_pair.pk], "apply": "1",
                             "max_new_tokens": "16", "repeats": "1", "ks": "2", "thresholds": "",
                             "prompts_per_set": "1"})
    run = BenchmarkRun.objects.get(pair=demo_pair)
    deadline = time.time() + 120
    while run.status in ("queued", "running") and time.time() < deadline:
        time.sleep(0.5)
        run.refresh_from_db()
    assert run.status == "finished", run.error
    try:
        assert {r["variant"] for r in run.results["rows"]} == {"plain", "K=2"}
        page = client.get(f"/admin/inference/modelpair/{demo_pair.pk}/change/").content.decode()
        assert "Latest benchmark" in page and "<td>K=2</td>" in page
        plot = f"/admin/inference/benchmarkrun/{run.id}/plot/speedup_vs_k.png"
        assert plot in page
        image = client.get(plot)
        assert image.status_code == 200 and image["Content-Type"] == "image/png"
        assert client.get(f"/admin/inference/benchmarkrun/{run.id}/plot/results.json").status_code == 404
        assert Client().get(plot).status_code == 302  # the admin's login, not the file
    finally:
        shutil.rmtree(run.report_dir, ignore_errors=True)


def test_profile_stores_the_best_k_per_load_and_checks_the_adaptive_line(demo_pair, celery_worker, live_server_url):
    demo_pair.speculation_profile = {}
    demo_pair.save()
    with pytest.raises(CommandError, match="no stored profile"):
        call_command("profile_pair", "demo-code", "--url", live_server_url, "--validate-only")
    out = io.StringIO()  # the prose set's eight prompts, not the code set's twelve: the rule is tested, not the pair
    call_command("profile_pair", "demo-code", "--url", live_server_url, "--levels", "1,2", "--ks", "2,3",
                 "--max-new-tokens", "12", "--greedy-only", "--prompts", "prose", stdout=out)
    printed = out.getvalue()

    demo_pair.refresh_from_db()
    profile = demo_pair.speculation_profile["greedy"]
    assert set(profile) == {"1", "2"} and all(k in (0, 2, 3) for k in profile.values())
    run = demo_pair.profile_run
    rows = run.results["sweeps"]["greedy"]["rows"]
    for level, k in profile.items():  # of Ks that clearly beat the main alone, the smallest as fast as the fastest
        at_level = {int(r["variant"].removeprefix("K=")): r["throughput"] for r in rows
                    if r["concurrency"] == int(level) and r["variant"] != "plain"}
        plain = next(r["throughput"] for r in rows if r["concurrency"] == int(level) and r["variant"] == "plain")
        winning = {ks: rate for ks, rate in at_level.items() if rate >= profile_module.MARGIN_OVER_PLAIN * plain}
        as_fast = [ks for ks, rate in winning.items() if rate >= AS_FAST * max(winning.values())]
        assert k == (min(as_fast) if winning else 0), (level, at_level, plain)
    lines = {(r["variant"], r["concurrency"]) for r in run.results["lines"]["greedy"]}
    fixed = run.results["sweeps"]["greedy"]["best_fixed_k"]
    assert lines == {(v, c) for v in ("plain", f"K={fixed}", "adaptive") for c in (1, 2)}
    assert all(r["lost"] == 0 and r["failed"] == 0 for r in run.results["lines"]["greedy"])
    served = {(r["variant"], r["concurrency"]): r["paths"] for r in run.results["lines"]["greedy"]}
    assert set(served[("plain", 2)]) == {"plain"} and set(served[(f"K={fixed}", 2)]) == {f"K={fixed}"}
    for level in (1, 2):  # every line asked the same requests: every prompt, `level` at a time
        assert len({sum(served[variant, level].values()) for variant in ("plain", f"K={fixed}", "adaptive")}) == 1
    assert {b["verdict"] for b in run.results["bars"]} <= {"pass", "same path", "miss"}
    assert "main alone / best fixed K / adaptive" in printed and "streams: plain" in printed
    assert "adaptive served: " in printed
    adaptive = Generation.objects.filter(params__asked__k=None, params__asked__speculative=True)
    assert adaptive.exists() and all("measured" in g.speculative_reason or g.speculative_mode == "off"
                                     for g in adaptive)

    runs = BenchmarkRun.objects.count()  # checking the stored profile again measures no new one
    again = io.StringIO()
    call_command("profile_pair", "demo-code", "--url", live_server_url, "--levels", "1,2", "--max-new-tokens", "12",
                 "--greedy-only", "--prompts", "prose", "--validate-only", stdout=again)
    demo_pair.refresh_from_db()
    assert demo_pair.speculation_profile["greedy"] == profile and BenchmarkRun.objects.count() == runs
    assert again.getvalue().count("streams: plain") == 2


def test_own_prompts_from_a_file_and_from_the_pairs_history(demo_pair, tmp_path):
    """--prompts-file (JSON Lines: plain and chat items) and --from-history (the prompts recorded for
    the pair, as its worker got them) replace the repository's sets; a bad file is a clear error."""
    own = tmp_path / "mine.jsonl"
    own.write_text('"def area(radius):"\n{"messages": [{"role": "user", "content": "def mean(values):"}]}\n')
    run_command(*TINY, "--no-stack", "--sampled-ks", "", "--out", str(tmp_path / "file"), "--prompts-file", str(own))
    results = json.loads((tmp_path / "file" / "results.json").read_text())
    assert results["prompts"] == 2 and results["prompt_sets"] == ["mine"]
    assert {s["prompt"] for s in results["samples"]["inprocess"]["plain"]} >= {"def area(radius):"}
    assert all("repeated_4gram_share" in row for row in results["rows"])

    for text in ("class Queue:", "def area(radius):", "class Queue:"):
        Generation.objects.create(pair=demo_pair, prompt=text, status=Generation.Status.FINISHED)
    run_command(*TINY, "--no-stack", "--sampled-ks", "", "--out", str(tmp_path / "history"), "--from-history", "5")
    replayed = json.loads((tmp_path / "history" / "results.json").read_text())
    assert replayed["prompt_sets"] == ["history"] and replayed["prompts"] == 2  # distinct prompts, newest first
    # Users' prompts are not copied into result files or kept runs, which outlive the history's retention.
    digests = [s["prompt"] for s in replayed["samples"]["inprocess"]["plain"]]
    assert len(set(digests)) == 2 and all(d.startswith("sha256:") for d in digests)
    kept = json.dumps(BenchmarkRun.objects.latest("id").results) + (tmp_path / "history" / "results.md").read_text()
    assert "class Queue" not in kept + (tmp_path / "history" / "results.json").read_text() and "def area" not in kept

    bad = tmp_path / "bad.json"
    for content, message in (("[]", "no prompts"), ('[{"text": "x"}]', "item 1"), ("{oops", "not JSON")):
        bad.write_text(content)
        with pytest.raises(CommandError, match=message):
            run_command(*TINY, "--no-stack", "--prompts-file", str(bad))
    with pytest.raises(CommandError, match="no recorded prompts"):
        Generation.objects.all().delete()
        run_command(*TINY, "--no-stack", "--from-history", "3")


def test_a_profile_measured_under_a_steady_load(demo_pair, celery_worker, live_server_url):
    """--load steady: N clients that ask again as each answer ends, the throughput of a cell from the
    answers counted while all were in their loop, and the validation's lines under the same load."""
    out = io.StringIO()
    call_command("profile_pair", "demo-code", "--url", live_server_url, "--levels", "1,2", "--ks", "2",
                 "--max-new-tokens", "12", "--greedy-only", "--prompts", "prose", "--load", "steady", "--rounds", "3",
                 "--repeats", "2", stdout=out)
    demo_pair.refresh_from_db()
    run = demo_pair.profile_run
    assert run.results["options"]["load"] == "steady"
    assert set(demo_pair.speculation_profile["greedy"]) == {"1", "2"}
    for rows in (run.results["sweeps"]["greedy"]["rows"], run.results["lines"]["greedy"]):
        assert {r["concurrency"] for r in rows} == {1, 2}
        for row in rows:
            assert row["requests"] >= 2 and row["failed"] == 0 and row["throughput"] > 0
            assert len(row["throughput_by_repeat"]) == 2  # one window per repeat, paired in the bars
            assert sum(row["paths"].values()) == row["requests"]  # every counted answer names its path
    served = {(r["variant"], r["concurrency"]): r["paths"] for r in run.results["lines"]["greedy"]}
    assert set(served[("plain", 2)]) == {"plain"} and set(served[("K=2", 2)]) == {"K=2"}
    assert out.getvalue().count("adaptive served: ") == 2


@pytest.mark.parametrize("stop_signal", ["TERM", "STOP"])
def test_a_holder_stopped_between_two_turns_hands_the_next_to_the_other_worker(demo_pair, stack_env, monkeypatch,
                                                                               tmp_path, stop_signal):
    """--stop-holder-after-turn on the benchmark's own two workers: the worker that served a conversation's turn is
    stopped as systemd stops a service (TERM) or frozen (STOP: hung, or killed where its process cannot be seen) and
    the next turn is sent at once. It is answered whole by the other worker on both lines (the holder is started
    again in between), and the report names it apart from the follow-ups."""
    pair = ModelPair.objects.create(name="Stopped", slug="stopped", main_dir=demo_pair.main_dir,
                                    draft_dir=demo_pair.draft_dir, num_assistant_tokens=3, own_engine_streams=4)
    for name, value in stack_env.items():  # the benchmark's workers and daphne run on the test database and Redis
        monkeypatch.setenv(name, value)
    paste = "\n".join(f"def step_{n}(state, value):\n    state[{n}] = value * {n}\n    return state" for n in range(12))
    chats = tmp_path / "chats.json"
    chats.write_text(json.dumps([{"name": "paste", "system": "You edit code.",
                                  "turns": [f"{paste}\n\nAdd a docstring to step_3.", "Why?", "Now add type hints."]}]))
    conversations = ["--conversations", str(chats), "--conversations-only", "--conversation-repeats", "1",
                     "--conversation-tokens", "8", "--out", str(tmp_path)]
    with pytest.raises(CommandError, match="needs --workers 2 or more"):
        call_command("benchmark", pair.slug, *conversations, "--stop-holder-after-turn", "1")

    out = io.StringIO()
    call_command("benchmark", pair.slug, *conversations, "--workers", "2", "--stop-holder-after-turn", "1",
                 "--stop-signal", stop_signal, stdout=out)

    report = json.loads((tmp_path / "conversations.json").read_text())
    summary = {s["line"]: s for s in report["summary"]}
    assert set(summary) == {"as it ships", "speculative: false"}
    for line, figures in summary.items():
        turns = [turn for turn in report["turns"] if turn["line"] == line]
        assert [turn["tokens"] for turn in turns] == [8, 8, 8], turns  # nothing lost, no error
        first, follow_up, after = turns
        assert follow_up["worker"] == first["worker"] and follow_up["cached_tokens"] > 0  # routed to its holder
        assert after["after_stop"] == follow_up["worker"] != after["worker"], after
        assert figures["after_stop_elsewhere"] == "1 of 1" and figures["after_stop_ttft_s"] == after["ttft_s"]
    assert "its holder stopped: first token" in out.getvalue()
    assert f"stopped (SIG{stop_signal}) after turn 1" in out.getvalue()
    assert "(its holder stopped)" in (tmp_path / "conversations.md").read_text()
