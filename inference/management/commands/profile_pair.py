from contextlib import nullcontext

from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from inference.benchmark import profile, runs
from inference.benchmark.prompts import heldout_prompts
from inference.benchmark.servers import StackError, check_served, local_stack, stack_credentials
from inference.benchmark.stack import StackTarget, StreamError
from inference.models import ModelPair


class Command(BaseCommand):
    help = ("Measure a pair's best K at each number of concurrent streams through the stack (greedy, and sampled at "
            "T=0.8), store it on the pair (workers then plan each request's K from it), and check the adaptive "
            "line against the main alone and the best fixed K.")

    def add_arguments(self, parser):
        defaults = profile.ProfileOptions()
        parser.add_argument("pair", help="the pair's slug")
        parser.add_argument("--levels", type=runs.int_list, default=defaults.levels, help="streams, e.g. 1,2,4,8,16")
        parser.add_argument("--ks", type=runs.int_list, default=defaults.ks, help="K values to try, e.g. 2,3,4,6")
        parser.add_argument("--max-new-tokens", type=int, default=defaults.max_new_tokens)
        parser.add_argument("--repeats", type=int, default=defaults.repeats,
                            help="bursts (or steady windows) per cell, run interleaved; the bars pair them")
        parser.add_argument("--load", choices=profile.LOADS, default=defaults.load,
                            help="bursts of N requests at once, or a steady N clients that ask again as each "
                                 "answer ends (a team's load)")
        parser.add_argument("--rounds", type=int, default=defaults.rounds,
                            help="answers each client asks under a steady load")
        parser.add_argument("--greedy-only", action="store_true", help="skip the sampled (T=0.8) profile")
        parser.add_argument("--prompts", default="code", help="held-out prompt sets, comma-separated")
        parser.add_argument("--url", help="profile this running server instead of starting daphne and a worker")
        parser.add_argument("--validate-only", action="store_true",
                            help="check the stored profile (main alone / best fixed K / adaptive) without a new sweep")

    def handle(self, *args, **o):
        pair = ModelPair.objects.filter(slug=o["pair"]).first()
        if pair is None:
            raise CommandError(f"No pair '{o['pair']}'.")
        options = profile.ProfileOptions(levels=o["levels"], ks=o["ks"], max_new_tokens=o["max_new_tokens"],
                                         repeats=o["repeats"], sampled=not o["greedy_only"], load=o["load"],
                                         rounds=o["rounds"])
        try:
            stored = profile.stored_sweeps(pair=pair, options=options) if o["validate_only"] else None
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        prompts = heldout_prompts(sets=tuple(filter(None, o["prompts"].split(","))))
        threads = max(options.levels) + 2
        stack = nullcontext(o["url"]) if o["url"] else local_stack(pair=pair, worker_threads=threads)
        try:
            with stack_credentials(max_concurrent=threads) as credentials, stack as base_url, \
                    tqdm(total=1, unit="burst", dynamic_ncols=True) as bar:
                if o["url"]:
                    check_served(pair=pair)

                def progress(done: int, total: int, label: str) -> None:
                    bar.total = total
                    bar.set_postfix_str(label, refresh=False)
                    bar.update(done - bar.n)

                stream = StackTarget(base_url=base_url, credentials=credentials, pair=pair.slug).client("sse")
                sweeps = stored or profile.measure_profile(stream=stream, prompts=prompts, options=options,
                                                           progress=progress)
                if not stored:
                    profile.set_profile(pair=pair, sweeps=sweeps)
                bar.reset()
                lines = profile.validate_profile(stream=stream, prompts=prompts, options=options, sweeps=sweeps,
                                                 progress=progress)
        except (StackError, StreamError) as exc:
            raise CommandError(str(exc)) from exc
        if o["validate_only"]:
            self.print_report(sweeps={}, lines=lines)
            return
        run = profile.record_profile_run(pair=pair, sweeps=sweeps, lines=lines, options=options)
        self.print_report(sweeps=sweeps, lines=lines)
        self.stdout.write(f"\nProfile stored on '{pair.slug}' (run #{run.id}): {pair.speculation_profile}")

    def print_report(self, *, sweeps: dict, lines: dict) -> None:
        for mode, sweep in sweeps.items():
            self.stdout.write(f"\n{mode}: tokens/s through the stack (SSE), best K per streams "
                              f"{sweep['profile']}, best fixed K {sweep['best_fixed_k']}")
            self.stdout.write(_table(sweep["rows"]))
        self.stdout.write("\nmain alone / best fixed K / adaptive (paired ratios: median and range over repeats):")
        for bar in profile.adaptive_bars(lines):
            paths = ", ".join(f"{path} {count}" for path, count in bar["adaptive_paths"].items())
            self.stdout.write(
                f"  {bar['verdict'].upper():9} {bar['mode']:7} {bar['streams']:>2} streams: plain "
                f"{bar['plain']:6.1f}  {bar['fixed_variant']} {bar['best_fixed']:6.1f}  "
                f"adaptive {bar['adaptive']:6.1f} tok/s ({_ratio(bar['vs_plain'], bar['vs_plain_range'])} plain, "
                f"{_ratio(bar['vs_fixed'], bar['vs_fixed_range'])} fixed); adaptive served: {paths}")


def _ratio(median: float | None, spread: list[float]) -> str:
    return "no answers to weigh" if median is None else f"{median:.2f}x [{spread[0]:.2f}-{spread[1]:.2f}]"


def _table(rows: list[dict]) -> str:
    names = sorted({r["variant"] for r in rows}, key=lambda n: (n != "plain", n))
    levels = sorted({r["concurrency"] for r in rows})
    by = {(r["variant"], r["concurrency"]): r for r in rows}
    lines = ["  streams " + "".join(f"{n:>10}" for n in names) + "   lost/failed"]
    for level in levels:
        cells = "".join(f"{by[(n, level)]['throughput']:>10.1f}" if (n, level) in by else f"{'':>10}" for n in names)
        problems = sum(by[(n, level)].get("lost", 0) + by[(n, level)]["failed"] for n in names if (n, level) in by)
        lines.append(f"  {level:>7} {cells}   {problems}")
    return "\n".join(lines)
