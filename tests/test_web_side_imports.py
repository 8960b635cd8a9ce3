"""The web side (daphne's application, the chat, the REST API, the one generation path) imports no openvino.

It does not plan (the worker does, serving/planning) nor check settings against the library's GenerationConfig
(its own range checks cover what a request may set). It still counts a request's prompt with the main's OpenVINO
tokenizer, so the bar is "none at import": openvino loads with the first prompt counted (pair_checks.load_tokenizer).
Grammars are compiled in checker processes (engines/grammar/checks.py), so llguidance is not loaded either.
"""

import json
import os
import subprocess
import sys

from django.conf import settings

HEAVY = ("openvino", "openvino_genai", "openvino_tokenizers", "llguidance")

FRESH_WEB_PROCESS = """
import importlib, json, pkgutil, sys

HEAVY = tuple(sys.argv[1:])

import chatsite.asgi  # daphne's application: Django set up, the admin registered, the middleware built
import chatsite.celery  # the web sends tasks through this app
from django.urls import get_resolver

def every_view(patterns):
    for pattern in patterns:
        if hasattr(pattern, "url_patterns"):
            yield from every_view(pattern.url_patterns)
        else:
            yield pattern.callback

views = list(every_view(get_resolver().url_patterns))  # imports every module a URL routes to
modules = ["chatsite.chat.routing", "inference.tasks", "inference.metrics", "inference.serving.web",
           "inference.serving.readers"]
for package in ("chatsite", "inference.api"):
    root = importlib.import_module(package)
    modules += [m.name for m in pkgutil.walk_packages(root.__path__, package + ".") if ".migrations" not in m.name]
for name in modules:
    importlib.import_module(name)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in HEAVY)

from django.conf import settings
from inference import pair_checks

tokenizer = pair_checks.load_tokenizer(str(settings.MODELS_ROOT / "demo-code" / "main"))  # a request's first prompt
print(json.dumps({"views": len(views), "modules": modules, "heavy_at_import": heavy,
                  "tokens": len(tokenizer.encode("def f(x):").input_ids.data[0]),
                  "loaded_by_a_request": sorted(m for m in HEAVY if m in sys.modules)}))
"""


def test_the_web_side_imports_no_openvino_and_loads_it_with_the_first_prompt_it_counts():
    fresh = subprocess.run([sys.executable, "-c", FRESH_WEB_PROCESS, *HEAVY], cwd=settings.BASE_DIR,
                           capture_output=True, text=True, timeout=120, check=False,
                           env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"})
    assert fresh.returncode == 0, fresh.stderr
    seen = json.loads(fresh.stdout.splitlines()[-1])
    assert seen["views"] > 20 and "chatsite.chat.consumers" in seen["modules"] and "inference.api.views" in seen["modules"]
    assert seen["heavy_at_import"] == []
    assert seen["tokens"] > 0  # the tokenizer the web side counts prompts with works, from a lazy import
    assert seen["loaded_by_a_request"] == ["openvino", "openvino_genai", "openvino_tokenizers"]
