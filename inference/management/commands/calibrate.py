from django.core.management.base import BaseCommand, CommandError

from inference.calibration.runs import execute_calibration
from inference.models import HostCalibration, JobStatus, ModelPair
from inference.serving.calibrated import summary
from inference.serving.host import this_host


class Command(BaseCommand):
    help = ("Calibrate a pair on this host, in this process (a worker does it by itself when it loads a pair on a "
            "host with no calibration): each precision configuration's main alone, the own engine per K, the cost "
            "of verifying n tokens. Prints what it decided; workers on this host serve from it.")

    def add_arguments(self, parser):
        parser.add_argument("pair")

    def handle(self, *args, pair, **options):
        record = ModelPair.objects.filter(slug=pair).first()
        if record is None:
            raise CommandError(f"No pair '{pair}'. Known: {', '.join(p.slug for p in ModelPair.objects.all())}")
        host = this_host(record.runs_on)
        self.stderr.write(f"Calibrating {record.slug} on {host.described}")
        calibration = HostCalibration.objects.create(pair=record, host=host.signature, host_facts=host.facts)
        execute_calibration(calibration_id=calibration.id, say=self.stderr.write)
        calibration.refresh_from_db()
        if calibration.status != JobStatus.FINISHED:
            raise CommandError(f"The calibration failed: {calibration.error}")
        shown = summary(calibration)
        rows = [f"| {name} | {line['tokens_per_s']:.1f} | {rate:.1f} |" for name, line in shown["main_alone"].items()
                for rate in [v for key, v in line.items() if key != "tokens_per_s"]]
        results = calibration.results
        streams = results["configs"][results["fastest"]]["streams"]
        in_batch = f", {streams} at once in its batch"
        ks = [f"| K={k}{where} | {line['tokens_per_s']:.1f} | {line['acceptance']} | "
              f"{line['identical']}/{line['answers']} |"
              for figures, where in ((results.get("ks", {}), ""), (results.get("batch_ks", {}), in_batch))
              for k, line in figures.items()]
        for label, line in ((f"{results['fastest']}, again beside the own engine", results.get("fastest_again")),
                            (f"own engine's main alone ({results.get('own_config')})", results.get("own_main_alone"))):
            if line:
                rows.append(f"| {label} | {line['tokens_per_s']:.1f} | {line['tokens_per_s_streams']:.1f} |")
        firsts = [line.get("first_token_ms_streams") for line in (results.get("fastest_again"),
                                                                  results.get("own_main_alone")) if line]
        if len(firsts) == 2 and None not in firsts:
            rows.append(f"\nFirst tokens at once (p50): the library's main alone {firsts[0]:.0f} ms, the own engine's "
                        f"batch {firsts[1]:.0f} ms.")
        own = ["| own engine | tok/s | acceptance | identical |", "| --- | ---: | ---: | ---: |", *ks, ""] if ks else []
        costs = ", ".join(f"{n} {cost:.2f}" for n, cost in (shown.get("verify_cost") or {}).items())
        long = results.get("long_context", {})
        long_costs = ", ".join(f"{n} {cost:.2f}" for n, cost in long.get("verify_cost", {}).items())
        self.stdout.write("\n".join([
            f"{shown['host']}, {shown['seconds']} s", "", "| the main alone in | tok/s, 1 stream | tok/s, at once |",
            "| --- | ---: | ---: |", *rows, "", *own, f"Verifying n tokens costs (x one): {costs}" if costs else "",
            f"After the {long['tokens']:,}-token prompt: {long_costs}; a draft token "
            f"{long['draft_ms']['draft']:.1f} ms, one of the main {long['verify_ms']:.1f} ms" if long_costs else "",
            shown["verdict"]]))
