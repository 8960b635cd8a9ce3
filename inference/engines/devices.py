"""The devices a pair's models may run on: those an OpenVINO runtime lists, and AUTO (the runtime picks one
of them). Each worker reports its own in its heartbeat; a pair is registered on devices some live worker
has, and a worker refuses to load a model on a device it lacks. The web side imports this module too:
openvino loads with the first question, not at import."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

AUTO = "AUTO"


class DeviceUnavailable(RuntimeError):
    """A model's device is not among those this worker's runtime lists."""


@dataclass(frozen=True)
class AvailableDevices:
    names: tuple[str, ...]
    where: str  # "on this worker", "on the live workers", ...: completes "Devices ...: CPU, AUTO."

    def refusals(self, wanted: dict[str, str]) -> dict[str, str]:
        """Model ("main", "draft") -> why its device cannot serve it here, once per device (a draft on the main's
        device is not refused twice); empty when every one can."""
        refused: dict[str, str] = {}
        for model, device in wanted.items():
            if device not in self.names and device not in refused.values():
                refused[model] = device
        return {model: f"The {model} device {device} is not available. Devices {self.where}: {', '.join(self.names)}."
                for model, device in refused.items()}


@lru_cache(maxsize=1)
def runtime_devices() -> tuple[str, ...]:
    """This process's devices as a pair names them ("GPU" for any of GPU.0, GPU.1, ...), then AUTO."""
    import openvino as ov

    return (*dict.fromkeys(name.split(".")[0] for name in ov.Core().available_devices), AUTO)


def on_this_worker() -> AvailableDevices:
    return AvailableDevices(runtime_devices(), "on this worker")
