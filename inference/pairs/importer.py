"""Import of a main/draft pair: export both to OpenVINO IR with optimum-intel, check that they share
one tokenizer, and register the pair, all or nothing.

A source is a Hugging Face folder, a hub id, or a GGUF file (llama.cpp, Ollama, LM Studio): a GGUF file
is checked (magic, architecture, the publisher's sha256 when given), dequantized into a Hugging Face
folder inside the staging folder (pairs/gguf.py), and exported from there.

The draft's tokenizer is checked before any export (minutes for a real model) by converting both
Hugging Face tokenizers to OpenVINO ones (seconds) and comparing them as the registry compares
exported pairs. The exports land in a hidden staging folder under the models root that becomes
`<slug>/` only once both are done, and the pair is saved through `full_clean` (the registry's
checks on the exported folders): a failure at any point leaves no folder and no ModelPair.
Runs where the `train` extra is installed (torch, transformers, optimum-intel).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import re
import shutil
import tempfile
import uuid
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.utils import timezone

from inference import jobs, pair_checks, transport
from inference.models import ImportJob, ModelPair
from inference.pairs import gguf
from inference.pairs.conversion import ImportFailed, ImportProgress, ProgressCallback, dequantize, export

log = logging.getLogger(__name__)

WEIGHT_FORMATS = ("fp16", "int8", "int4")
ALTERNATIVE_DRAFT = "draft-alternative"  # the folder of the draft in its alternative weight format
DEFAULT_NUM_ASSISTANT_TOKENS = 4  # a starting K; the benchmark finds the pair's best
HUB_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")
SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")
WEIGHT_SUFFIXES = (".safetensors", ".bin")



def can_export() -> bool:
    """Whether this machine has the train extra (optimum-intel) that exports run with."""
    return importlib.util.find_spec("optimum") is not None and importlib.util.find_spec("optimum.intel") is not None


def request_errors(*, name: str, slug: str, main_source: str, draft_source: str, weight_format: str,
                   kv_cache_precision: str, device: str, draft_device: str = "", draft_weight_format: str = "",
                   draft_alternative_format: str = "",
                   main_sha256: str = "", draft_sha256: str = "") -> dict[str, str]:
    """ImportJob field -> message for an import that cannot start (empty when it can)."""
    errors: dict[str, str] = {}
    pair = ModelPair(name=name, slug=slug)
    try:
        pair.clean_fields(exclude=[f.name for f in ModelPair._meta.fields if f.name not in ("name", "slug")])
        pair.validate_unique()
    except ValidationError as exc:
        errors.update({field: " ".join(messages) for field, messages in exc.message_dict.items()})
    if "slug" not in errors and (settings.MODELS_ROOT / slug).exists():
        errors["slug"] = f"{settings.MODELS_ROOT / slug} already exists: choose another slug or remove that folder."
    if not main_source.strip():
        errors["main_source"] = "The main model is required: a Hugging Face id, a local folder or a GGUF file."
    errors.update(_format_errors(weight_format=weight_format, draft_weight_format=draft_weight_format,
                                 draft_alternative_format=draft_alternative_format,
                                 has_draft=bool(draft_source.strip())))
    for field, digest, source in (("main_sha256", main_sha256, main_source),
                                  ("draft_sha256", draft_sha256, draft_source)):
        if digest and not SHA256.match(digest.strip()):
            errors[field] = "A sha256 digest is 64 hexadecimal characters."
        elif digest and not Path(source).expanduser().is_file():
            errors[field] = "A digest can only be checked for a file (a GGUF source)."
    if kv_cache_precision not in ModelPair.KvPrecision.values:
        errors["kv_cache_precision"] = f"The KV cache precision must be one of {ModelPair.KvPrecision.values}."
    for field, value, choices in (("device", device, ModelPair.Device.choices),
                                  ("draft_device", draft_device, ModelPair.DRAFT_DEVICES)):
        if value not in dict(choices):
            errors[field] = f"The device must be one of {', '.join(ModelPair.Device.values)}."
    if not errors.keys() & {"device", "draft_device"}:
        errors.update(pair_checks.device_errors(
            device=device, draft_device=draft_device, has_draft=bool(draft_source.strip()),
            available=pair_checks.registrable_devices(client=transport.fail_fast_client())))
    return errors


def _format_errors(*, weight_format: str, draft_weight_format: str, draft_alternative_format: str,
                   has_draft: bool) -> dict[str, str]:
    errors = {}
    if weight_format not in WEIGHT_FORMATS:
        errors["weight_format"] = f"The weight format must be one of {', '.join(WEIGHT_FORMATS)}."
    if draft_weight_format and draft_weight_format not in WEIGHT_FORMATS:
        errors["draft_weight_format"] = f"The draft's weight format must be one of {', '.join(WEIGHT_FORMATS)}."
    if draft_alternative_format and (draft_alternative_format not in WEIGHT_FORMATS or not has_draft
                                     or draft_alternative_format == (draft_weight_format or weight_format)):
        errors["draft_alternative_format"] = ("The draft's alternative format must be another of "
                                              f"{', '.join(WEIGHT_FORMATS)} than its own, for a pair with a draft.")
    return errors


def local_source(source: str, *, role: str, staging: Path) -> Path:
    """The local source for `source`: a folder or a GGUF file as they are, or a hub id's download into
    the staging folder (removed with it, not left in a cache)."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path.resolve()
    if path.is_file():
        if not gguf.is_gguf(path):
            raise ImportFailed(f"The {role} file {path.name} is not a GGUF file (its first bytes are not 'GGUF'): "
                               "give a GGUF file or a Hugging Face model folder.")
        return path.resolve()
    if path.is_absolute() or source.startswith((".", "~")) or not HUB_ID.match(source):
        raise ImportFailed(f"The {role} folder {source} does not exist.")
    return _download(source, role=role, target=staging / f"hub-{role}")


