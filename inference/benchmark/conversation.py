"""The benchmark's multi-turn chat workload (`manage.py benchmark --conversations FILE`): a pasted file and follow-ups,
each turn sent with the whole history as a chat client does, timed as its user sees it.

Every line (as it ships, `speculative: false`, and each peer of --compare-url with its prompt cache on, as users run
llama-server: its main alone, its `--spec-type ngram-mod`) holds the same conversations, one turn after another,
interleaved line by line and repeated. Each line's conversations open with a system prompt of their own (the run, the
line and the repeat in it), so no line reads another's prefix from a cache, nor the same line's from an earlier run (a
peer keeps its cache between runs): each pays for its own first turn, and its follow-ups read what it kept itself.
Reported per line: the first turn's time to first token, the follow-ups' (median and longest), and tokens a second
after the first token over the turns that did not loop, and how many looped. Whether the texts are the main alone's is
not compared here: each line's own system prompt is another prompt (tests/test_engines_own_rows.py holds cached rows
bitwise equal to cold ones).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import aiohttp

from inference.benchmark.stack import STREAM_TIMEOUT, StreamError

AS_SHIPPED, MAIN_ALONE, PEER_LINE = "as it ships", "speculative: false", "peer"
LINE_SETTINGS = {AS_SHIPPED: {}, MAIN_ALONE: {"speculative": False}}


def peer_line(label: str) -> str:
    """The line of a peer server, named by its label where several are asked (`--compare-url LABEL=URL`)."""
    return f"{PEER_LINE} {label}" if label else PEER_LINE


@dataclass(frozen=True)
class Conversation:
    """A system prompt and the user's turns (the first holds what was pasted)."""

    name: str
    system: str
    turns: tuple[str, ...]


def conversations_from_file(path: Path) -> list[Conversation]:
    """A JSON list of {"name", "system", "turns": [text, ...]} (docs/benchmark/real-pair/conversations.json)."""
    try:
        data = json.loads(path.read_text())
        found = [Conversation(name=str(item["name"]), system=str(item.get("system", "")),
                              turns=tuple(str(turn) for turn in item["turns"])) for item in data]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a list of conversations with a name and turns ({exc})") from exc
    if not found or any(len(conversation.turns) < 2 for conversation in found):
        raise ValueError(f"{path}: each conversation needs two turns at least (a first one, then a follow-up)")
    return found


@dataclass(frozen=True)
class Turn:
    """One answer of a conversation, as its client saw it."""

    line: str
    conversation: str
    repeat: int
    turn: int
    prompt_tokens: int
    cached_tokens: int | None  # what the server's usage said it read from its cache
    ttft_s: float
    tokens: int
    decode_s: float  # from the first token to the last
    text: str
    end_s: float = 0.0  # from the last token to the stream's end: the answer shown as still being written meanwhile
    answer_id: str = ""  # as the API returned it: the record names the worker that served it (`served_by`)
    worker: str = ""
    away: bool = False  # a turn of another chat, opened before coming back to this one (`converse`'s `away`)
    came_back: bool = False  # the turn the user came back with, after the chats away
    after_stop: str = ""  # the worker that served the turn before, stopped just before this one was sent

    @property
    def looped(self) -> bool:
        """The answer repeats itself: a line of 20 characters or more three times, or its second half is its first
        half again."""
        lines = [line.strip() for line in self.text.splitlines() if len(line.strip()) >= 20]
        half = len(self.text) // 2
        return (any(lines.count(line) >= 3 for line in set(lines))
                or (half >= 40 and self.text[half:].strip() in self.text[:half]))


@dataclass(frozen=True)
class Endpoint:
    """A server the lines ask: its OpenAI base URL (without /v1), model name, key and request fields of its own."""

    base_url: str
    model: str
    api_key: str
    extra: dict = field(default_factory=dict)
    stoppable: bool = False  # the benchmark's own stack, whose workers a `HolderStop` stops (a peer's are not)


