import json
import os
from dataclasses import replace

from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from inference.benchmark import soak
from inference.benchmark.runs import int_list
from inference.benchmark.servers import StackError, private_stack, stack_credentials
from inference.models import ModelPair


class Command(BaseCommand):
    help = ("Soak a pair: N mixed generations (chat websocket, SSE, non-streaming, background + resume) with "
            "random disconnects, reconnects, stops and logouts, at several concurrencies, through a private stack "
            "(its own redis-server, two workers, daphne) while a worker's step processes freeze, a worker is killed, "
            "the database goes away and Redis is restarted; prints the figures and whether each bar is met (exit "
            "status 1 if not).")

    def add_arguments(self, parser):
        defaults = soak.SoakOptions()
        parser.add_argument("pair", help="the pair's slug")
        parser.add_argument("--generations", type=int, default=defaults.generations)
        parser.add_argument("--concurrency", type=int_list, default=defaults.concurrency,
                            help="one phase per level, e.g. 4,8,16")
        parser.add_argument("--max-tokens", type=int_list, default=defaults.max_tokens,
                            help="the range each request's max_tokens is drawn from, e.g. 8-40")
        parser.add_argument("--seed", type=int, default=defaults.seed)
        parser.add_argument("--no-worker-kill", action="store_true")
        parser.add_argument("--no-redis-restart", action="store_true")
        parser.add_argument("--freeze-steps", type=float, default=defaults.freeze_steps_s, metavar="S",
                            help="seconds one worker's step processes stay stopped (SIGSTOP); 0: none")
        parser.add_argument("--database-outage", type=float, default=defaults.database_outage_s, metavar="S",
                            help="seconds the database refuses connections (PostgreSQL) or stays write-locked "
                                 "(SQLite); 0: none")
        parser.add_argument("--kv-pool-mb", type=int, default=defaults.kv_pool_mb,
                            help="each worker's own-engine KV pool (a real pair at 16 streams needs about 1,024)")
        parser.add_argument("--json", action="store_true", help="print the figures as JSON")

    def handle(self, *args, **o):
        pair = ModelPair.objects.filter(slug=o["pair"]).first()
        if pair is None:
            raise CommandError(f"No pair '{o['pair']}'. Known: {', '.join(p.slug for p in ModelPair.objects.all())}")
        if o["generations"] < 3 or not o["concurrency"]:
            raise CommandError("--generations must be at least 3 and --concurrency name a level")
        options = replace(soak.SoakOptions(), generations=o["generations"], concurrency=o["concurrency"],
                          max_tokens=(min(o["max_tokens"]), max(o["max_tokens"])), seed=o["seed"],
                          kill_worker=not o["no_worker_kill"], restart_redis=not o["no_redis_restart"],
                          freeze_steps_s=o["freeze_steps"], database_outage_s=o["database_outage"],
                          kv_pool_mb=o["kv_pool_mb"])
        figures = run(pair=pair, options=options, base_env=dict(os.environ))
        if o["json"]:
            self.stdout.write(json.dumps(figures, indent=2))
        bars = soak.verdicts(figures)
        self.stdout.write(report(figures, bars))
        if not all(met for _, met, _ in bars):
            raise CommandError("the soak missed a bar (see above)")


def run(*, pair: ModelPair, options: soak.SoakOptions, base_env: dict[str, str]) -> dict:
    """The soak through its private stack, with a progress bar; the figures `soak.verdicts` judges."""
    level = max(options.concurrency)
    try:
        with stack_credentials(max_concurrent=level + 2) as credentials, private_stack(
                pair=pair, base_env=base_env, threads=options.worker_threads, stream_ttl_s=options.stream_ttl_s,
                chat_max_concurrent=level + 2, kv_pool_mb=options.kv_pool_mb) as stack, tqdm(
                    total=options.generations, unit="gen") as bar:
            return soak.run_soak(stack=stack, credentials=credentials, options=options,
                                 progress=lambda n: bar.update(n - bar.n))
    except StackError as exc:
        raise CommandError(str(exc)) from exc


def report(figures: dict, bars: list[tuple[str, bool, str]]) -> str:
    lines = [f"{figures['generations']} generations in {figures['elapsed_s']:.0f} s; faults: "
             + (", ".join(f"{f['fault']} after {f['after_generations']}" for f in figures["faults"]) or "none"),
             f"clients saw: {figures['ended']}; stored: {figures['stored_status']}",
             f"by kind: {figures['by_kind']}",
             f"503 (a failure said to its client): {figures['unavailable_503']}; errors: {figures['errors']}",
             f"workers that exited unplanned (started again): {figures['unplanned_worker_exits'] or 'none'}"]
    lines += [f"{'MET ' if met else 'MISS'} {name}: {measured}" for name, met, measured in bars]
    return "\n".join(lines)