HUB_SUFFIXES = (".json", ".txt", ".model", ".tiktoken", ".jinja")  # config, tokenizer, chat template


def hub_files(files: dict[str, int]) -> dict[str, int]:
    """Of a hub model's files (name -> bytes), those an export reads: the top-level config and tokenizer
    files and the weights in one format (safetensors if there are any); nothing in subfolders."""
    top = {name: size for name, size in files.items() if "/" not in name}
    weights = ".safetensors" if any(name.endswith(".safetensors") for name in top) else ".bin"
    return {name: size for name, size in top.items() if name.endswith((*HUB_SUFFIXES, weights))}


def _download(repo_id: str, *, role: str, target: Path) -> Path:
    """The hub model's files an export reads, once the disk is known to hold them and their export."""
    from huggingface_hub import HfApi, snapshot_download

    try:
        info = HfApi().model_info(repo_id, files_metadata=True)
        files = hub_files({s.rfilename: s.size or 0 for s in info.siblings or []})
    except Exception as exc:
        raise ImportFailed(f"The {role} '{repo_id}' is neither a local folder nor a Hugging Face hub model that "
                           f"could be found ({type(exc).__name__}: {exc}).") from exc
    check_disk(need=2 * sum(files.values()), root=target.parent)  # the download, then an IR at most its size
    try:
        return Path(snapshot_download(repo_id, allow_patterns=list(files), local_dir=target))
    except Exception as exc:
        raise ImportFailed(f"The {role} '{repo_id}' could not be downloaded ({type(exc).__name__}: {exc}).") from exc


