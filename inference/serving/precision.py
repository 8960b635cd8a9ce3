"""The precision configurations a main can run in on a device, as PairSpec fields.

Which one is fastest depends on the host, not on the pair: the CPU's default precision is not the fastest everywhere
(docs/calibration.md). So a host's calibration measures each configuration its device offers, and the main
alone serves in the fastest one; speculation on the library's pipeline stays in the exact one (`f32`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PrecisionConfig:
    name: str
    label: str  # as the admin and an answer's reason say it
    inference_precision: str  # "": the device's default
    kv_cache_precision: str
    dynamic_quantization: bool
    needs: str = ""  # the device capability (OPTIMIZATION_CAPABILITIES) it needs, if any

    @property
    def fields(self) -> dict:
        """As PairSpec fields."""
        return {"inference_precision": self.inference_precision, "kv_cache_precision": self.kv_cache_precision,
                "dynamic_quantization": self.dynamic_quantization}


EXACT = PrecisionConfig("f32", "f32, no dynamic quantization", "f32", "f32", False)
CONFIGS = {config.name: config for config in (
    EXACT,
    PrecisionConfig("f32-dynamic", "f32 with dynamic int8 activations", "f32", "f32", True),
    PrecisionConfig("defaults", "the device's defaults", "", "", True),
    PrecisionConfig("bf16", "bf16", "bf16", "", True, needs="BF16"),
    PrecisionConfig("f16", "f16", "f16", "", True, needs="FP16"),
)}
# Where the own engine's greedy answers are the main alone's token for token by construction: on the PagedAttention
# op a row's bits do not depend on the step it shares in f32 with dynamic quantization on (without it, 6e-6 apart),
# and in bf16 with bf16 blocks (docs/exactness.md#one-kernel-path; engines/own/engine.py, own_engine_precision).
EXACT_ON_OWN_ENGINE = ("f32-dynamic", "bf16")


def offered(capabilities: list[str]) -> list[PrecisionConfig]:
    """The configurations a device with these OPTIMIZATION_CAPABILITIES runs."""
    return [config for config in CONFIGS.values() if not config.needs or config.needs in capabilities]


def named(name: str) -> PrecisionConfig | None:
    return CONFIGS.get(name)
