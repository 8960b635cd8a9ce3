"""The pair registry and the record of every generation (chat or API)."""

import uuid

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models

# The `model` name API clients use, a folder and a queue name: model names carry dots ("qwen2.5-coder-1.5b"),
# but a name may not start with one (hidden folders, "..").
pair_slug = RegexValidator(r"^[a-zA-Z0-9][a-zA-Z0-9._-]*\Z", "Enter a name of letters, numbers, dots, hyphens or "
                           "underscores that starts with a letter or a number.")


class ModelPair(models.Model):
    class Device(models.TextChoices):
        """What an OpenVINO runtime may list (engines/devices.py); a pair may name those a live worker has."""

        CPU = "CPU", "CPU"
        GPU = "GPU", "GPU"
        NPU = "NPU", "NPU"
        AUTO = "AUTO", "AUTO (the runtime picks)"

    DRAFT_DEVICES = [("", "the main's"), *Device.choices]

    class Precision(models.TextChoices):
        DEFAULT = "", "device default"
        F32 = "f32"
        F16 = "f16"
        BF16 = "bf16"

    class KvPrecision(models.TextChoices):
        DEFAULT = "", "device default"
        U8 = "u8"
        F16 = "f16"
        BF16 = "bf16"
        F32 = "f32"

    name = models.CharField(max_length=100, unique=True)
    slug = models.CharField(max_length=60, unique=True, validators=[pair_slug],
                            help_text="The `model` name API clients use; also names the Celery queue.")
    main_dir = models.CharField(max_length=500,
                                help_text="Folder of the main model's OpenVINO IR, relative to the models root.")
    draft_dir = models.CharField(
        max_length=500, blank=True,
        help_text="Folder of the draft model; empty means no draft (plain or prompt-lookup decoding)."
    )
    draft_alternative_dir = models.CharField(
        "draft in another precision", max_length=500, blank=True,
        help_text="Folder of the same draft in another weight format (int8 beside int4): each host's calibration "
                  "times a draft token of both and the own engine loads the cheaper (int4 kernels are cheaper "
                  "with AVX-512, int8 ones with AVX2)."
    )
    prompt_lookup = models.BooleanField(default=False,
                                        help_text="Without a draft: speculate from n-grams of the prompt.")
    max_ngram_size = models.PositiveSmallIntegerField(default=3, help_text="Prompt lookup only.")
    device = models.CharField("main device", max_length=8, choices=Device.choices, default=Device.CPU,
                              help_text="Where the main model runs: a device a live worker's OpenVINO runtime lists "
                                        "(checked when the pair is registered or its devices change).")
    draft_device = models.CharField("draft device", max_length=8, blank=True, default="",
                                    choices=DRAFT_DEVICES,
                                    help_text="Where the draft runs; empty: on the main's device.")
    num_assistant_tokens = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="Default K: tokens the draft proposes per step (1-32)."
    )
    assistant_confidence_threshold = models.FloatField(
        null=True, blank=True, help_text="Or: the draft proposes while its confidence stays above this (0-1)."
    )
    allow_inexact_sampling = models.BooleanField(
        default=False, help_text="INEXACT: let sampled requests (temperature > 0) use openvino-genai's own draft "
                                 "verification, whose answers are not drawn from the main model's distribution. "
                                 "Off: they run exactly.")
    speculation_profile = models.JSONField(
        default=dict, blank=True, help_text="Best K by concurrent streams, measured by the benchmark: "
        '{"greedy": {"1": 4, "8": 2, "16": 0}, "sampled": {...}} (0 = the main alone is faster). New requests '
        "that name no K get the entry for the worker's load; empty: the default K above.")
    profile_run = models.ForeignKey("BenchmarkRun", null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="+", help_text="The benchmark run the profile comes from.")
    max_new_tokens_cap = models.PositiveIntegerField(default=512, help_text="No request may ask for more new tokens.")
    chat_sampling = models.JSONField(
        default=dict, blank=True,
        help_text='How the chat samples when its options set none: the publisher\'s settings, e.g. {"temperature": '
        '0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05} (an imported pair reads its '
        'generation_config.json; the catalogue pins a GGUF\'s). Empty: greedy. The API keeps its own defaults: a '
        'script asks for what it wants.')
    cache_size_gb = models.PositiveSmallIntegerField(default=1, help_text="KV cache of the scheduler, in GB.")
    max_num_batched_tokens = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(32)],
        help_text="Tokens one scheduler step may process. With prefill first (below) it is at least the model's "
                  "context. Without, prompt chunks and decodes share a step (long prompts are split and prefilled "
                  "beside the running answers); empty: the library's 256, and smaller lets a burst's first "
                  "answers start sooner at some cost in tokens/s.")
    prefill_first = models.BooleanField(
        default=True, help_text="A new request's whole prompt is prefilled in a step of its own, before the running "
        "answers' next step (the library's dynamic_split_fuse off; a step then holds up to the model's context, "
        "so any prompt fits). Off: prompts are split and fused with the running answers' steps. Measured on the "
        "demo pair at a steady 8 streams: K=5's time to first token 255 -> 177 ms, tokens/s unchanged.")
    inference_precision = models.CharField(max_length=8, choices=Precision.choices, default=Precision.F32, blank=True)
    kv_cache_precision = models.CharField(
        max_length=8, choices=KvPrecision.choices, default=KvPrecision.F32, blank=True,
        help_text="f32 keeps speculative greedy output identical to the main alone (u8 flipped 1 in 48 here)."
    )
    own_engine_streams = models.PositiveSmallIntegerField(
        default=0, validators=[MaxValueValidator(64)],
        help_text="While the pair runs at most this many answers on a worker, SpecChat's own engine speculates for "
        "them (greedy, sampled or the main alone; 0: never), exact with the CPU's dynamic quantization (the fastest "
        "way to run an int8 main alone), which the library's speculative pipeline is not; beyond this many, answers "
        "run on the main alone there, batched (unless they name a K). One copy of the weights. Set it where "
        "`compare_modes --streams` shows speculation stop paying. Needs a draft model and the exact mode.")
    enabled = models.BooleanField(default=True)
    is_default = models.BooleanField(
        default=False, help_text="The chat's pair for a new conversation (at most one: setting it here unsets it "
        "elsewhere). None set: the first enabled pair by name.")
    description = models.TextField(
        blank=True, help_text="What the pair is for, in a sentence or two: shown in the chat's picker and empty "
        "conversation.")
    completes_text = models.BooleanField(
        default=False, help_text="A completion model (code): its answers continue the user's text, so the chat "
        "shows prompt and answer as one code block.")
    # Last load reported by a worker (the live state comes from worker heartbeats).
    load_error = models.TextField(blank=True)
    load_reported_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def save(self, *args, **kwargs) -> None:
        """One default pair: a pair made the default takes the mark from the others."""
        super().save(*args, **kwargs)
        if self.is_default:
            ModelPair.objects.filter(is_default=True).exclude(pk=self.pk).update(is_default=False)

    @property
    def queue(self) -> str:
        return f"pair.{self.slug}"

    EXACT, FAST = "exact", "fast"

    @property
    def precision_mode(self) -> str:
        """Exact: f32 activations and KV cache, so greedy answers with the draft are the main alone's token for
        token; fast: the device's defaults (the fastest main alone), where near-ties can flip."""
        exact = self.inference_precision == self.Precision.F32 and self.kv_cache_precision == self.KvPrecision.F32
        return self.EXACT if exact else self.FAST

    @property
    def is_speculative(self) -> bool:
        return bool(self.draft_dir) or self.prompt_lookup

    @property
    def draft_runs_on(self) -> str:
        return self.draft_device or self.device

    @property
    def runs_on(self) -> str:
        """Its devices as a host's calibration is keyed by (serving/host.py): "CPU", or "GPU, draft on CPU"."""
        draft = self.draft_runs_on if self.draft_dir else self.device
        return self.device if draft == self.device else f"{self.device}, draft on {draft}"

    @property
    def devices(self) -> dict[str, str | None]:
        """Where each model runs, as /v1/config and the admin show it (the draft: None without one)."""
        return {"main": self.device, "draft": self.draft_runs_on if self.draft_dir else None}

    def clean(self) -> None:
        from inference import transport
        from inference.pair_checks import (  # they load openvino: only when used
            chat_sampling_errors,
            device_errors,
            profile_errors,
            registrable_devices,
            validate_pair_fields,
        )

        errors = validate_pair_fields(
            main_dir=self.main_dir,
            draft_dir=self.draft_dir,
            draft_alternative_dir=self.draft_alternative_dir,
            prompt_lookup=self.prompt_lookup,
            num_assistant_tokens=self.num_assistant_tokens,
            assistant_confidence_threshold=self.assistant_confidence_threshold,
            max_new_tokens_cap=self.max_new_tokens_cap,
        )
        if problems := profile_errors(self.speculation_profile):
            errors["speculation_profile"] = "Invalid profile: " + "; ".join(problems) + "."
        if problems := chat_sampling_errors(self.chat_sampling):
            errors["chat_sampling"] = "Invalid sampling: " + "; ".join(problems) + "."
        if self.own_engine_streams and not (self.draft_dir and self.precision_mode == self.EXACT):
            errors["own_engine_streams"] = "The own engine needs a draft model and the exact mode (f32)."
        stored = ModelPair.objects.filter(pk=self.pk).values_list("device", "draft_device").first()
        if stored != (self.device, self.draft_device):  # new or moved: other edits pass while its worker is away
            errors.update(device_errors(device=self.device, draft_device=self.draft_device,
                                        has_draft=bool(self.draft_dir),
                                        available=registrable_devices(client=transport.fail_fast_client())))
        if errors:
            raise ValidationError(errors)


