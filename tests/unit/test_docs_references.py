"""README.md and docs/*.md name only what exists: a newcomer who follows a name finds it.

What counts as a reference:
- a backticked path into the project (`engines/own/engine.py`, `engines/own/scheduler.py`, `tests/...`, `templates/`):
  the file or folder exists (a path not starting at the root is read from inference/; model folders aside); a module's path with a
  name after it (`inference/selectors.generation_for_user`): the module has it;
- a backticked dotted name whose first part is one of the project's modules, by its full dotted path or its
  last name (`web.start_generation`, `readers.StepAligner`, `limits.Route`, `inference.serving.web`): every
  further part is an attribute of that module (or a submodule);
- a `SPECCHAT_*` name: a setting some code or the tooling reads (chatsite/settings.py, the Makefile, compose.yaml,
  the Dockerfile, tests/);
- a link to another local file (`[text](docs/api.md#anchor)`): the file exists, and so does a heading the
  anchor names.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "tests" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PACKAGES = ("inference", "chatsite")
PATH_STARTS = ("inference/", "chatsite/", "tests/", "templates/", "docs/", "engines/", "serving/", "api/",
               "pairs/", "benchmark/", "demo/")
MODEL_FOLDERS = "inference/models/"  # the pairs' weights: data, some grown by `make demo-main`, not the code's names
BACKTICKED = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")
SETTING = re.compile(r"\bSPECCHAT_[A-Z0-9_]*[A-Z0-9]\b")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def project_modules() -> dict[str, list[str]]:
    """Each module's full dotted path and its last name -> the full dotted paths they name."""
    names: dict[str, list[str]] = {}
    for package in PACKAGES:
        for file in (ROOT / package).rglob("*.py"):
            parts = file.relative_to(ROOT).with_suffix("").parts
            if "migrations" in parts or file.is_relative_to(ROOT / "inference" / "models"):
                continue  # not named in the docs; the demo pair's folders hold no module
            if parts[-1] == "__init__":
                parts = parts[:-1]
            full = ".".join(parts)
            for name in {full, parts[-1]}:
                names.setdefault(name, []).append(full)
    return names


MODULES = project_modules()


def resolves(module: str, attributes: list[str]) -> bool:
    target = importlib.import_module(module)
    for name in attributes:
        if hasattr(target, name):
            target = getattr(target, name)
            continue
        try:
            target = importlib.import_module(f"{target.__name__}.{name}")
        except (AttributeError, ModuleNotFoundError):
            return False
    return True


def dotted_name_problem(text: str) -> str | None:
    parts = text.split(".")
    for split in range(len(parts), 0, -1):  # the longest prefix that names a module
        candidates = MODULES.get(".".join(parts[:split]))
        if candidates:
            if any(resolves(module, parts[split:]) for module in candidates):
                return None
            return f"`{text}`: {' or '.join(candidates)} has no {'.'.join(parts[split:])}"
    return None  # not the project's name (a library's, a file name, a JSON field)


def path_problem(text: str) -> str | None:
    path = text.split("#", maxsplit=1)[0].split(" ", maxsplit=1)[0].rstrip(":,")
    if not path.startswith(PATH_STARTS) or path.startswith(MODEL_FOLDERS) or any(c in path for c in "*{<"):
        return None
    if (ROOT / path).exists() or (ROOT / "inference" / path).exists():
        return None
    module, dot, attribute = path.rpartition(".")
    if dot and "/" not in attribute and (ROOT / f"{module}.py").exists():  # a module's path, then a name in it
        return dotted_name_problem(f"{module.replace('/', '.')}.{attribute}")
    return f"`{text}`: no such file or folder"


def heading_anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def link_problem(doc: Path, target: str) -> str | None:
    if re.match(r"[a-z]+:", target):
        return None  # http(s), mailto
    path, _, anchor = target.partition("#")
    file = (doc.parent / path).resolve() if path else doc
    if not file.exists():
        return f"link {target}: no such file"
    if anchor and file.suffix == ".md":
        headings = [line.lstrip("#") for line in file.read_text().splitlines() if line.startswith("#")]
        if anchor not in {heading_anchor(h) for h in headings}:
            return f"link {target}: no such heading in {file.name}"
    return None


def settings_read() -> set[str]:
    sources = [ROOT / "chatsite" / "settings.py", ROOT / "Makefile", ROOT / "compose.yaml", ROOT / "Dockerfile",
               *(ROOT / "tests").rglob("*.py")]
    return {name for source in sources if source.name != Path(__file__).name
            for name in SETTING.findall(source.read_text())}


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: doc.name)
def test_every_module_function_path_and_setting_a_doc_names_exists(doc):
    text = doc.read_text()
    problems = []
    for quoted in BACKTICKED.findall(text):
        if DOTTED.fullmatch(quoted):
            problems.append(dotted_name_problem(quoted))
        problems.append(path_problem(quoted))
    known = settings_read()
    problems += [f"{name}: no code reads it" for name in sorted(set(SETTING.findall(text)) - known)]
    problems += [link_problem(doc, target) for target in LINK.findall(text)]
    assert [problem for problem in problems if problem] == []


def test_the_checks_catch_a_wrong_name():
    assert dotted_name_problem("web.start_generation") is None
    assert dotted_name_problem("readers.StepAligner") is None
    assert dotted_name_problem("web.follow_generation") == "`web.follow_generation`: inference.serving.web has no follow_generation"
    assert path_problem("inference/engines/base.py") is not None
    assert path_problem("engines/own/scheduler.py") is None
    assert path_problem("inference/selectors.generation_for_user") is None
    assert path_problem("inference/selectors.no_such_function") is not None
    assert link_problem(ROOT / "README.md", "docs/exactness.md#no-such-heading") is not None
    assert link_problem(ROOT / "README.md", "docs/exactness.md#greedy-identity-and-the-cpus-kernels") is None
    assert "SPECCHAT_NO_SUCH_SETTING" not in settings_read()
