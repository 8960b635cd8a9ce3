"""The steps of an import that run as programs of their own (GGUF dequantizing, optimum-cli's export):
each in a process whose memory goes back when it ends, offline, its output streamed into the
ImportJob's progress so the admin shows how far it got."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from io import BufferedReader
from pathlib import Path

from inference.models import ImportJob

LOG_CHARS = 64_000  # the tail of the export output kept on the job
# Lines optimum-cli prints at known points of an export -> fraction of that export done.
EXPORT_MILESTONES = (("TracerWarning", 0.3), ("Statistics of the bitwidth", 0.7), ("Applying Weight Compression", 0.9))
ProgressCallback = Callable[[float, str, str], None]  # (fraction done, stage, last output line)


class ImportFailed(Exception):
    """An import that cannot go on; the message says why and what to do."""


class ImportProgress:
    """An import's stage and output, written to its ImportJob (at most once a second) and to a callback."""

    def __init__(self, job: ImportJob, callback: ProgressCallback | None):
        self.job, self.callback = job, callback
        self.fraction, self.stage, self.last_line = 0.0, "", ""
        self._saved_at = 0.0

    @property
    def text(self) -> str:
        return f"{self.fraction:.0%} {self.stage}"[:200]

    def step(self, stage: str, fraction: float) -> None:
        if stage != self.stage:
            self.line(f"== {stage}")
        self.stage, self.fraction = stage, max(self.fraction, fraction)
        self._emit(save=True)

    def line(self, text: str) -> None:
        text = text.rstrip()
        if text:
            self.job.log = (self.job.log + text + "\n")[-LOG_CHARS:]
            self.last_line = text
            self._emit(save=time.monotonic() - self._saved_at >= 1)

    def _emit(self, *, save: bool) -> None:
        if self.callback:
            self.callback(self.fraction, self.stage, self.last_line)
        if save:
            ImportJob.objects.filter(pk=self.job.pk).update(progress=self.text, log=self.job.log)
            self._saved_at = time.monotonic()


def output_lines(stream: BufferedReader) -> Iterator[str]:
    """Lines of a subprocess's output as they come, progress bars' carriage returns included."""
    pending = b""
    while chunk := stream.read1(65536):
        *lines, pending = re.split(rb"[\r\n]", pending + chunk)
        for line in lines:
            yield line.decode(errors="replace")
    if pending:
        yield pending.decode(errors="replace")


def run_stage(cmd: list[str], *, stage: str, failure: str, progress: ImportProgress, start: float, end: float,
               milestones: tuple[tuple[str, float], ...] = ()) -> None:
    """A conversion step in a process of its own (its memory goes back when it ends), offline, its output
    streamed into the progress."""
    progress.step(stage, start)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    tail: deque[str] = deque(maxlen=30)
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env) as proc:
        for line in output_lines(proc.stdout):  # type: ignore[arg-type]  # a PIPE, so not None
            tail.append(line)
            progress.line(line)
            for marker, done in milestones:
                if marker in line:
                    progress.step(stage, start + (end - start) * done)
    if proc.returncode:
        lines = [line.strip() for line in tail if line.strip()] or ["no output"]
        cause = next((line for line in reversed(lines) if re.search(r"(Error|Exception)\b", line)), lines[-1])
        raise ImportFailed(f"{failure} exited with {proc.returncode}: {cause}")
    progress.step(stage, end)


def export(*, source: Path, target: Path, weight_format: str, role: str, progress: ImportProgress,
           start: float, end: float) -> None:
    """optimum-cli's OpenVINO export of a local Hugging Face folder."""
    cmd = [sys.executable, "-m", "optimum.commands.optimum_cli", "export", "openvino", "--model", str(source),
           "--task", "text-generation-with-past", "--weight-format", weight_format, str(target)]
    run_stage(cmd, stage=f"exporting the {role} ({weight_format})", progress=progress, start=start, end=end,
               failure=f"Export of the {role} from {source} failed: optimum-cli", milestones=EXPORT_MILESTONES)


def dequantize(*, source: Path, target: Path, role: str, progress: ImportProgress, start: float, end: float) -> None:
    """A GGUF file turned into a Hugging Face folder (pairs/gguf.py)."""
    run_stage([sys.executable, "-m", "inference.pairs.gguf", str(source), str(target)],
               stage=f"dequantizing the {role}'s GGUF file", progress=progress, start=start, end=end,
               failure=f"Conversion of the {role}'s GGUF file {source.name} failed: the converter",
               milestones=(("dequantizing", 0.1), ("saving", 0.8)))