async def _ask(http: aiohttp.ClientSession, endpoint: Endpoint, messages: list[dict], max_tokens: int
               ) -> tuple[str, float, float, float, int, int, int | None, str]:
    """(text, ttft, decode seconds, seconds from the last token to the end, completion tokens, prompt tokens, cached
    tokens, id) of one streamed answer."""
    body = {"model": endpoint.model, "messages": messages, "stream": True, "stream_options": {"include_usage": True},
            "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, **endpoint.extra}
    started = time.perf_counter()
    first = last = None
    pieces: list[str] = []
    usage: dict | None = None
    answer_id = ""
    headers = {"Authorization": f"Bearer {endpoint.api_key or 'none'}"}
    async with http.post(endpoint.base_url + "/v1/chat/completions", json=body, headers=headers) as response:
        if response.status != 200:
            raise StreamError(f"HTTP {response.status}: {(await response.text())[:300]}")
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data:") or (payload := line[5:].strip()) == "[DONE]":
                continue
            chunk = json.loads(payload)
            if chunk.get("error"):
                raise StreamError(f"error chunk: {chunk['error'].get('message')}")
            for choice in chunk.get("choices") or []:
                if text := (choice.get("delta") or {}).get("content"):
                    first = first or time.perf_counter()
                    last = time.perf_counter()
                    pieces.append(text)
            usage = chunk.get("usage") or usage
            answer_id = chunk.get("id") or answer_id
    ended = time.perf_counter()
    if usage is None or first is None or last is None:
        raise StreamError("the stream ended without text or usage", lost=True)
    details = usage.get("prompt_tokens_details") or {}
    return ("".join(pieces), first - started, last - first, ended - last, int(usage["completion_tokens"]),
            int(usage["prompt_tokens"]), details.get("cached_tokens"), answer_id)


async def _turn(http: aiohttp.ClientSession, endpoint: Endpoint, messages: list[dict], *, max_tokens: int,
                **fields) -> Turn:
    """One answer to `messages`, appended to them as the client keeps it."""
    answer, ttft, decode, end, tokens, prompt_tokens, cached, answer_id = await _ask(http, endpoint, messages,
                                                                                  max_tokens)
    messages.append({"role": "assistant", "content": answer})
    return Turn(prompt_tokens=prompt_tokens, cached_tokens=cached, ttft_s=ttft, tokens=tokens, decode_s=decode,
                end_s=end, text=answer, answer_id=answer_id, **fields)


@dataclass(frozen=True)
class HolderStop:
    """After turn `after_turn` of each conversation, `stop` (given the answer's id) stops the worker that served
    it and says which; the next turn is sent at once, as a user's next question reaches a service systemd is
    stopping. `restart` starts the stopped workers again between conversations."""

    after_turn: int
    stop: Callable[[str], str]
    restart: Callable[[], object]


async def converse(*, endpoint: Endpoint, line: str, conversation: Conversation, repeat: int, max_tokens: int,
                   pause_s: float, run: str, away: tuple[Conversation, ...] = (),
                   holder_stop: HolderStop | None = None, start_after_s: float = 0.0) -> list[Turn]:
    """The conversation's turns one after another, each with the history so far and the answers as they came. With
    `away`, before its last turn the user opens a chat of each (its first turn, the paste, under a system prompt of its
    own), and then comes back. With `holder_stop`, the worker holding the conversation is stopped after one turn."""
    await asyncio.sleep(start_after_s)
    def system(of: Conversation, *where: str) -> dict:
        """The conversation's system prompt after what sets this chat apart, within its first block of the cache:
        no chat starts as another (the run's lines, repeats and chats away each read their own prompt)."""
        return {"role": "system",
                "content": f"({', '.join((*where, line, f'repeat {repeat}'))}; session {run}.)\n{of.system}".strip()}

    messages = [system(conversation)]
    turns: list[Turn] = []
    stopped = ""
    async with aiohttp.ClientSession(timeout=STREAM_TIMEOUT) as http:
        for index, text in enumerate(conversation.turns):
            came_back = bool(away) and index == len(conversation.turns) - 1
            for number, other in enumerate(away if came_back else ()):
                elsewhere = [system(other, f"chat {number + 1} away"), {"role": "user", "content": other.turns[0]}]
                turns.append(await _turn(http, endpoint, elsewhere, max_tokens=max_tokens, line=line,
                                         conversation=other.name, repeat=repeat, turn=0, away=True))
            messages.append({"role": "user", "content": text})
            turns.append(await _turn(http, endpoint, messages, max_tokens=max_tokens, line=line,
                                     conversation=conversation.name, repeat=repeat, turn=index, came_back=came_back,
                                     after_stop=stopped))
            if holder_stop and index == holder_stop.after_turn and index + 1 < len(conversation.turns):
                stopped = await asyncio.to_thread(holder_stop.stop, turns[-1].answer_id)
                continue
            stopped = ""
            await asyncio.sleep(pause_s)  # the user reads the answer and types the next question
    return turns


def run_conversations(*, endpoints: dict[str, Endpoint], conversations: list[Conversation], repeats: int,
                      max_tokens: int, pause_s: float, at_once: int = 1, apart_s: float = 0.0, come_back_after: int = 0,
                      holder_stop: HolderStop | None = None, progress: Callable[[str], object] = print) -> list[Turn]:
    """Every line's conversations, a line after another within each conversation and repeat; `at_once` copies of
    each conversation run together (each its own user's, as a team's chats are), the next ones' repeats, each started
    `apart_s` after the one before (a paste that comes while the others chat).
    `come_back_after`: before each conversation's last turn, that many chats away (the next conversations' pastes in
    turn, each a chat of its own). `holder_stop`: the worker holding each conversation stopped after one turn, and
    started again before the next line's."""
    turns: list[Turn] = []
    run = secrets.token_hex(4)

    async def together(line: str, endpoint: Endpoint, conversation: Conversation, repeat: int,
                       away: tuple[Conversation, ...]) -> list[Turn]:
        chats = await asyncio.gather(*(converse(endpoint=endpoint, line=line, conversation=conversation,
                                                repeat=repeat * at_once + copy, max_tokens=max_tokens,
                                                pause_s=pause_s, run=run, away=away, start_after_s=copy * apart_s,
                                                holder_stop=holder_stop if endpoint.stoppable else None)
                                       for copy in range(at_once)))
        if holder_stop and endpoint.stoppable:
            await asyncio.to_thread(holder_stop.restart)
        return [turn for chat in chats for turn in chat]

    for repeat in range(repeats):
        for index, conversation in enumerate(conversations):
            away = tuple(conversations[(index + 1 + number) % len(conversations)] for number in range(come_back_after))
            for line, endpoint in endpoints.items():
                got = asyncio.run(together(line, endpoint, conversation, repeat, away))
                turns += got
                progress(f"{line}, {conversation.name}, repeat {repeat}: first token "
                         + ", ".join(f"{turn.ttft_s:.2f}" for turn in got if not turn.away) + " s")
    return turns


def served_by(turns: list[Turn], workers: dict[str, str]) -> list[Turn]:
    """The turns with the worker that served each (`workers`: answer id -> worker, read from the records)."""
    return [replace(turn, worker=workers.get(turn.answer_id, "")) for turn in turns]


@dataclass(frozen=True)
class LineSummary:
    line: str
    first_ttft_s: float  # median over the conversations and repeats
    follow_up_ttft_s: float | None  # median over every follow-up (none: each came back, `converse`'s `away`)
    follow_up_ttft_max_s: float | None
    tokens_per_s: float | None  # after the first token, over the turns that did not loop: tokens / decode seconds
    cached_share: float | None  # of the follow-ups' prompt tokens, what the server said it read from its cache
    turns: int
    looped: int
    mostly_cached: float | None = None  # of the follow-ups, those that read 90% of their prompt or more from cache
    conversations_by_worker: dict[str, int] = field(default_factory=dict)  # by the worker of their first turn
    came_back_ttft_s: float | None = None  # median of the turns sent after the chats away (none: not measured)
    came_back_cached_share: float | None = None
    after_stop_ttft_s: float | None = None  # median of the turns sent as their holder stopped (none: not measured)
    after_stop_ttft_max_s: float | None = None
    after_stop_cold_s: float | None = None  # what reading those prompts whole took at the first turns' median rate
    after_stop_elsewhere: str = ""  # "n of m": served by another worker than the stopped one


def summarize(turns: list[Turn]) -> list[LineSummary]:
    lines = list(dict.fromkeys(turn.line for turn in turns))
    summaries = []
    for line in lines:
        mine = [turn for turn in turns if turn.line == line and not turn.away]
        follow_ups = [turn for turn in mine if turn.turn > 0 and not turn.came_back and not turn.after_stop]
        back = [turn for turn in mine if turn.came_back]
        after_stop = [turn for turn in mine if turn.after_stop]
        cold_rate = statistics.median(turn.prompt_tokens / turn.ttft_s for turn in mine if turn.turn == 0)
        cached = [turn for turn in follow_ups if turn.cached_tokens is not None]
        summaries.append(LineSummary(
            line=line, first_ttft_s=statistics.median(turn.ttft_s for turn in mine if turn.turn == 0),
            follow_up_ttft_s=statistics.median(turn.ttft_s for turn in follow_ups) if follow_ups else None,
            follow_up_ttft_max_s=max((turn.ttft_s for turn in follow_ups), default=None),
            tokens_per_s=_rate([turn for turn in mine if not turn.looped]),
            cached_share=_cached_share(follow_ups),
            turns=len(mine), looped=sum(turn.looped for turn in mine),
            mostly_cached=(sum((t.cached_tokens or 0) >= 0.9 * t.prompt_tokens for t in cached) / len(cached)
                           if cached else None),
            conversations_by_worker=dict(Counter(turn.worker for turn in mine if turn.turn == 0 and turn.worker)),
            came_back_ttft_s=statistics.median(turn.ttft_s for turn in back) if back else None,
            came_back_cached_share=_cached_share(back),
            after_stop_ttft_s=statistics.median(turn.ttft_s for turn in after_stop) if after_stop else None,
            after_stop_ttft_max_s=max((turn.ttft_s for turn in after_stop), default=None),
            after_stop_cold_s=(statistics.median(turn.prompt_tokens for turn in after_stop) / cold_rate
                               if after_stop else None),
            after_stop_elsewhere=(f"{sum(turn.worker not in ('', turn.after_stop) for turn in after_stop)} of "
                                  f"{len(after_stop)}" if after_stop else "")))
    return summaries


def _cached_share(turns: list[Turn]) -> float | None:
    """Of these turns' prompt tokens, what the server said it read from its cache (None: it said nothing)."""
    said = [turn for turn in turns if turn.cached_tokens is not None]
    return sum(turn.cached_tokens or 0 for turn in said) / sum(turn.prompt_tokens for turn in said) if said else None


def _rate(turns: list[Turn]) -> float | None:
    """Tokens a second after the first token, over these turns (None: none, every turn looped)."""
    seconds = sum(turn.decode_s for turn in turns)
    return sum(turn.tokens - 1 for turn in turns) / seconds if seconds else None


def turn_lines(turns: list[Turn]) -> list[str]:
    """Each turn as its user met it: which worker served it, how much of its prompt came from that worker's cache,
    how long its first token took, and how long the answer went on being written after its last token."""
    rows = [("| line | conversation | turn | worker | prompt tokens | from the cache | first token "
            "| its end after the last token |"),
            "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: |"]
    for turn in turns:
        share = "-" if turn.cached_tokens is None else f"{turn.cached_tokens / max(turn.prompt_tokens, 1):.0%}"
        where = (" (a chat away)" if turn.away else " (came back)" if turn.came_back
                 else " (its holder stopped)" if turn.after_stop else "")
        rows.append(f"| {turn.line} | {turn.conversation} #{turn.repeat}{where} | {turn.turn} | {turn.worker or '-'} | "
                    f"{turn.prompt_tokens} | {share} | {turn.ttft_s:.2f} s | {turn.end_s:.2f} s |")
    return rows


def report_lines(summaries: list[LineSummary]) -> list[str]:
    """A Markdown table, with each line's tokens a second against speculative: false's and each peer's; turns that
    looped are left out of the rates (a loop is easy to guess, and nobody reads it) and counted apart."""
    rates = {summary.line: summary.tokens_per_s for summary in summaries}
    others = [MAIN_ALONE, *(s.line for s in summaries if s.line.startswith(PEER_LINE))]
    back = any(s.came_back_ttft_s is not None for s in summaries)
    stop = any(s.after_stop_ttft_s is not None for s in summaries)
    rows = [("| line | first turn: time to first token | follow-ups: median (max) | "
             + ("back after the chats away: first token (from the cache) | " if back else "")
             + ("its holder stopped: first token, median (max; its prompt read cold) | served elsewhere | "
                if stop else "")
             + "tokens/s after the first | " + "".join(f"vs `{other}` | " for other in others)
             + "follow-ups' prompt from the cache | follow-ups ≥ 90% cached | conversations by worker | looped |"),
            "| --- | ---: | ---: |" + " ---: |" * (1 + back + 2 * stop + len(others)) + " ---: | ---: | --- | ---: |"]
    for s in summaries:
        versus = [f"{s.tokens_per_s / against:.2f}x"
                  if other != s.line and s.tokens_per_s and (against := rates.get(other)) else "-" for other in others]
        follow_ups = ("-" if s.follow_up_ttft_s is None or s.follow_up_ttft_max_s is None
                      else f"{s.follow_up_ttft_s:.2f} s ({s.follow_up_ttft_max_s:.2f} s)")
        came_back = ("-" if s.came_back_ttft_s is None else
                     f"{s.came_back_ttft_s:.2f} s ({_percent(s.came_back_cached_share)})") if back else ""
        stopped = ("- | - | " if s.after_stop_ttft_s is None or s.after_stop_ttft_max_s is None else
                   f"{s.after_stop_ttft_s:.2f} s ({s.after_stop_ttft_max_s:.2f} s; {s.after_stop_cold_s or 0:.2f} s) | "
                   f"{s.after_stop_elsewhere} | ") if stop else ""
        rows.append(f"| {s.line} | {s.first_ttft_s:.2f} s | {follow_ups} | " + (f"{came_back} | " if back else "")
                    + stopped
                    + f"{'-' if s.tokens_per_s is None else f'{s.tokens_per_s:.1f}'} | "
                    + "".join(f"{v} | " for v in versus)
                    + f"{_percent(s.cached_share)} | "
                    f"{'-' if s.mostly_cached is None else f'{s.mostly_cached:.0%}'} | "
                    f"{', '.join(f'{n}' for n in sorted(s.conversations_by_worker.values(), reverse=True)) or '-'} | "
                    f"{s.looped}/{s.turns} |")
    return rows


def _percent(share: float | None) -> str:
    return f"{share:.0%}" if share else "-"


def write_conversation_report(turns: list[Turn], out: Path, *, header: list[str]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    summaries = summarize(turns)
    data, table = out / "conversations.json", out / "conversations.md"
    data.write_text(json.dumps({"header": header, "summary": [asdict(s) for s in summaries],
                                "turns": [asdict(t) for t in turns]}, indent=1))
    table.write_text("\n".join(["# Multi-turn chat", "", *header, "", *report_lines(summaries), "",
                                 "## Each turn", "", *turn_lines(turns), ""]))
    return [data, table]