def writing_rate(*, tokens: int | None, duration_ms: float | None, ttft_ms: float | None) -> float | None:
    """Tokens/s once the first token was out, the one rate every figure a person reads uses (the chat's line, the
    admin's lists and speed-ups): the wait for the first token is a figure of its own. None for an answer of one
    token (no time to divide)."""
    if not tokens or tokens < 2 or duration_ms is None or duration_ms <= (ttft_ms or 0):
        return None
    return (tokens - 1) / ((duration_ms - (ttft_ms or 0)) / 1000)


class Generation(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        FINISHED = "finished"
        STOPPED = "stopped"
        FAILED = "failed"

    class Source(models.TextChoices):
        CHAT = "chat"
        API = "api"
        BENCHMARK = "benchmark"
        TITLE = "title"  # a chat's title, written by the pair after its first answer (chat/services.py)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    pair = models.ForeignKey(ModelPair, on_delete=models.PROTECT, related_name="generations")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    source = models.CharField(max_length=10, choices=Source.choices, default=Source.CHAT)
    api_key = models.ForeignKey("ApiKey", null=True, blank=True, on_delete=models.SET_NULL, related_name="generations")
    prompt = models.TextField(help_text="The exact text the model was given (chat template applied).")
    params = models.JSONField(default=dict)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED)
    worker = models.CharField(max_length=200, blank=True)
    routed_to = models.CharField(max_length=200, blank=True, help_text="The worker whose own queue the web side sent "
                                 "it to (serving/routing.py); empty: the pair's shared queue.")
    text = models.TextField(blank=True)
    steps = models.JSONField(default=list, blank=True,
                             help_text="Per main step: [accepted draft text, main's token text], and its tokens' "
                             "[[text, logprob], ...] when the request asked for logprobs.")
    finish_reason = models.CharField(max_length=20, blank=True)
    speculative_mode = models.CharField(max_length=30, blank=True, help_text="How the answer was served: draft, "
                                        "draft-exact-sampling, draft-inexact-sampling, prompt-lookup or off.")
    speculative_reason = models.CharField(max_length=1000, blank=True,
                                          help_text="Why this mode and K (and where the answer was handed over).")
    speculative_k = models.PositiveSmallIntegerField(null=True, blank=True, help_text="K used (fixed-K modes).")
    speculative_route = models.CharField(max_length=30, blank=True, help_text="The engine that served the answer: "
                                         "library-speculative, prompt-lookup, library-main-alone, own-speculative "
                                         "or own-main-alone (limits.Route).")
    speculative_reason_codes = models.JSONField(default=list, blank=True,
                                                help_text="The codes the reason's sentence is made from "
                                                          "(serving/reasons.py, Reason).")
    error = models.TextField(blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    cached_tokens = models.PositiveIntegerField(default=0, help_text="prompt tokens found in the prefix cache")
    completion_tokens = models.PositiveIntegerField(default=0)
    ttft_ms = models.FloatField(null=True, blank=True)
    tokens_per_s = models.FloatField(null=True, blank=True)
    duration_ms = models.FloatField(null=True, blank=True)
    main_steps = models.PositiveIntegerField(default=0)
    draft_tokens = models.PositiveIntegerField(null=True, blank=True)
    accepted_tokens = models.PositiveIntegerField(null=True, blank=True)
    draft_steps = models.PositiveIntegerField(null=True, blank=True, help_text="main steps that verified a draft")
    acceptance_rate = models.FloatField(null=True, blank=True)
    mean_accepted_length = models.FloatField(null=True, blank=True)
    accepted_by_position = models.JSONField(default=list, blank=True)
    ngram_draft_tokens = models.PositiveIntegerField(null=True, blank=True,
                                                     help_text="of draft_tokens, those the n-gram lookup proposed")
    ngram_accepted_tokens = models.PositiveIntegerField(null=True, blank=True,
                                                        help_text="of accepted_tokens, the n-gram lookup's")
    ngram_draft_steps = models.PositiveIntegerField(null=True, blank=True,
                                                    help_text="of draft_steps, those that verified the n-gram lookup's")
    undrafted_steps = models.PositiveIntegerField(null=True, blank=True,
                                                  help_text="main steps with nothing proposed (drafters sat out)")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.pair.slug} {self.status} {self.id}"

    @property
    def is_done(self) -> bool:
        return self.status in {self.Status.FINISHED, self.Status.STOPPED, self.Status.FAILED}

    @property
    def writing_tokens_per_s(self) -> float | None:
        return writing_rate(tokens=self.completion_tokens, duration_ms=self.duration_ms, ttft_ms=self.ttft_ms)


