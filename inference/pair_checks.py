"""Checks that a main/draft pair can be served: folders, files, one shared tokenizer, devices a worker
has, and a valid speculation profile. Below the models and the serving code that call them.

openvino-genai's own check encodes one sentence and compares token counts and special ids, which
two different vocabularies can pass; here the vocabularies, special ids and a set of probe strings
must all agree.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path

import redis
from django.conf import settings

from inference import limits
from inference.engines.devices import AvailableDevices, runtime_devices
from inference.limits import K_MAX, K_MIN
from inference.transport import live_workers

REQUIRED_FILES = ("openvino_model.xml", "openvino_model.bin", "openvino_tokenizer.xml", "openvino_detokenizer.xml")
PROBE_STRINGS = (
    "def quicksort(numbers):\n    return sorted(numbers)\n",
    "The quick brown fox jumps over the lazy dog.",
    "    if x is None:\n        raise ValueError('x must be set')",
    "naïve café, 東京, emoji 🚀 and tabs\t\tend",
    "1234567890 + 0x1F == 0b101 ** 3 // 7 % 2",
    "<|endoftext|>",
    "",
)


class PairFolderError(ValueError):
    """A folder that cannot serve as a model folder; the message says why."""


def resolve_model_dir(relative: str, *, root: Path | None = None) -> Path:
    """The absolute folder for `relative` under the models root, with every IR file present."""
    root = Path(os.path.normpath(root or settings.MODELS_ROOT))
    if not relative.strip():
        raise PairFolderError("A folder is required.")
    # Lexical check: '..' and absolute paths cannot leave the root; symlinks placed inside it are trusted.
    path = Path(os.path.normpath(root / relative))
    if path != root and root not in path.parents:
        raise PairFolderError(f"'{relative}' is outside the models root {root}.")
    if not path.is_dir():
        raise PairFolderError(f"No folder '{relative}' under the models root {root}.")
    missing = [name for name in REQUIRED_FILES if not (path / name).is_file()]
    if missing:
        raise PairFolderError(f"'{relative}' lacks {', '.join(missing)} (export it with optimum-cli export openvino).")
    return path


@lru_cache(maxsize=32)
def load_tokenizer(folder: str):
    """The folder's OpenVINO tokenizer; cheap to keep, used by the web process to count prompt tokens. openvino
    loads with the first one a process asks for, not with the web side's modules."""
    from inference.engines import tokenizer

    return tokenizer.load_tokenizer(folder)


def tokenizer_differences(main: Path, draft: Path) -> list[str]:
    """What differs between the two folders' tokenizers; empty when they are the same."""
    a, b = load_tokenizer(str(main)), load_tokenizer(str(draft))
    problems = []
    va, vb = a.get_vocab(), b.get_vocab()
    if len(va) != len(vb):
        problems.append(f"vocabulary sizes differ: main {len(va)}, draft {len(vb)}")
    elif va != vb:
        differing = sum(1 for token, idx in va.items() if vb.get(token) != idx)
        problems.append(f"vocabularies differ in {differing} of {len(va)} entries")
    for name in ("eos", "bos", "pad"):
        ida, idb = getattr(a, f"get_{name}_token_id")(), getattr(b, f"get_{name}_token_id")()
        if ida != idb:
            problems.append(f"{name} token id differs: main {ida}, draft {idb}")
    for probe in PROBE_STRINGS:
        ids_a = a.encode(probe).input_ids.data.tolist()
        ids_b = b.encode(probe).input_ids.data.tolist()
        if ids_a != ids_b:
            problems.append(f"probe {probe[:30]!r} encodes differently")
    return problems


def validate_pair_fields(
    *,
    main_dir: str,
    draft_dir: str,
    prompt_lookup: bool,
    num_assistant_tokens: int | None,
    draft_alternative_dir: str = "",
    assistant_confidence_threshold: float | None,
    max_new_tokens_cap: int,
    root: Path | None = None,
) -> dict[str, str]:
    """Field -> error message for everything wrong with a pair's settings (empty when it can be saved)."""
    errors: dict[str, str] = {}
    folders = _resolved({"main_dir": main_dir, "draft_dir": draft_dir, "draft_alternative_dir": draft_alternative_dir},
                        root=root, errors=errors)
    main, draft = folders.get("main_dir"), folders.get("draft_dir")
    if draft_dir and prompt_lookup:
        errors["prompt_lookup"] = "Prompt lookup cannot be combined with a draft model."
    if draft_alternative_dir and not draft_dir:
        errors["draft_alternative_dir"] = "A draft in another precision needs the draft itself."
    speculative = bool(draft_dir) or prompt_lookup
    k, threshold = num_assistant_tokens, assistant_confidence_threshold
    if k is not None and threshold is not None:
        errors["assistant_confidence_threshold"] = (
            "Set either num_assistant_tokens or the confidence threshold, not both.")
    elif speculative and k is None and threshold is None:
        errors["num_assistant_tokens"] = (
            "A speculative pair needs a default: num_assistant_tokens or the confidence threshold.")
    elif prompt_lookup and k is None:
        errors["num_assistant_tokens"] = "Prompt lookup needs num_assistant_tokens."
    if k is not None and not limits.K_MIN <= k <= limits.K_MAX:
        errors["num_assistant_tokens"] = f"num_assistant_tokens must be between {limits.K_MIN} and {limits.K_MAX}."
    if threshold is not None and not 0 < threshold < 1:
        errors["assistant_confidence_threshold"] = "The confidence threshold must be between 0 and 1 (exclusive)."
    if max_new_tokens_cap < 1:
        errors["max_new_tokens_cap"] = "The cap must be at least 1."
    if main and draft and not errors:
        problems = tokenizer_differences(main, draft)
        if problems:
            errors["draft_dir"] = "The draft's tokenizer is not the main's: " + "; ".join(problems) + "."
    return errors


