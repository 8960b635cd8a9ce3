"""Which tokens a real pair's draft head keeps (engines/own/draft_head.py cuts it to them when the own engine loads it).

The most frequent `size` tokens in text like the answers the draft proposes, counted with the pair's tokenizer on
what every machine that installs the pair has, with no network: the standard library of the Python running this
(code and docstrings, tests left out) and this repository's code and docs. Added to them, the tokens a vocabulary
cannot do without: special and added tokens, the 256 single-byte tokens (every text can still be spelled, so a
grammar always finds an allowed token among them) and the chat template's. Deterministic: counts are summed over the
files, ties broken by id. `make real-pair` writes the list beside the draft's IR (and its cache) once.

Coverage is what decides the size: a token the main writes outside the list ends the draft's run there (the main's
verification still gives the main's token), so acceptance falls by about the share of the main's tokens it misses.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sysconfig
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from inference.engines.grammar.constraint import vocabulary
from inference.engines.spec import HEAD_IDS_FILE
from inference.engines.tokenizer import load_tokenizer

ABOUT_FILE = "head_vocabulary.json"
REPOSITORY = Path(__file__).resolve().parents[2]
REPOSITORY_PARTS = ("README.md", "docs", "inference", "chatsite", "templates")
REPOSITORY_SUFFIXES = {".py", ".md", ".html", ".js", ".css"}
PACKAGE_SUFFIXES = REPOSITORY_SUFFIXES | {".rst", ".txt", ".h", ".hpp", ".c", ".cc", ".cpp"}
LEFT_OUT = {"site-packages", "test", "tests", "testing", "idle_test"}  # tests hold odd data
CHUNK_CHARS = 1 << 16
COUNT_BATCH = 1 << 22  # ids counted at once
TEMPLATE_TURNS = [{"role": "system", "content": "You are a helpful assistant."},
                  {"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi."},
                  {"role": "user", "content": "Thanks"}]


def corpus_files() -> list[Path]:
    """The files counted, sorted: the standard library's modules; the installed packages' code, headers and docs
    (this environment's site-packages, which `make real-pair` fills with the train extra); the repository's."""
    paths = sysconfig.get_paths()
    stdlib, packages = Path(paths["stdlib"]), Path(paths["purelib"])
    files = _found(stdlib, stdlib.rglob("*.py"), {".py"})
    files += _found(packages, packages.rglob("*"), PACKAGE_SUFFIXES, names={"METADATA"})
    for part in REPOSITORY_PARTS:
        root = REPOSITORY / part
        files += _found(REPOSITORY, [root] if root.is_file() else root.rglob("*"), REPOSITORY_SUFFIXES)
    return sorted(set(files))


def _found(root: Path, paths: Iterable[Path], suffixes: set[str], names: frozenset | set = frozenset()) -> list[Path]:
    return [path for path in paths if (path.suffix in suffixes or path.name in names) and path.is_file()
            and not LEFT_OUT & set(path.relative_to(root).parts)]


def chunks(text: str) -> Iterator[str]:
    """The text in pieces of about CHUNK_CHARS, cut after a line: a tokenizer's memory stays small."""
    start = 0
    while start < len(text):
        end = text.find("\n", start + CHUNK_CHARS)
        end = len(text) if end < 0 else end + 1
        yield text[start:end]
        start = end


def token_counts(model_dir: str | Path, files: list[Path], *, width: int) -> np.ndarray:
    """How often each token id occurs in the files, tokenized as the pair tokenizes (a file per thread: the
    tokenizer lets go of the GIL)."""
    tokenizer = load_tokenizer(model_dir)

    def file_ids(path: Path) -> np.ndarray:
        text = path.read_text(encoding="utf-8", errors="replace")
        return np.concatenate([tokenizer.encode(piece, add_special_tokens=False).input_ids.data[0]
                               for piece in chunks(text)] or [np.zeros(0, dtype=np.int64)])

    counts = np.zeros(width, dtype=np.int64)
    pending: list[np.ndarray] = [np.zeros(0, dtype=np.int64)]
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        for ids in pool.map(file_ids, files):
            pending.append(ids)
            if sum(map(len, pending)) > COUNT_BATCH:
                counts += np.bincount(np.concatenate(pending), minlength=width)[:width]
                pending = [np.zeros(0, dtype=np.int64)]
    return counts + np.bincount(np.concatenate(pending), minlength=width)[:width]


def essential_ids(model_dir: str | Path) -> set[int]:
    """Tokens kept whatever their count: special and added ones, single bytes, the chat template's."""
    tokens, special = vocabulary(str(model_dir))
    ids = set(special) | {i for i, token in enumerate(tokens) if len(token) == 1}
    config = Path(model_dir, "tokenizer_config.json")
    if config.is_file():
        ids |= {int(i) for i in json.loads(config.read_text()).get("added_tokens_decoder", {})}
    tokenizer = load_tokenizer(model_dir)
    if tokenizer.chat_template:
        rendered = tokenizer.apply_chat_template(TEMPLATE_TURNS, add_generation_prompt=True)
        ids |= {int(i) for i in tokenizer.encode(rendered, add_special_tokens=False).input_ids.data[0]}
    return ids


def head_vocabulary(model_dir: str | Path, *, size: int, counts: np.ndarray | None = None) -> np.ndarray:
    """The ids the head keeps, ascending: the `size` most frequent in the corpus (those seen at all), and the
    essential ones. `counts`: the corpus's counts when already made (as wide as the vocabulary)."""
    width = len(vocabulary(str(model_dir))[0])
    if counts is None:
        counts = token_counts(model_dir, corpus_files(), width=width)
    seen = np.flatnonzero(counts)
    ranked = seen[np.lexsort((seen, -counts[seen]))]  # most frequent first, then by id
    return np.array(sorted(set(ranked[:size].tolist()) | essential_ids(model_dir)), dtype=np.int32)


def write_head_vocabulary(draft_dir: Path, *, size: int) -> Path:
    """The draft's list, made once for a size; beside it, what it was made of (JSON). Written under a temporary
    name, then renamed."""
    target, about = draft_dir / HEAD_IDS_FILE, draft_dir / ABOUT_FILE
    if target.is_file() and about.is_file() and json.loads(about.read_text()).get("size") == size:
        return target
    files = corpus_files()
    counts = token_counts(draft_dir, files, width=len(vocabulary(str(draft_dir))[0]))
    ids = head_vocabulary(draft_dir, size=size, counts=counts)
    partial = draft_dir / f".{HEAD_IDS_FILE}.partial.npy"
    np.save(partial, ids)
    partial.rename(target)
    about.write_text(json.dumps({"size": size, "ids": len(ids), "python": platform.python_version(),
                                 "files": len(files), "tokens_counted": int(counts.sum())}) + "\n")
    return target


def place_head_vocabulary(*, folder: Path, cache: Path, size: int) -> Path:
    """The list in the pair's draft folder, made in the IR's cache when there is one (a fresh clone links it from
    there, as it links the IR) and linked into the folder."""
    draft, kept = folder / "draft", cache / "draft"
    home = kept if kept.is_dir() else draft
    made = write_head_vocabulary(home, size=size)
    if home != draft:
        for name in (HEAD_IDS_FILE, ABOUT_FILE):
            (draft / name).unlink(missing_ok=True)
            try:
                os.link(home / name, draft / name)
            except OSError:
                shutil.copy2(home / name, draft / name)
    return draft / made.name
