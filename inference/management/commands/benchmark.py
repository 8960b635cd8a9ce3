import os
import signal
from contextlib import closing, nullcontext, suppress
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from inference import errors
from inference.api.ids import AnswerIdConverter
from inference.benchmark import conversation, records, report, runs
from inference.benchmark.peer import PeerServer
from inference.benchmark.prompts import Prompt, prompts_from_file
from inference.benchmark.servers import StackError, check_served, local_stack, local_workers, stack_credentials
from inference.benchmark.stack import StackTarget, StreamError
from inference.models import Generation, ModelPair
from inference.serving.host import this_host
from inference.serving.web import chat_prompt


def name_list(text: str) -> tuple[str, ...]:
    return tuple(filter(None, text.split(",")))


class Command(BaseCommand):
    help = ("Benchmark a pair: in-process main alone vs with its draft over K and the confidence threshold, the same "
            "through the websocket and SSE of a running stack, and a concurrency sweep; writes results.json, "
            "results.md and PNG plots, prints the table and the bars.")

    def add_arguments(self, parser):
        defaults = runs.BenchmarkOptions()
        parser.add_argument("pair", help="the pair's slug")
        parser.add_argument("--max-new-tokens", type=int, default=defaults.max_new_tokens)
        parser.add_argument("--repeats", type=int, default=defaults.repeats)
        parser.add_argument("--ks", type=runs.int_list, default=defaults.ks,
                            help="K values in-process, e.g. 1-8 or 2,4")
        parser.add_argument("--thresholds", type=runs.float_list, default=defaults.thresholds,
                            help="confidence thresholds in-process, e.g. 0.3,0.5 (empty: none)")
        parser.add_argument("--prompts", type=name_list, default=defaults.prompt_sets,
                            help="held-out prompt sets (inference/prompts/heldout.json)")
        parser.add_argument("--prompts-per-set", type=int, default=defaults.prompts_per_set)
        parser.add_argument("--prompts-file", type=Path,
                            help="your own prompts instead: a JSON list or JSON Lines of strings, {\"prompt\": ...} "
                                 "or {\"messages\": [...]} (rendered with the pair's chat template)")
        parser.add_argument("--from-history", type=int, metavar="N",
                            help="replay the last N distinct prompts recorded for the pair (chat and API) instead")
        parser.add_argument("--clients", type=name_list, default=defaults.clients,
                            help="stack clients: websocket,sse")
        parser.add_argument("--stack-ks", type=runs.int_list, default=defaults.stack_ks,
                            help="K values through the stack (default: the pair's own)")
        parser.add_argument("--concurrency", type=runs.int_list, default=defaults.concurrency,
                            help="simultaneous streams, e.g. 1,2,4,8,16 (empty: no sweep)")
        parser.add_argument("--concurrency-client", default=defaults.concurrency_client, choices=("sse", "websocket"))
        parser.add_argument("--steady-rounds", type=int, default=defaults.steady_rounds,
                            help="at each concurrency, also N clients asking again as each answer ends, "
                                 "this many answers each (0: bursts only)")
        parser.add_argument("--sampled-ks", type=runs.int_list, default=defaults.sampled_ks,
                            help="K values of the own engine for the sampled rows (empty: none)")
        parser.add_argument("--temperature", type=float, default=defaults.sampled_temperature,
                            help="temperature of the sampled rows")
        parser.add_argument("--no-stack", action="store_true", help="in-process only")
        parser.add_argument("--url", help="benchmark this running server instead of starting daphne and a worker")
        parser.add_argument("--compare-url", action="append", default=[], metavar="[LABEL=]URL",
                            help="also ask another OpenAI-compatible server (llama.cpp's llama-server, vLLM, OVMS) "
                            "the same prompts with the same settings and streams, and print both side by side; it "
                            "must honour ignore_eos and report usage when streaming. Give it again, each named "
                            "(main=URL, ngram-mod=URL), for the conversations to ask several (the one-turn "
                            "workload asks one)")
        parser.add_argument("--compare-model", default="", help="the model name those servers answer to")
        parser.add_argument("--compare-key", default=os.environ.get("OPENAI_API_KEY", ""),
                            help="its API key, if it wants one (default: $OPENAI_API_KEY)")
        parser.add_argument("--conversations", type=Path,
                            help="also a multi-turn chat workload: a JSON list of {name, system, turns} (e.g. "
                                 "docs/benchmark/real-pair/conversations.json), each turn sent with the whole history, "
                                 "as it ships, with speculative: false and on --compare-url's server (its prompt "
                                 "cache on), on a stack that keeps its prefix cache")
        parser.add_argument("--conversations-only", action="store_true", help="the conversations alone")
        parser.add_argument("--conversation-repeats", type=int, default=2)
        parser.add_argument("--conversation-tokens", type=int, default=64,
                            help="new tokens a turn (EOS ignored, unless --stop-at-eos)")
        parser.add_argument("--workers", type=int, default=1,
                            help="workers the conversations' stack starts for the pair (each turn is routed to the "
                                 "one holding its conversation)")
        parser.add_argument("--stop-at-eos", action="store_true",
                            help="conversations' answers end at the model's end of answer, as a chat's do (by "
                                 "default each runs to --conversation-tokens, and a history holding text written past "
                                 "an end of answer is tokenized otherwise than it was written: the cache misses there)")
        parser.add_argument("--come-back-after", type=int, default=0, metavar="N",
                            help="before each conversation's last turn, N chats away (the other conversations' "
                                 "pastes in turn, each a chat of its own): what a user finds back in a chat")
        parser.add_argument("--think-s", type=float, default=1.0, metavar="S",
                            help="seconds between an answer and the conversation's next turn: the user reading and "
                                 "typing (work the server does between turns, the draft reading the conversation, "
                                 "runs then or beside the next turn)")
        parser.add_argument("--conversations-at-once", type=int, default=1,
                            help="copies of each conversation run together, each its own user's")
        parser.add_argument("--conversations-apart-s", type=float, default=0.0, metavar="S",
                            help="with --conversations-at-once: each copy starts S seconds after the one before (a "
                                 "paste that comes while the others chat, not all at the same instant)")
        parser.add_argument("--stop-holder-after-turn", type=int, metavar="N",
                            help="with --workers 2 or more: after turn N (0: the paste's) the worker that served it "
                                 "is stopped (--stop-signal) and the next turn sent at once; it is started again "
                                 "before the next line. What a user meets when a worker is taken down mid-chat")
        parser.add_argument("--stop-signal", choices=("TERM", "KILL", "STOP"), default="TERM",
                            help="how --stop-holder-after-turn stops it: TERM as systemd does, KILL as a crash, STOP "
                                 "as a hung worker, or one killed on another machine (its process still there)")
        parser.add_argument("--out", type=Path, default=Path(settings.BASE_DIR) / "docs" / "benchmark",
                            help="folder for results.json, results.md and the plots")

    def handle(self, *args, **o):
        pair = ModelPair.objects.filter(slug=o["pair"]).first()
        if pair is None:
            raise CommandError(f"No pair '{o['pair']}'. Known: {', '.join(p.slug for p in ModelPair.objects.all())}")
        if o["conversations_only"] and not o["conversations"]:
            raise CommandError("--conversations-only needs --conversations FILE")
        if not o["conversations_only"]:
            self.one_turn(pair=pair, o=o)
        if o["conversations"]:
            self.conversations(pair=pair, o=o)

    def conversations(self, *, pair: ModelPair, o: dict) -> None:
        try:
            chats = conversation.conversations_from_file(o["conversations"])
            peers = self.peers(urls=o["compare_url"], model=o["compare_model"], key=o["compare_key"], stack=True)
            if (o["workers"] < 1 or o["conversations_at_once"] < 1 or o["come_back_after"] < 0 or o["think_s"] < 0
                    or o["conversations_apart_s"] < 0):
                raise ValueError("--workers and --conversations-at-once take 1 or more, --come-back-after, "
                                 "--think-s and --conversations-apart-s 0 or more")
            stop_after = o["stop_holder_after_turn"]
            if stop_after is not None and (o["url"] or o["workers"] < 2 or stop_after < 0):
                raise ValueError("--stop-holder-after-turn takes a turn (0 or more) and needs --workers 2 or more on "
                                 "the benchmark's own stack (not --url): another worker must take the next turn")
            at_once = o["conversations_at_once"]
            stack = (nullcontext(None) if o["url"]
                     else local_workers(pair=pair, worker_threads=max(4, at_once), prefix_caching=True,
                                        workers=o["workers"]))
            with stack_credentials(max_concurrent=max(4, at_once)) as credentials, stack as local:
                base_url = local.url if local else o["url"]
                holder_stop = None if local is None or stop_after is None else conversation.HolderStop(
                    after_turn=stop_after, restart=local.restart_stopped,
                    stop=lambda answer_id: self.stop_holder(local, answer_id, signal.Signals[f"SIG{o['stop_signal']}"]))
                eos = {"ignore_eos": False} if o["stop_at_eos"] else {}
                endpoints = {line: conversation.Endpoint(base_url=base_url.rstrip("/"), model=pair.slug,
                                                         api_key=credentials.api_key, extra={**extra, **eos},
                                                         stoppable=True)
                             for line, extra in conversation.LINE_SETTINGS.items()}
                for label, peer in peers.items():
                    endpoints[conversation.peer_line(label)] = conversation.Endpoint(
                        base_url=peer.base_url, model=peer.model, api_key=peer.api_key, extra=eos)
                turns = conversation.run_conversations(
                    endpoints=endpoints, conversations=chats, repeats=o["conversation_repeats"],
                    max_tokens=o["conversation_tokens"], pause_s=o["think_s"], at_once=at_once,
                    apart_s=o["conversations_apart_s"],
                    come_back_after=o["come_back_after"], holder_stop=holder_stop, progress=self.stderr.write)
        except (ValueError, OSError, StackError, StreamError) as exc:
            raise CommandError(str(exc)) from exc
        turns = conversation.served_by(turns, self.workers_of([turn.answer_id for turn in turns]))
        named = ", ".join(f"{conversation.peer_line(label)} {peer.base_url} ({peer.model})"
                          for label, peer in peers.items())
        header = [(f"Pair `{pair.slug}`; host: {this_host().described}; conversations: {o['conversations'].name} "
                  f"({', '.join(chat.name for chat in chats)}); greedy, {o['conversation_tokens']} new tokens a turn "
                  f"{'at most (the answer ends at EOS)' if o['stop_at_eos'] else '(EOS ignored)'}, "
                  f"{o['conversation_repeats']} repeats of {o['conversations_at_once']} at once"
                  + (f", each {o['conversations_apart_s']:g} s after the one before" if o["conversations_apart_s"]
                     else "")
                  + f", lines interleaved; {o['workers']} worker(s); peers: {named or 'none'}"
                  + (f"; back in each conversation for its last turn after {o['come_back_after']} chats away"
                     if o["come_back_after"] else "")
                  + (f"; the worker holding each conversation stopped (SIG{o['stop_signal']}) after turn {stop_after}, "
                     f"the next turn sent at once" if stop_after is not None else "") + ".")]
        files = conversation.write_conversation_report(turns, o["out"], header=header)
        self.stdout.write("\n".join(["", *header, "", *conversation.report_lines(conversation.summarize(turns))]))
        self.stdout.write("\nWrote " + ", ".join(str(f) for f in files))

    def stop_holder(self, stack, answer_id: str, sig: signal.Signals) -> str:
        """Stop the worker that served this answer; its name."""
        worker = self.workers_of([answer_id]).get(answer_id, "")
        stack.stop_holder(worker, sig=sig)
        self.stderr.write(f"stopped {worker or 'no worker'} with {sig.name}")
        return worker

    @staticmethod
    def workers_of(answer_ids: list[str]) -> dict[str, str]:
        """Answer id -> the worker its record names (this server's answers; a peer's ids are not ours)."""
        ids = {}
        for answer_id in answer_ids:
            with suppress(ValueError):
                ids[answer_id] = AnswerIdConverter().to_python(answer_id)
        workers = dict(Generation.objects.filter(id__in=ids.values()).values_list("id", "worker"))
        return {answer: workers.get(generation_id, "") for answer, generation_id in ids.items()}

    def one_turn(self, *, pair: ModelPair, o: dict) -> None:
        try:
            options = runs.BenchmarkOptions(
                max_new_tokens=o["max_new_tokens"], repeats=o["repeats"], ks=o["ks"], thresholds=o["thresholds"],
                prompt_sets=o["prompts"], prompts_per_set=o["prompts_per_set"],
                clients=() if o["no_stack"] else o["clients"], stack_ks=o["stack_ks"],
                concurrency=o["concurrency"], concurrency_client=o["concurrency_client"],
                steady_rounds=o["steady_rounds"],
                sampled_ks=o["sampled_ks"], sampled_temperature=o["temperature"])
            prompts = self.prompts(pair=pair, path=o["prompts_file"], history=o["from_history"])
            peers = self.peers(urls=o["compare_url"], model=o["compare_model"], key=o["compare_key"],
                               stack=bool(options.clients))
            if len(peers) > 1:
                raise ValueError("the one-turn workload compares with one --compare-url (the conversations with "
                                 "several): run it once for each, or add --conversations-only")
            peer = next(iter(peers.values()), None)
            engines, baseline = runs.benchmark_engines(pair=pair)
            self.stderr.write(baseline)
            with tqdm(total=1, unit="run", dynamic_ncols=True) as bar, closing(engines):
                def progress(done: int, total: int, label: str) -> None:
                    bar.total = total
                    bar.set_postfix_str(label, refresh=False)
                    bar.update(done - bar.n)

                results = self.run(pair=pair, options=options, engines=engines, url=o["url"], progress=progress,
                                   prompts=prompts, peer=peer, notes=(baseline,))
        except (ValueError, OSError, errors.ServiceError, StackError, StreamError) as exc:
            raise CommandError(str(exc)) from exc
        files = report.write_report(results, o["out"])
        records.record_run(pair=pair, options=options, results=results, report_dir=o["out"])
        report.print_report(results, out=self.stdout.write)
        self.stdout.write("\nWrote " + ", ".join(str(f) for f in files))

    @staticmethod
    def prompts(*, pair: ModelPair, path: Path | None, history: int | None) -> list[Prompt] | None:
        if path and history:
            raise ValueError("give --prompts-file or --from-history, not both")
        if history is not None:
            if history < 1:
                raise ValueError("--from-history takes a number of prompts (1 or more)")
            return runs.history_prompts(pair=pair, count=history)
        if path:
            return prompts_from_file(path, render_chat=lambda messages: chat_prompt(pair=pair, messages=messages))
        return None

    @staticmethod
    def peers(*, urls: list[str], model: str, key: str, stack: bool) -> dict[str, PeerServer]:
        """Label ("" for one given without) -> the server `--compare-url [LABEL=]URL` names."""
        if not urls:
            if model:
                raise ValueError("--compare-model names the model of --compare-url's server: give both")
            return {}
        peers = {}
        for given in urls:
            # LABEL=URL splits at its first "=": a URL's own query may hold more
            label, _, url = ("", "", given) if given.startswith(("http://", "https://")) else given.partition("=")
            if not url.startswith(("http://", "https://")) or not model:
                raise ValueError("--compare-url takes the server's http(s) base URL (without /v1), LABEL=URL for "
                                 "one of several, and --compare-model the model name it answers to")
            if label in peers or (len(urls) > 1 and not label):
                raise ValueError("several --compare-url each need a label of their own: main=URL, ngram-mod=URL")
            peers[label] = PeerServer(base_url=url.rstrip("/"), model=model, api_key=key)
        if not stack:
            raise ValueError("--compare-url measures through the stack: drop --no-stack")
        return peers

    def run(self, *, pair, options, engines, url, progress, prompts, peer, notes) -> dict:
        if not options.clients:
            return runs.run_benchmark(pair=pair, options=options, engines=engines, progress=progress,
                                      prompts=prompts, notes=notes)
        threads = max(options.concurrency or (1,)) + 2  # a worker thread per stream, and some to spare
        stack = nullcontext(url) if url else local_stack(pair=pair, worker_threads=threads)
        with stack_credentials(max_concurrent=threads) as credentials, stack as base_url:
            if url:
                check_served(pair=pair)
            target = StackTarget(base_url=base_url, credentials=credentials, pair=pair.slug)
            return runs.run_benchmark(pair=pair, options=options, engines=engines, stack=target,
                                      progress=progress, prompts=prompts, peer=peer, notes=notes)
