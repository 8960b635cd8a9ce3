import json
from dataclasses import replace
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from inference.benchmark import modes
from inference.benchmark.prompts import prompts_from_file
from inference.benchmark.runs import int_list
from inference.engines.grammar.checks import check
from inference.engines.grammar.grammar import Grammar, GrammarError
from inference.engines.tokenizer import load_tokenizer
from inference.models import ModelPair
from inference.serving.records import pair_spec


class Command(BaseCommand):
    help = ("A pair's exact and fast modes, each against both baselines (the main alone in each mode), and the "
            "main's cost of one inference of 1-8 tokens in each: in-process, on prompts from a file.")

    def add_arguments(self, parser):
        parser.add_argument("pair")
        parser.add_argument("--prompts-file", type=Path, required=True,
                            help='JSON list of prompts or {"messages": [...]}, rendered with the chat template')
        parser.add_argument("--ks", type=int_list, default=(2, 3, 4))
        parser.add_argument("--max-new-tokens", type=int, default=128)
        parser.add_argument("--repeats", type=int, default=1)
        parser.add_argument("--modes", type=lambda text: tuple(text.split(",")), default=modes.DEFAULT_MODES,
                            help="of exact,fast,fast-f32,own (all four by default), own-whole-head (the own engine, "
                                 "its draft's head whole where the pair cuts it) and own-fixed-k (the own engine, its "
                                 "drafters proposing every step, paying or not: engines/own/payoff.py)")
        parser.add_argument("--json-schema", type=Path, help="hold every answer to this JSON schema (a file)")
        parser.add_argument("--streams", type=int, default=1, help="answers each line runs at once")
        parser.add_argument("--batch-ks", type=int_list, default=(),
                            help="with --streams beyond the pair's own engine streams: lines where the answers beyond "
                                 "them speculate in the batch at each of these Ks (Speculation.batch_k)")
        parser.add_argument("--draft-only", action="store_true",
                            help="each own K also with the prompt lookup off (the draft alone proposes)")
        parser.add_argument("--temperature", type=float, default=0.0,
                            help="sampled answers (seeded by their index), every line alike")
        parser.add_argument("--out", type=Path, help="write the figures here as JSON")

    def handle(self, *args, pair, prompts_file, ks, max_new_tokens, repeats, out, json_schema, streams, batch_ks,
               draft_only, temperature, **options):
        record = ModelPair.objects.filter(slug=pair).first()
        if record is None or not record.draft_dir:
            raise CommandError(f"No pair '{pair}' with a draft is registered.")
        spec = replace(pair_spec(pair=record), prefix_caching=False)  # every line prefills every prompt
        tokenizer = load_tokenizer(spec.main_dir)
        try:
            prompts = [p.text for p in prompts_from_file(prompts_file, render_chat=lambda messages: str(
                tokenizer.apply_chat_template(messages, add_generation_prompt=True)))]
        except (OSError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        if set(options["modes"]) - set(modes.MODES):
            raise CommandError(f"--modes takes {', '.join(modes.MODES)}.")
        if streams < 1:
            raise CommandError("--streams takes a number of streams, 1 or more.")
        grammar = None
        if json_schema:
            grammar = Grammar(kind="json_schema", text=json_schema.read_text())
            try:
                check(grammar, budget_s=settings.GRAMMAR_COMPILE_MS / 1000, requester="compare_modes")
            except GrammarError as exc:
                raise CommandError(f"{json_schema}: {exc}") from exc
        measured = [mode for mode in options["modes"] if "draft_head_ids" not in modes.MODES[mode]]  # not own's twin
        costs = {mode: modes.infer_cost(main_dir=spec.main_dir, props=modes.mode_props(main_dir=spec.main_dir,
                                                                                       mode=mode))
                 for mode in measured}
        draft_costs = {mode: modes.draft_cost(spec=spec, mode=mode) for mode in measured}
        lines = modes.compare_modes(spec=spec, prompts=prompts, ks=ks, max_new_tokens=max_new_tokens,
                                    repeats=repeats, modes=options["modes"], grammar=grammar, streams=streams,
                                    own_engine_streams=record.own_engine_streams, batch_ks=batch_ks,
                                    draft_only=draft_only,
                                    temperature=temperature, say=self.stderr.write)
        self.stdout.write(modes.report(lines, costs, draft_costs))
        if out:
            out.write_text(json.dumps({"pair": pair, "prompts": str(prompts_file), "max_new_tokens": max_new_tokens,
                                       "json_schema": str(json_schema or ""), "streams": streams,
                                       "temperature": temperature,
                                       "repeats": repeats, "costs_ms": costs, "draft_costs_ms": draft_costs,
                                       "lines": [{**vars(line), "answers": len(line.answers),
                                                  "tokens_per_s": line.tokens_per_s} for line in lines]},
                                      indent=1))