class JobStatus(models.TextChoices):
    """Where a background job (benchmark, import) stands."""

    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"


class ApiKey(models.Model):
    """A REST API key. Only its SHA-256 is stored; the key itself is shown once, when created."""

    name = models.CharField(max_length=100)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE)
    prefix = models.CharField(max_length=12, editable=False, help_text="The key's first characters, to recognise it.")
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    max_concurrent = models.PositiveSmallIntegerField(default=4, help_text="Generations at once; more answer 429.")
    revoked = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class Job(models.Model):
    """A background job run by one worker, which holds a lease on it while it runs (inference/jobs.py):
    a job whose lease ran out lost its worker and is failed, never left running."""

    Status = JobStatus

    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED)
    progress = models.CharField(max_length=200, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True, editable=False,
                                       help_text="Renewed by the worker running the job.")

    class Meta:
        abstract = True
        ordering = ["-created_at"]


class BenchmarkRun(Job):
    """A benchmark of one pair, started from the admin or `manage.py benchmark`; results and plots kept."""

    pair = models.ForeignKey(ModelPair, on_delete=models.CASCADE, related_name="benchmarks")
    options = models.JSONField(default=dict, blank=True)
    results = models.JSONField(default=dict, blank=True)
    report_dir = models.CharField(max_length=500, blank=True, help_text="Folder with results.json and the PNG plots.")

    def __str__(self) -> str:
        return f"Benchmark #{self.pk} of {self.pair.name} ({self.status})"