def check_causal_lm(folder: Path, *, role: str) -> None:
    """Only text-generation models (a ...ForCausalLM architecture) can be exported and served."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ImportFailed(f"The {role} folder {folder} has no readable config.json: not a Hugging Face model "
                           f"folder ({exc}).") from exc
    causal = {name for names in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()
              for name in ((names,) if isinstance(names, str) else names)}
    architectures = config.get("architectures") or []
    if architectures:
        ok = any(a in causal or a.endswith("ForCausalLM") for a in architectures)
    else:
        ok = config.get("model_type") in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    if not ok:
        found = ", ".join(architectures) or f"model_type {config.get('model_type')!r}"
        raise ImportFailed(f"The {role} ({folder}) is not a causal language model: its config.json says {found}. "
                           "Only text-generation models (a ...ForCausalLM architecture) can be served.")


def tokenizer_problems(main: Path, draft: Path) -> list[str]:
    """What differs between the two Hugging Face tokenizers, compared after conversion as the registry
    compares exported pairs (vocabulary, special ids, probe encodings)."""
    from openvino import save_model
    from openvino_tokenizers import convert_tokenizer
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory(prefix="specchat-tokenizers-") as tmp:
        folders = []
        for role, source in (("main", main), ("draft", draft)):
            try:
                tokenizer, detokenizer = convert_tokenizer(AutoTokenizer.from_pretrained(source), with_detokenizer=True)
            except Exception as exc:
                raise ImportFailed(f"The {role}'s tokenizer in {source} cannot be loaded or converted to OpenVINO "
                                   f"({type(exc).__name__}: {exc}).") from exc
            folder = Path(tmp) / role
            save_model(tokenizer, folder / "openvino_tokenizer.xml")
            save_model(detokenizer, folder / "openvino_detokenizer.xml")
            folders.append(folder)
        return pair_checks.tokenizer_differences(*folders)


def _weights_size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.iterdir() if f.suffix in WEIGHT_SUFFIXES)


def _disk_need(source: Path, header: gguf.GgufHeader | None) -> int:
    """The IR of a 16- or 32-bit source in fp16/int8/int4 is at most the size of its weights; a GGUF file
    is first dequantized to float32 (kept until its export ends), and its IR is at most half that again."""
    return header.dequantized_bytes * 3 // 2 if header else _weights_size(source)


def check_disk(*, need: int, root: Path) -> None:
    reserve = settings.IMPORT_DISK_RESERVE_GB * 2**30
    free = shutil.disk_usage(root).free
    if free < need + reserve:
        raise ImportFailed(f"Not enough disk space under {root}: {free / 2**30:.1f} GB free, the export needs up to "
                           f"{need / 2**30:.1f} GB and "
                           f"{settings.IMPORT_DISK_RESERVE_GB} GB must stay free (SPECCHAT_IMPORT_DISK_RESERVE_GB).")


def _checked_source(source_text: str, *, digest: str, role: str, staging: Path,
                    progress: ImportProgress) -> tuple[Path, gguf.GgufHeader | None]:
    """A source that can be exported, and its GGUF header if it is a GGUF file, whose bytes are checked
    against the publisher's digest when one is given."""
    source = local_source(source_text, role=role, staging=staging)
    if source.is_dir():
        check_causal_lm(source, role=role)
        return source, None
    try:
        header = gguf.read_header(source, role=role)
        if digest:
            progress.step(f"checking the {role}'s sha256", progress.fraction)
            gguf.check_digest(source, expected=digest, role=role)
    except gguf.GgufError as exc:
        raise ImportFailed(str(exc)) from exc
    return source, header


def _hf_folder(source: Path, header: gguf.GgufHeader | None, *, staging: Path, role: str, progress: ImportProgress,
               start: float, end: float) -> Path:
    """The Hugging Face folder to export: the source itself, or its GGUF file dequantized into staging."""
    if header is None:
        return source
    folder = staging / f"hf-{role}"
    dequantize(source=source, target=folder, role=role, progress=progress, start=start, end=end)
    check_causal_lm(folder, role=role)
    return folder


