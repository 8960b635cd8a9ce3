"""The prompts a benchmark runs: the held-out sets kept in the repo or a user's own file, and the
measure of how much an answer repeats itself (acceptance on looping answers says nothing)."""
from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PROMPTS_FILE = Path(__file__).resolve().parents[1] / "prompts" / "heldout.json"


@dataclass(frozen=True)
class Prompt:
    text: str
    set: str = ""
    private: bool = False  # a user's (replayed from the history): results name it by a digest, not its text

    @property
    def shown(self) -> str:
        """The prompt as results and reports keep it: kept result files and runs outlive the history's
        retention, so a user's prompt is never copied into them."""
        return f"sha256:{hashlib.sha256(self.text.encode()).hexdigest()[:16]}" if self.private else self.text


WORDS = re.compile(r"\w+|[^\w\s]")  # words and single punctuation marks: code and prose alike, no tokenizer needed


def repeated_ngram_share(text: str, n: int = 4) -> float:
    """The share of the text's n-grams (of words and punctuation marks) already seen earlier in it:
    about 0 for ordinary prose or code, towards 1 for an answer stuck in a loop, which any draft
    predicts and whose acceptance says nothing about real answers."""
    words = WORDS.findall(text)
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    if not grams:
        return 0.0
    seen: set[tuple[str, ...]] = set()
    repeated = 0
    for gram in grams:
        repeated += gram in seen
        seen.add(gram)
    return repeated / len(grams)


def prompts_from_file(path: Path, *, render_chat: Callable[[list[dict]], str]) -> list[Prompt]:
    """A user's prompts: a JSON list or JSON Lines, each item a string, {"prompt": text} or {"messages":
    [{"role", "content"}, ...]} (rendered with `render_chat`, the pair's chat template). The set is
    named after the file. ValueError naming the item for anything else."""
    raw = path.read_text(encoding="utf-8")
    try:
        items = json.loads(raw) if raw.lstrip().startswith("[") else [
            json.loads(line) for line in raw.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path.name}: not JSON or JSON Lines ({exc})") from exc
    if not items:
        raise ValueError(f"{path.name}: no prompts")
    prompts = []
    for index, item in enumerate(items, 1):
        text: object
        if isinstance(item, dict) and isinstance(item.get("messages"), list):
            text = render_chat(item["messages"])
        else:
            text = item.get("prompt") if isinstance(item, dict) else item
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{path.name}, item {index}: expected a non-empty string, {{\"prompt\": text}} or "
                             f"{{\"messages\": [...]}}")
        prompts.append(Prompt(text, path.stem))
    return prompts


def heldout_prompts(*, sets: tuple[str, ...] = ("code", "prose"), per_set: int | None = None) -> list[Prompt]:
    """The held-out prompts kept in the repo (the demo pair never saw them), the first `per_set` of each set."""
    data = json.loads(PROMPTS_FILE.read_text())
    unknown = [s for s in sets if not isinstance(data.get(s), list)]
    if unknown:
        raise ValueError(f"no prompt set {', '.join(unknown)} in {PROMPTS_FILE.name}")
    return [Prompt(text, name) for name in sets for text in data[name][:per_set]]
