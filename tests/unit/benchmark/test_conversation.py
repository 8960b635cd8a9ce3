"""The conversation workload's report (inference/benchmark/conversation.py): each line's rate against
`speculative: false` and against every peer asked, turns that looped left out of the rates and counted."""

from dataclasses import replace

from inference.benchmark.conversation import (
    AS_SHIPPED,
    MAIN_ALONE,
    Turn,
    peer_line,
    report_lines,
    summarize,
    turn_lines,
)

LOOP = "\n".join(["    return self.items.get(key, default)"] * 4)


def turn(line: str, index: int, *, tokens: int, decode_s: float, text: str = "def f():\n    pass") -> Turn:
    return Turn(line=line, conversation="edits", repeat=0, turn=index, prompt_tokens=1000,
                cached_tokens=990 if index else 0, ttft_s=0.3 if index else 4.0, tokens=tokens, decode_s=decode_s,
                text=text)


def test_each_line_against_the_main_alone_and_every_peer_leaving_loops_out():
    turns = [
        turn(AS_SHIPPED, 0, tokens=65, decode_s=2.0), turn(AS_SHIPPED, 1, tokens=65, decode_s=2.0),
        turn(AS_SHIPPED, 2, tokens=65, decode_s=0.5, text=LOOP),  # a loop, guessed fast: not in the rate
        turn(MAIN_ALONE, 0, tokens=65, decode_s=4.0), turn(MAIN_ALONE, 1, tokens=65, decode_s=4.0),
        turn(MAIN_ALONE, 2, tokens=65, decode_s=4.0, text=LOOP),
        turn(peer_line("main"), 0, tokens=65, decode_s=3.2), turn(peer_line("main"), 1, tokens=65, decode_s=3.2),
        turn(peer_line("ngram-mod"), 0, tokens=65, decode_s=1.6),
        turn(peer_line("ngram-mod"), 1, tokens=65, decode_s=1.6),
    ]
    summaries = {s.line: s for s in summarize(turns)}
    assert summaries[AS_SHIPPED].tokens_per_s == 32.0 and summaries[AS_SHIPPED].looped == 1
    assert summaries[MAIN_ALONE].tokens_per_s == 16.0
    header, _, *rows = report_lines(list(summaries.values()))
    assert "vs `speculative: false` | vs `peer main` | vs `peer ngram-mod` |" in header
    shipped = next(row for row in rows if row.startswith(f"| {AS_SHIPPED} |"))
    assert "| 32.0 | 2.00x | 1.60x | 0.80x |" in shipped and shipped.endswith("| 1/3 |")
    ngram = next(row for row in rows if row.startswith("| peer ngram-mod |"))
    assert "| 40.0 | 2.50x | 2.00x | - |" in ngram


def test_a_line_whose_every_turn_looped_has_no_rate():
    turns = [turn(AS_SHIPPED, 0, tokens=65, decode_s=1.0, text=LOOP), turn(AS_SHIPPED, 1, tokens=65, decode_s=1.0,
                                                                           text=LOOP),
             turn(MAIN_ALONE, 0, tokens=65, decode_s=4.0), turn(MAIN_ALONE, 1, tokens=65, decode_s=4.0)]
    [shipped, alone] = report_lines(summarize(turns))[2:]
    assert "| - | - | " in shipped and shipped.endswith("| 2/2 |")
    assert "| 16.0 | - | " in alone


def test_turns_away_are_left_out_and_the_turn_that_came_back_is_shown_apart():
    turns = [turn(AS_SHIPPED, 0, tokens=65, decode_s=2.0), turn(AS_SHIPPED, 1, tokens=65, decode_s=2.0),
             replace(turn(AS_SHIPPED, 0, tokens=65, decode_s=9.0), conversation="other", ttft_s=9.0, away=True),
             replace(turn(AS_SHIPPED, 2, tokens=65, decode_s=2.0), ttft_s=0.4, came_back=True)]
    [summary] = summarize(turns)
    assert summary.turns == 3 and summary.first_ttft_s == 4.0
    assert summary.follow_up_ttft_s == 0.3 and summary.came_back_ttft_s == 0.4
    assert summary.tokens_per_s == 32.0
    header, _, row = report_lines([summary])
    assert "| back after the chats away: first token (from the cache) |" in header
    assert "| 0.30 s (0.30 s) | 0.40 s (99%) | 32.0 |" in row


def test_each_turn_says_how_long_its_answer_went_on_after_its_last_token():
    row = turn_lines([replace(turn(AS_SHIPPED, 1, tokens=65, decode_s=2.0), end_s=1.25)])[-1]
    assert row.endswith("| 0.30 s | 1.25 s |"), row
