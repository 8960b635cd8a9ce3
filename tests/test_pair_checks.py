"""Registering pairs: what the admin accepts, what it refuses and why, and that a refusal saves nothing; a
speculation profile refused when invalid, and one already stored serving requests on the default K."""

import json
import os
from pathlib import Path

import pytest
from django.conf import settings
from django.core.exceptions import ValidationError
from django.test import Client

from inference.limits import K_MAX
from inference.models import ModelPair
from inference.pair_checks import validate_pair_fields
from inference.serving import planning
from inference.serving.reasons import Reason

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def models_root(tmp_path) -> Path:
    """A models root holding the demo pair, a draft with another tokenizer, and an incomplete folder; the
    demo's folders are symlinks to outside it, which the policy accepts (docs/deploy.md)."""
    demo = settings.MODELS_ROOT / settings.DEMO_PAIR_DIR
    (tmp_path / "main").symlink_to(demo / "main")
    (tmp_path / "draft").symlink_to(demo / "draft")
    other = tmp_path / "other-tokenizer-draft"
    other.mkdir()
    for name in ("openvino_model.xml", "openvino_model.bin"):
        (other / name).symlink_to(demo / "draft" / name)
    for name in os.listdir(FIXTURES / "other_tokenizer"):
        (other / name).symlink_to(FIXTURES / "other_tokenizer" / name)
    (tmp_path / "empty").mkdir()
    return tmp_path


def fields(**overrides) -> dict:
    base = {"main_dir": "main", "draft_dir": "draft", "prompt_lookup": False, "num_assistant_tokens": 4,
                "assistant_confidence_threshold": None, "max_new_tokens_cap": 512}
    return {**base, **overrides}


def test_demo_pair_is_valid(models_root):
    assert validate_pair_fields(**fields(), root=models_root) == {}


@pytest.mark.parametrize("overrides, field, words", [
    ({"main_dir": "../etc"}, "main_dir", "outside the models root"),
    ({"main_dir": "/etc"}, "main_dir", "outside the models root"),
    ({"main_dir": "missing"}, "main_dir", "No folder"),
    ({"draft_dir": "empty"}, "draft_dir", "lacks openvino_model.xml"),
    ({"main_dir": ""}, "main_dir", "required"),
    ({"draft_dir": "other-tokenizer-draft"}, "draft_dir", "not the main's"),
    ({"num_assistant_tokens": 4, "assistant_confidence_threshold": 0.5}, "assistant_confidence_threshold", "not both"),
    ({"num_assistant_tokens": None}, "num_assistant_tokens", "needs a default"),
    ({"num_assistant_tokens": 33}, "num_assistant_tokens", "between 1 and 32"),
    ({"num_assistant_tokens": 0}, "num_assistant_tokens", "between 1 and 32"),
    ({"num_assistant_tokens": None, "assistant_confidence_threshold": 1.0}, "assistant_confidence_threshold", "between 0 and 1"),
    ({"prompt_lookup": True}, "prompt_lookup", "cannot be combined"),
    ({"max_new_tokens_cap": 0}, "max_new_tokens_cap", "at least 1"),
])
def test_bad_pair_settings_are_refused(models_root, overrides, field, words):
    errors = validate_pair_fields(**fields(**overrides), root=models_root)
    assert field in errors and words in errors[field], errors


def test_tokenizer_mismatch_names_what_differs(models_root):
    message = validate_pair_fields(**fields(draft_dir="other-tokenizer-draft"), root=models_root)["draft_dir"]
    assert "vocabulary sizes differ" in message and "probe" in message


def test_prompt_lookup_without_draft_is_valid(models_root):
    assert validate_pair_fields(**fields(draft_dir="", prompt_lookup=True), root=models_root) == {}


@pytest.fixture
def admin_client(client, django_user_model):
    admin = django_user_model.objects.create_superuser(username="root", password="root-password")
    client.force_login(admin)
    return client


def admin_form(**overrides) -> dict:
    data = {"name": "Mine", "slug": "mine", "main_dir": "main", "draft_dir": "draft", "max_ngram_size": 3,
            "device": "CPU", "num_assistant_tokens": 4, "assistant_confidence_threshold": "",
            "max_new_tokens_cap": 512, "cache_size_gb": 1, "inference_precision": "f32",
            "kv_cache_precision": "u8", "own_engine_streams": 0, "enabled": "on"}
    return {**data, **overrides}


def test_admin_registers_a_valid_pair(admin_client, models_root, settings):
    settings.MODELS_ROOT = models_root
    response = admin_client.post("/admin/inference/modelpair/add/", admin_form())
    assert response.status_code == 302, response.content[:2000]
    pair = ModelPair.objects.get(slug="mine")
    assert pair.queue == "pair.mine" and pair.is_speculative


def test_admin_shows_form_errors_and_saves_nothing(admin_client, models_root, settings):
    settings.MODELS_ROOT = models_root
    response = admin_client.post("/admin/inference/modelpair/add/", admin_form(draft_dir="other-tokenizer-draft"))
    assert response.status_code == 200
    assert "The draft&#x27;s tokenizer is not the main&#x27;s" in response.content.decode()
    response = admin_client.post("/admin/inference/modelpair/add/", admin_form(main_dir="../../etc"))
    assert "outside the models root" in response.content.decode()
    assert not ModelPair.objects.exists()


INVALID_PROFILES = [{"greedy": {"1": "five"}}, {"greedy": {"one": 2}}, {"greedy": [1, 2]}, {"fast": {"1": 2}},
                    {"greedy": {"1": K_MAX + 1}}, {"sampled": {"1": True}}, ["greedy"]]


@pytest.mark.parametrize("profile", INVALID_PROFILES)
def test_an_invalid_speculation_profile_is_refused_by_the_pairs_validation(demo_pair, profile):
    demo_pair.speculation_profile = profile
    with pytest.raises(ValidationError) as refused:
        demo_pair.full_clean()
    assert "speculation_profile" in refused.value.message_dict
    demo_pair.speculation_profile = {"greedy": {"1": 4, "8": 0}, "sampled": {"1": 3}}
    demo_pair.full_clean()


def test_a_stored_invalid_profile_serves_on_the_default_k(demo_pair, celery_worker, api_key):
    """Saved around validation (an old row, a script): each request of the pair was a 500."""
    ModelPair.objects.filter(id=demo_pair.id).update(speculation_profile={"greedy": {"1": "five"}})
    response = Client().post("/v1/completions", data=json.dumps({
        "model": demo_pair.slug, "prompt": "def add(a, b):", "max_tokens": 8}), content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {api_key.secret}")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["choices"][0]["text"]
    planned = planning.plan(pair=ModelPair.objects.get(id=demo_pair.id), asked=planning.Asked(),
                               load=planning.Load(streams=1))
    assert planned.k == (demo_pair.num_assistant_tokens or 5)
    assert planned.reasons == (Reason.PAIR_DEFAULT_K_INVALID_PROFILE,)
    assert "profile is invalid" in planned.reason