def publisher_sampling(main: Path) -> dict:
    """The chat's sampling defaults a Hugging Face model ships in its generation_config.json (LM Studio and Ollama
    default to them): {} (greedy) where it does not sample or says nothing."""
    try:
        config = json.loads((main / "generation_config.json").read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(config, dict) or not config.get("do_sample"):
        return {}
    sampling = {name: config[name] for name in pair_checks.CHAT_SAMPLING if name in config}
    return sampling if not pair_checks.chat_sampling_errors(sampling) else {}


def _import(job: ImportJob, progress: ImportProgress) -> ModelPair:
    if not can_export():
        raise ImportFailed("optimum-intel is not installed where this import runs: install the train extra "
                           "(pip install torch==2.13.0 -e '.[train]').")
    errors = request_errors(name=job.name, slug=job.slug, main_source=job.main_source, draft_source=job.draft_source,
                            weight_format=job.weight_format, kv_cache_precision=job.kv_cache_precision,
                            device=job.device, draft_device=job.draft_device,
                            draft_weight_format=job.draft_weight_format,
                            draft_alternative_format=job.draft_alternative_format,
                            main_sha256=job.main_sha256, draft_sha256=job.draft_sha256)
    if errors:
        raise ImportFailed(" ".join(errors.values()))
    root = settings.MODELS_ROOT
    staging = root / f".import-{job.slug}-{uuid.uuid4().hex[:8]}"
    staging.mkdir(parents=True)
    final = root / job.slug
    placed = staging
    try:
        progress.step("checking the sources", 0.0)
        main, main_header = _checked_source(job.main_source, digest=job.main_sha256, role="main", staging=staging,
                                            progress=progress)
        draft, draft_header = _checked_source(job.draft_source, digest=job.draft_sha256, role="draft",
                                              staging=staging, progress=progress) if job.draft_source else (None, None)
        check_disk(need=_disk_need(main, main_header) + (_disk_need(draft, draft_header) if draft else 0), root=root)
        converting = 0.3 if main_header or draft_header else 0.0  # of the progress bar, for GGUF dequantizing
        main = _hf_folder(main, main_header, staging=staging, role="main", progress=progress, start=0.02,
                          end=0.02 + converting * 0.7)
        if draft:
            draft = _hf_folder(draft, draft_header, staging=staging, role="draft", progress=progress,
                               start=0.02 + converting * 0.7, end=0.02 + converting)
            progress.step("comparing the tokenizers", 0.03 + converting)
            problems = tokenizer_problems(main, draft)
            if problems:
                raise ImportFailed("The draft's tokenizer is not the main's: " + "; ".join(problems) +
                                   ". A draft must share the main's tokenizer.")
        main_share = _weights_size(main) / max(1, _weights_size(main) + (_weights_size(draft) if draft else 0))
        first = 0.1 + converting
        middle = first + (0.95 - first) * main_share
        export(source=main, target=staging / "main", weight_format=job.weight_format, role="main",
               progress=progress, start=first, end=middle)
        for spent in ("hf-main", "hub-main"):  # the weights exported from: gigabytes, needed no more
            shutil.rmtree(staging / spent, ignore_errors=True)
        if draft:
            formats = [job.draft_weight_format or job.weight_format, *filter(None, [job.draft_alternative_format])]
            for index, (folder, weight_format) in enumerate(zip(("draft", ALTERNATIVE_DRAFT), formats, strict=False)):
                share = (0.95 - middle) / len(formats)
                export(source=draft, target=staging / folder, weight_format=weight_format, role="draft",
                       progress=progress, start=middle + index * share, end=middle + (index + 1) * share)
            for spent in ("hf-draft", "hub-draft"):
                shutil.rmtree(staging / spent, ignore_errors=True)
        progress.step("checking and registering the pair", 0.95)
        try:
            staging.rename(final)
        except OSError as exc:
            raise ImportFailed(f"Cannot move the export to {final}: {exc}") from exc
        placed = final
        pair = ModelPair(name=job.name, slug=job.slug, main_dir=f"{job.slug}/main",
                         draft_dir=f"{job.slug}/draft" if draft else "", device=job.device,
                         draft_alternative_dir=f"{job.slug}/{ALTERNATIVE_DRAFT}" if job.draft_alternative_format
                         else "",
                         draft_device=job.draft_device if draft else "",
                         kv_cache_precision=job.kv_cache_precision, chat_sampling=publisher_sampling(final / "main"),
                         num_assistant_tokens=DEFAULT_NUM_ASSISTANT_TOKENS if draft else None)
        try:
            pair.full_clean()
        except ValidationError as exc:
            raise ImportFailed("The exported pair cannot be registered: " + "; ".join(
                f"{field}: {' '.join(messages)}" for field, messages in exc.message_dict.items())) from exc
        pair.save()
    except BaseException:
        shutil.rmtree(placed, ignore_errors=True)
        raise
    return pair


def run_import(*, job: ImportJob, on_progress: ProgressCallback | None = None) -> ModelPair:
    """Run a job to the end: the registered pair, or ImportFailed with the job marked failed."""
    progress = ImportProgress(job, on_progress)
    if not jobs.claim(model=ImportJob, job_id=job.pk):
        raise ImportFailed(f"The import of {job.slug} has already started.")
    try:
        with jobs.leased(model=ImportJob, job_id=job.pk):
            pair = _import(job, progress)
    except BaseException as exc:
        error = str(exc) if isinstance(exc, ImportFailed) else f"{type(exc).__name__}: {exc}".rstrip(": ")
        ImportJob.objects.filter(pk=job.pk).update(status=ImportJob.Status.FAILED, error=error, progress=progress.text,
                                                   log=job.log, finished_at=timezone.now())
        raise
    progress.step("registered", 1.0)
    ImportJob.objects.filter(pk=job.pk).update(status=ImportJob.Status.FINISHED, pair=pair, finished_at=timezone.now())
    return pair


def run_queued_import(*, job_id: int) -> None:
    """The worker side of the admin's import form. A second delivery of a job that started does nothing:
    its worker holds the job's lease, or the heartbeat fails it once the lease runs out
    (`fail_abandoned_imports`)."""
    job = ImportJob.objects.filter(pk=job_id, status=ImportJob.Status.QUEUED).first()
    if job is None:
        return
    try:
        run_import(job=job)
    except ImportFailed as exc:
        log.info("import %s failed: %s", job.slug, exc)  # recorded on the job, shown in the admin


def fail_abandoned_imports() -> None:
    """Fail the imports whose worker stopped, and remove what they left half-written."""
    for job in jobs.fail_abandoned(model=ImportJob):
        for leftover in settings.MODELS_ROOT.glob(f".import-{job.slug}-*"):
            shutil.rmtree(leftover, ignore_errors=True)
