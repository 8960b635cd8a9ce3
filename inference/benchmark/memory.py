"""What a worker holds in memory: PSS (proportional set size) summed over the worker and the processes it
started (its step processes hold the pipelines). PSS, not RSS: pages shared between processes (the
libraries, a file mapped by two of them) are counted once in the sum, in shares."""

from __future__ import annotations

from contextlib import suppress
from pathlib import Path

IR_FILES = ("openvino_model.bin", "openvino_model.xml")


def pss_bytes(pid: int) -> int:
    """0 for a process that is gone."""
    with suppress(OSError):
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return 0


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with suppress(OSError, IndexError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:  # the field after the state: ppid
                found.append(int(stat.parent.name))
    return found


def process_tree(pid: int) -> list[int]:
    tree, pending = [], [pid]
    while pending:
        current = pending.pop()
        tree.append(current)
        pending += children(current)
    return tree


def tree_pss(pid: int) -> dict[int, int]:
    """PSS of each process of the tree under `pid` (the worker first)."""
    return {process: pss_bytes(process) for process in process_tree(pid)}


def mapped_weight_bytes(pid: int) -> int:
    """PSS of the IR weight files mapped in a process (engines/pages.py gives them back)."""
    total, weights = 0, False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
            weights = fields[-1].endswith("openvino_model.bin")
        elif weights and fields[0] == "Pss:":
            total += int(fields[1]) * 1024
    return total


def ir_bytes(*folders: str | Path) -> int:
    """The size of the models' IR files (weights and graph) on disk: what one copy of each weighs."""
    return sum((Path(folder) / name).stat().st_size for folder in folders if folder for name in IR_FILES)
