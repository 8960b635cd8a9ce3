"""Give back the pages of the IR weight files that a compiled model no longer reads.

OpenVINO maps a model's `openvino_model.bin` into memory and, on the CPU, repacks the weights into a
private copy of its own as the first inferences run. The mapped pages the repacking read stay resident
and are counted in the process's memory (PSS) for as long as the compiled model lives: on the real pair
the main's compiled model held 1.44 GiB of mapped file pages beside its 1.6 GiB private copy, and the
answers came from the private copy alone (the same logits after the pages were dropped).

Dropping them is always safe: the mappings are read-only (OpenVINO 2026.4 maps them shared, earlier
releases private), so a page the runtime reads again is read back from the file (the kernel's page cache).
The pages are dropped periodically rather than once, because the repacking happens lazily, per kernel,
as new shapes (a first K+1 verification) appear.
"""

from __future__ import annotations

import ctypes
import logging
import re

log = logging.getLogger(__name__)

MADV_DONTNEED = 4
WEIGHT_FILE = "openvino_model.bin"
RELEASE_EVERY_S = 5.0  # how often an engine drops the pages its newest kernels read
_MAPPING = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) r--[ps] \S+ \S+ \S+\s+(/.*)$")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def weight_mappings() -> list[tuple[int, int]]:
    """The read-only mappings of IR weight files in this process, as (start, end) addresses."""
    spans = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            match = _MAPPING.match(line.rstrip("\n"))
            if match and match.group(3).endswith(WEIGHT_FILE):
                spans.append((int(match.group(1), 16), int(match.group(2), 16)))
    return spans


def release_weight_pages() -> None:
    for start, end in weight_mappings():
        if _libc.madvise(start, end - start, MADV_DONTNEED) != 0:
            log.warning("could not release weight pages: errno %d", ctypes.get_errno())
            return


def release_freed_heap() -> None:
    """Give the system back the heap pages that are free: glibc keeps what an answer's thread freed (its
    prefill's logits, its distributions) in that thread's arena. On the real pair's own engine that was
    0.35 GiB of the worker after 50 answers six at a time."""
    if hasattr(_libc, "malloc_trim"):  # glibc's
        _libc.malloc_trim(0)