class HostCalibration(Job):
    """What a pair measured on one host (serving/calibration.py): the main alone in each precision
    configuration the device offers, the own engine per K, and the cost of verifying n tokens. A worker serves
    a pair from the calibration of its own host; a host never seen is calibrated when the pair loads there."""

    pair = models.ForeignKey(ModelPair, on_delete=models.CASCADE, related_name="calibrations")
    host = models.CharField(max_length=64, db_index=True, help_text="The host's signature: CPU model, ISA flags, "
                            "cores, runtime version and device, hashed.")
    host_facts = models.JSONField(default=dict, blank=True, help_text="What the signature is made of.")
    results = models.JSONField(default=dict, blank=True)

    def __str__(self) -> str:
        return f"calibration of {self.pair.slug} on {self.host_facts.get('cpu', self.host[:12])} ({self.status})"


class ImportJob(Job):
    """Export of a main/draft pair (Hugging Face or GGUF) to OpenVINO IR and its registration, run by a worker."""

    name = models.CharField(max_length=100)
    slug = models.CharField(max_length=60, validators=[pair_slug])
    main_source = models.CharField(max_length=500, help_text="Hugging Face id, local folder or GGUF file.")
    draft_source = models.CharField(max_length=500, blank=True)
    weight_format = models.CharField(max_length=8, default="int8")
    draft_weight_format = models.CharField(max_length=8, blank=True, help_text="Empty: the main's weight format.")
    draft_alternative_format = models.CharField(
        max_length=8, blank=True, help_text="The draft exported in this format too; each host's calibration keeps "
                                            "the cheaper. Empty: one draft.")
    main_sha256 = models.CharField(max_length=64, blank=True,
                                   help_text="A GGUF file's published sha256; the import refuses other bytes.")
    draft_sha256 = models.CharField(max_length=64, blank=True)
    kv_cache_precision = models.CharField(max_length=8, blank=True)
    device = models.CharField("main device", max_length=8, default="CPU")
    draft_device = models.CharField("draft device", max_length=8, blank=True, help_text="Empty: the main's device.")
    log = models.TextField(blank=True)
    pair = models.ForeignKey(ModelPair, null=True, blank=True, on_delete=models.SET_NULL)

    def __str__(self) -> str:
        return f"import of {self.slug} ({self.status})"
