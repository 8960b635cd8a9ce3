"""A pair's calibration run by a worker of its queue (serving/calibrated.py queues it): measured on this host
(measure.py) under a lease like every job, and kept with the host's signature and facts."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from django.conf import settings
from django.utils import timezone

from inference import jobs
from inference.benchmark.runs import machine
from inference.calibration.measure import Budget, calibrate
from inference.models import HostCalibration, JobStatus
from inference.serving.host import this_host
from inference.serving.records import pair_spec

log = logging.getLogger(__name__)


def execute_calibration(*, calibration_id: int, say: Callable[[str], object] | None = None) -> None:
    """Measure the pair on this host and keep the figures (a failure keeps its error); `say`: progress lines."""
    if not jobs.claim(model=HostCalibration, job_id=calibration_id):
        return  # a replayed delivery of a calibration that already started
    calibration = HostCalibration.objects.select_related("pair").get(id=calibration_id)
    host = this_host(calibration.pair.runs_on)
    HostCalibration.objects.filter(id=calibration_id).update(host=host.signature, host_facts=host.facts)
    last_update = 0.0

    def progress(done: int, total: int, label: str) -> None:
        nonlocal last_update
        if say:
            say(f"{done}/{total}: {label}")
        if time.monotonic() - last_update >= 1 or done == total:
            last_update = time.monotonic()
            HostCalibration.objects.filter(id=calibration_id).update(progress=f"{done}/{total}: {label}")

    budget = Budget(max_new_tokens=settings.CALIBRATION_TOKENS, ks=settings.CALIBRATION_KS,
                    stopped_ks=settings.CALIBRATION_STOPPED_KS, batch_ks=settings.CALIBRATION_BATCH_KS,
                    seconds=settings.CALIBRATION_SECONDS)
    try:
        with jobs.leased(model=HostCalibration, job_id=calibration_id):
            load_before = os.getloadavg()[0]
            results = calibrate(spec=pair_spec(pair=calibration.pair), budget=budget, progress=progress,
                                capabilities=machine_capabilities(calibration.pair.device))  # the main's
            results["machine"] = machine() | {"load_average_before": load_before}
    except Exception as exc:
        log.exception("calibration %s failed", calibration_id)
        HostCalibration.objects.filter(id=calibration_id).update(
            status=JobStatus.FAILED, finished_at=timezone.now(), error=f"{type(exc).__name__}: {exc}")
        return
    HostCalibration.objects.filter(id=calibration_id).update(status=JobStatus.FINISHED, results=results,
                                                             finished_at=timezone.now())
    log.info("calibrated %s on %s in %.0f s", calibration.pair.slug, host.described, results["seconds"])


def machine_capabilities(device: str) -> list[str]:
    import openvino as ov

    return list(ov.Core().get_property(device, "OPTIMIZATION_CAPABILITIES"))