def _resolved(folders: dict[str, str], *, root: Path | None, errors: dict[str, str]) -> dict[str, Path]:
    """Each folder given (the main's always) resolved under the models root; what cannot be, in `errors`."""
    resolved = {}
    for field, folder in folders.items():
        if folder or field == "main_dir":
            try:
                resolved[field] = resolve_model_dir(folder, root=root)
            except PairFolderError as exc:
                errors[field] = str(exc)
    return resolved


def device_errors(*, device: str, draft_device: str, has_draft: bool, available: AvailableDevices) -> dict[str, str]:
    """Field ("device": the main's, "draft_device") -> why no worker can run that model on the device it names."""
    wanted = {"main": device, **({"draft": draft_device} if has_draft and draft_device else {})}
    fields = {"main": "device", "draft": "draft_device"}
    return {fields[model]: message for model, message in available.refusals(wanted).items()}


PROFILE_MODES = ("greedy", "sampled")


CHAT_SAMPLING = {"temperature": (0.0, 2.0), "top_p": (0.0, 1.0), "top_k": (0, 1000),  # name: its range
                 "repetition_penalty": (1.0, 2.0)}


def chat_sampling_errors(sampling) -> list[str]:
    """What is wrong with a pair's chat sampling defaults ({"temperature": 0.7, "top_p": 0.8, "top_k": 20}); empty
    if nothing."""
    if not isinstance(sampling, dict):
        return ['it must be an object such as {"temperature": 0.7, "top_p": 0.8, "top_k": 20}']
    problems = [f"unknown setting {json.dumps(name)[:40]} (use {', '.join(CHAT_SAMPLING)})"
                for name in sampling if name not in CHAT_SAMPLING]
    for name, (low, high) in CHAT_SAMPLING.items():
        value = sampling.get(name)
        kind = int if isinstance(low, int) else (int, float)
        if value is not None and (isinstance(value, bool) or not isinstance(value, kind) or not low <= value <= high):
            problems.append(f"{name} must be a number in [{low}, {high}], not {json.dumps(value)[:40]}")
    return problems


def profile_errors(profile) -> list[str]:
    """What is wrong with a speculation profile ({"greedy": {"<streams>": K, ...}, "sampled": {...}},
    K 0 for the main alone or K_MIN..K_MAX); empty if nothing. The pair's validation refuses one with
    errors, and a stored one with errors is ignored at request time rather than failing every request."""
    if profile in (None, {}):
        return []
    if not isinstance(profile, dict):
        return ["it must be an object such as {\"greedy\": {\"1\": 4, \"8\": 2}}"]
    problems = [f"unknown mode {json.dumps(mode)[:40]} (use {' or '.join(PROFILE_MODES)})"
                for mode in profile if mode not in PROFILE_MODES]
    for mode in PROFILE_MODES:
        table = profile.get(mode) or {}
        if not isinstance(table, dict):
            problems.append(f"{mode} must be an object of streams to K")
            continue
        for streams, k in table.items():
            if not (isinstance(streams, str) and streams.isdigit() and 0 < int(streams) <= 100_000):
                problems.append(f"{mode}: {json.dumps(streams)[:40]} is not a number of streams (1 or more)")
            if isinstance(k, bool) or not isinstance(k, int) or not (k == 0 or K_MIN <= k <= K_MAX):
                problems.append(f"{mode}[{json.dumps(streams)[:40]}]: K must be 0 (the main alone) or an integer "
                                f"in [{K_MIN}, {K_MAX}], not {json.dumps(k)[:40]}")
    return problems


def registrable_devices(*, client: redis.Redis) -> AvailableDevices:
    """The devices a pair may name: those the live workers' runtimes list; with none to ask, this process's."""
    try:
        workers = live_workers(client=client)
    except redis.RedisError:
        workers = []
    listed = dict.fromkeys(device for worker in workers for device in worker.get("devices", ()))
    if listed:
        return AvailableDevices(tuple(listed), "on the live workers")
    return AvailableDevices(runtime_devices(), "in this server's OpenVINO runtime (no live worker reported its own)")
