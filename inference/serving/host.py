"""The host a worker runs on, as a calibration names it: the facts that change which precision and K are
fastest (CPU model, the ISA flags that pick the kernels, cores, the runtime's version, the device), and a
signature made of them, and the own engine's kind (a calibration measures it: figures of another engine do not
hold). A worker on a host with another signature calibrates the pair anew."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

# The flags that decide which kernels OpenVINO's CPU plugin runs (and so which configuration is fastest).
# The own engine a calibration measured: "paged", on the PagedAttention op (engines/own/paged_model.py). Changed, every
# host calibrates again (the stateful engine's figures said its rollbacks made long answers lose).
OWN_ENGINE_KIND = "paged"
KERNEL_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16",
                "amx_int8")


@dataclass(frozen=True)
class Host:
    signature: str
    facts: dict

    @property
    def described(self) -> str:
        facts = self.facts
        isa = ", ".join(facts.get("isa") or ()) or "no AVX2"
        return (f"{facts.get('cpu', '?')} (family {facts.get('family', '?')} model {facts.get('model', '?')}; {isa}), "
                f"{facts.get('cores', '?')} cores, OpenVINO {facts.get('openvino', '?')}, {facts.get('device', '?')}")


def host_of(facts: dict) -> Host:
    return Host(signature=hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest(), facts=facts)


@cache
def this_host(device: str = "CPU") -> Host:
    """This process's host for a pair's devices (ModelPair.runs_on; read once: it does not change while the
    process lives)."""
    import openvino as ov

    cpu = _cpuinfo()
    flags = set(cpu.get("flags", "").split())
    return host_of({
        "cpu": cpu.get("model name", "unknown").strip(),
        "family": cpu.get("cpu family", ""), "model": cpu.get("model", ""),
        "isa": [flag for flag in KERNEL_FLAGS if flag in flags],
        "cores": len(os.sched_getaffinity(0)),
        "openvino": ov.get_version().split("-")[0],
        "device": device,
        "own_engine": OWN_ENGINE_KIND,
    })


def _cpuinfo() -> dict[str, str]:
    """The first processor's entries of /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    first = text.split("\n\n", 1)[0]
    return {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in first.splitlines())}
