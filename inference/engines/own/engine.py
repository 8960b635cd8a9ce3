"""The own engine: exact speculative sampling on the raw OpenVINO runtime.

openvino-genai's verification with a draft is exact only for greedy decoding (docs/exactness.md: at T > 0
its answers are not drawn from the main model's distribution). Here the draft proposes K tokens sampled
from its own distribution, the main scores all K+1 positions in one inference, and the exact rule
(engines/own/acceptance.py, which names its words) keeps some and adds one token, so the answers follow the
main alone's distribution. At temperature 0 every draw is an argmax: the main's greedy output. A draft whose head
keeps part of the vocabulary (engines/own/draft_head.py) gives rows widened back to all of it, q = 0 outside.

The engine room follows vLLM v1's: each model's KV blocks and prefix cache (engines/own/block_pool.py), an answer's
block table (engines/own/kv_cache.py), a scheduler that steps every answer's work in one inference a step
(engines/own/scheduler.py) and the runner that fills the PagedAttention op's inputs (engines/own/model_runner.py).
Each answer runs its loop in its own thread (OpenVINO releases the GIL while it infers); the main alone is this
loop with no proposer, on the same kernel path, so switching speculation off never changes a greedy answer.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import llguidance as llg
import numpy as np
import openvino as ov

from inference.engines.decoding import DecodingParams, Speculation
from inference.engines.grammar.constraint import TokenConstraint, load_vocabulary, masked
from inference.engines.interface import ActiveRequest, Finished, JoinedBatch, LeftBatch, PromptRead, StepTokens
from inference.engines.own.acceptance import accept, accept_fixed, draw, greedy_accept, probabilities
from inference.engines.own.answer_layout import answer_opener
from inference.engines.own.draft_head import compile_draft
from inference.engines.own.kv_cache import PagedModel, PagedSequence
from inference.engines.own.model_runner import ModelRunner, Steady
from inference.engines.own.paged_model import cache_layout, read_paged
from inference.engines.own.penalty import RepetitionPenalty
from inference.engines.own.proposers.chain import Drafting
from inference.engines.own.proposers.draft_model import DraftModel
from inference.engines.own.proposers.interface import Proposal
from inference.engines.own.proposers.prompt_lookup import PromptLookup
from inference.engines.pages import release_freed_heap, release_weight_pages
from inference.engines.spec import PairSpec
from inference.engines.tokenizer import load_tokenizer, prompt_token_ids
from inference.limits import Drafter, FinishReason
from inference.serving.host import this_host

log = logging.getLogger(__name__)
# Beyond this many prompt tokens missing from the draft's prefix cache, the answer does not wait for the draft to read
# them (its prefill would land in the stream, after the first token): it speculates from its conversation alone (the
# main alone where the pair chains no lookup). The draft joins it once the turn before's catch-up has read the
# conversation, else it reads the conversation once the answer is out, ready for the next turn
# (docs/speculation.md#long-conversations).
DRAFT_CATCH_UP_TOKENS = 256
STEADY_ROWS_FILE = ".steady-rows.json"  # beside the main's IR: each host's probed step sizes (steady_rows)
PROGRESS_MIN_TOKENS = 256  # prompts this long to read say how far they got
CATCH_UP_WAIT_S = 30.0  # a catch-up's chunk waits this long at most for the main to read a prompt
# An answer in the batch speculates again once the engine has been within the pair's speculating streams this long (a
# burst's answers come over a moment: within it, it stays rather than stop and start its draft again), with at least
# so many tokens left to write (fewer would not repay its draft's read of the answer so far).
LEAVE_BATCH_AFTER_S = 1.0
LEAVE_BATCH_MIN_TOKENS = 32
# ... and its draft reads at most so many tokens it lacks for each token the answer still has to write, else the lookup
# alone proposes: on the real pair a draft token read in a chunk costs about a thirtieth of the main's step, and a
# speculating step saves about a third of one (docs/speculation.md#speculating-in-the-batch).
LEAVE_BATCH_READ_PER_TOKEN = 8


def _logsumexp(row: np.ndarray) -> float:
    top = float(row.max())
    return top + float(np.log(np.exp(row.astype(np.float64) - top).sum()))


class LoadCameBack(Exception):
    """A draft's catch-up stops: answers beyond the pair's speculating streams run (Decoding.catch_up_draft)."""


class Scores(NamedTuple):
    """A step's tokens' log probabilities and alternatives, when the request asked (see token_scores)."""

    logprobs: list[float] | None
    alternatives: list[list[tuple[int, float]]] | None

    def cut(self, n: int) -> Scores:
        return Scores(self.logprobs[:n] if self.logprobs is not None else None,
                      self.alternatives[:n] if self.alternatives is not None else None)


def token_scores(rows, tokens: list[int], params: DecodingParams) -> Scores | None:
    """log p_main(token) from the main's raw logits, as the library reports them, and the top_logprobs most
    likely tokens at each position with theirs (most likely first); None unless asked."""
    if not params.logprobs and not params.top_logprobs:
        return None
    logprobs, alternatives = [], []
    for row, token in zip(rows, tokens, strict=True):
        norm = _logsumexp(row)
        logprobs.append(float(row[token] - norm))
        if top := params.top_logprobs:
            best = np.argpartition(-row, top)[:top]
            best = best[np.argsort(-row[best], kind="stable")]
            alternatives.append([(int(i), float(row[i] - norm)) for i in best])
    return Scores(logprobs, alternatives if params.top_logprobs else None)


def eos_token_ids(model_dir: str) -> set[int]:
    ids: set[int] = set()
    for name in ("generation_config.json", "config.json"):
        path = Path(model_dir, name)
        if path.is_file():
            value = json.loads(path.read_text()).get("eos_token_id")
            ids.update(value if isinstance(value, list) else [value] if value is not None else [])
    return ids


def own_engine_precision(spec: PairSpec) -> PairSpec:
    """The spec as the own engine compiles it: bf16 with bf16 blocks where its calibration chose bf16, else f32 with f32
    blocks; never a device's default cache (u8 on some CPUs, its key and value blocks shaped apart, its rollback
    inexact). Dynamic quantization as the spec says: on for a pair whose own engine serves its answers (pair_spec),
    where rows are then bitwise alike whoever shares a step (serving/precision.py, EXACT_ON_OWN_ENGINE); off where the
    library's f32 main alone serves a pair's greedy answers, so that the own engine's sampled ones follow that
    computation of the main (to 1e-5: docs/exactness.md#one-kernel-path)."""
    precision = "bf16" if spec.inference_precision == "bf16" else "f32"
    return replace(spec, inference_precision=precision, kv_cache_precision=precision)


def steady_rows(runner: ModelRunner, *, main_dir: str, properties: dict[str, str], asked: str = "auto",
                opener: tuple[int, ...] | None = None) -> Steady:
    """The arrangement of the main's rows (`asked`: "auto", the one ModelRunner.arranged finds cheaper, or "queries"
    or "one-token", where checked alike) and the sizes a step needs for them to come out alike, probed once per host
    and configuration (seconds on the real main) and kept beside the main's files where they are writable, so that
    every worker of the pair on the host computes alike. `opener`: the template's answer opener, where the caller
    has it (else read from the main's tokenizer)."""
    weights = Path(main_dir) / "openvino_model.bin"
    # where the template opens answers, one-token sequences read no prompt's text (answer_layout.py): its cost is moot
    prompts_as_queries = bool(answer_opener(load_tokenizer(main_dir)) if opener is None else opener)
    probed = [this_host().signature, properties, weights.stat().st_size, weights.stat().st_mtime_ns,
              "arranged, checked alike at every verify", "one-token steps on the mixed path", asked,
              prompts_as_queries]
    key = hashlib.sha256(json.dumps(probed).encode()).hexdigest()
    kept = Path(main_dir) / STEADY_ROWS_FILE
    try:
        known = json.loads(kept.read_text())
    except (OSError, ValueError):
        known = {}
    if isinstance(known.get(key), list):
        return Steady(*known[key])
    steady = runner.arranged(token_rows=None if asked == "auto" else asked == "one-token",
                             prompts_as_queries=prompts_as_queries)
    if asked == "one-token" and not runner.alike_as_tokens(steady):
        log.warning("one-token sequences part a verify's rows from the main alone's on this host: the main's rows run "
                    "as queries (SPECCHAT_MAIN_ROWS=one-token not served)")
        steady = runner.arranged(token_rows=False)
    try:
        written = kept.with_name(f"{kept.name}.{os.getpid()}")
        written.write_text(json.dumps({**known, key: list(steady)}))
        os.replace(written, kept)  # whole, even with another worker writing it too
    except OSError:
        log.info("could not keep the main's steady step sizes in %s: probed again at the next load", kept)
    return steady


class OwnEngine:
    """Same interface as the library engine: submit() returns an ActiveRequest fed one StepTokens per
    speculative step, then Finished."""

    def __init__(self, spec: PairSpec):
        self.spec = spec
        started = time.perf_counter()
        core = ov.Core()
        compiled = own_engine_precision(spec)
        main_properties = compiled.device_properties(device=spec.device)
        main = core.compile_model(read_paged(core, spec.main_dir), spec.device, main_properties)
        draft, draft_head = compile_draft(core, draft_dir=spec.draft_dir, head_ids=spec.draft_head_ids,
                                          device=spec.draft_runs_on,
                                          properties=compiled.device_properties(device=spec.draft_runs_on))
        main_bytes, draft_bytes = cache_layout(main).block_bytes, cache_layout(draft).block_bytes
        pool = spec.kv_pool_bytes()  # shared so that both models hold as many tokens
        caching = spec.prefix_caching
        self.tokenizer = load_tokenizer(spec.main_dir)
        self.eos_ids = eos_token_ids(spec.main_dir)
        opener = answer_opener(self.tokenizer)
        main_runner = ModelRunner(main, pool_bytes=pool * main_bytes // (main_bytes + draft_bytes))
        main_runner.steady = steady_rows(main_runner, main_dir=spec.main_dir, properties=main_properties,
                                         asked=spec.main_rows, opener=opener)
        self.main = PagedModel(main_runner, caching=caching)
        self.draft = PagedModel(ModelRunner(draft, pool_bytes=pool * draft_bytes // (main_bytes + draft_bytes)),
                                head=draft_head, caching=caching)
        self.draft.yield_to(self.main)  # its catch-ups give way to a user's prompt (catch_up_draft)
        # where the main's prompts hold answers, read as their tokens were fed; the rest as queries (answer_layout.py)
        self.main.answer_opener, self.main.answer_ends = opener, frozenset(self.eos_ids)
        self._grammar_vocabulary: llg.LLTokenizer | None = None  # built for the first answer held to a grammar
        self._active: dict[int, tuple[str, list[int]]] = {}  # the running answers' cache scopes and prompts
        self._ids = itertools.count()
        self.submitted = 0  # requests taken: the registry renews an engine after many (see EngineRegistry)
        self.answers_elsewhere = 0  # answers other workers on this host run, as their heartbeats said lately
        self._lock = threading.Lock()
        self._draft_reading = threading.Lock()  # held while the draft reads a conversation after its answer
        self._warm()
        self.load_seconds = time.perf_counter() - started
        log.info("loaded %s (exact sampling) in %.1f s; the main's rows alike at any step size: %s", spec.slug,
                 self.load_seconds, main_runner.steady)

    def _warm(self) -> None:
        """Two short answers, speculating and batched, on load: the first inferences of a shape compile kernels and
        repack weights, seconds the first user's answer would otherwise wait."""
        ids = prompt_token_ids(self.tokenizer, prompt="def main():", add_special_tokens=False, prompt_ids=None)
        for speculation in (Speculation(k=2), None):
            Decoding(self, ActiveRequest(-1, ids, time.perf_counter()), ids,
                     DecodingParams(max_new_tokens=4, speculation=speculation)).run()

    def draft_caught_up(self, *, timeout: float = CATCH_UP_WAIT_S) -> None:
        """Once the draft has read the last conversation it was left out of (at most `timeout` seconds)."""
        if self._draft_reading.acquire(timeout=timeout):
            self._draft_reading.release()

    @property
    def draft_reading(self) -> bool:
        """A catch-up is under way: the draft reads a conversation it was left out of."""
        return self._draft_reading.locked()

    @property
    def active_count(self) -> int:
        return len(self._active)

    def answering_beside(self, *, scope: str, prompt_ids: list[int]) -> bool:
        """Whether an answer runs that is not a later turn of this conversation (in its scope, its prompt starting
        with this one's, but for the last token, which the history's text may join to the next): a catch-up reading
        it would only slow that answer."""
        start = prompt_ids[:-1]
        with self._lock:
            running = list(self._active.values())
        return any(their_scope != scope or their_prompt[:len(start)] != start for their_scope, their_prompt in running)

    @property
    def beyond_speculating_streams(self) -> bool:
        """More answers run than the pair lets speculate on their own: the rest share the batch. Those of the other
        workers on this host count (`answers_elsewhere`): they share its cores, and a lone answer's draft and verify
        work would take them from their batches."""
        limit = self.spec.speculating_streams
        return bool(limit and self.active_count + self.answers_elsewhere > limit)

    @property
    def alive(self) -> bool:
        return True  # it runs in this process

    @property
    def held_blocks(self) -> int:
        """Blocks the running answers hold in the two pools."""
        return self.main.pool.held_count + self.draft.pool.held_count

    @property
    def cached_bytes(self) -> int:
        """What the two pools hold cached for prompts to come."""
        return self.main.pool.cached_bytes + self.draft.pool.cached_bytes

    def grammar_vocabulary(self) -> llg.LLTokenizer:
        """The main's vocabulary as llguidance reads it, built once (a second or so on 152k tokens)."""
        with self._lock:
            if self._grammar_vocabulary is None:
                self._grammar_vocabulary = load_vocabulary(self.spec.main_dir, self.tokenizer, self.eos_ids)
            return self._grammar_vocabulary

    def submit(self, *, prompt: str = "", params: DecodingParams, add_special_tokens: bool = True,
               prompt_ids: list[int] | None = None) -> ActiveRequest:
        prompt_ids = prompt_token_ids(self.tokenizer, prompt=prompt, add_special_tokens=add_special_tokens,
                                      prompt_ids=prompt_ids)
        request = ActiveRequest(next(self._ids), prompt_ids, time.perf_counter())
        self.submitted += 1
        with self._lock:
            self._active[request.request_id] = (params.cache_scope, prompt_ids)
        threading.Thread(target=self._run, args=(request, prompt_ids, params), name=f"exact-{request.request_id}",
                         daemon=True).start()
        return request

    def close(self) -> None:
        """Nothing to stop: each request's thread ends with it (and the batch's driver with its last row)."""

    def _run(self, request: ActiveRequest, prompt_ids: list[int], params: DecodingParams) -> None:
        decoding = None
        try:
            decoding = Decoding(self, request, prompt_ids, params)
            finished = decoding.run()
        except Exception as exc:  # a failed request fails alone
            log.exception("exact decoding failed for %s", self.spec.slug)
            finished, decoding = Finished(FinishReason.ERROR, f"{type(exc).__name__}: {exc}"), None
        with self._lock:
            self._active.pop(request.request_id, None)
        if decoding is None or decoding.behind is None:
            request.events.put(finished)
        else:
            self._catch_up(decoding, finished)
        release_weight_pages()  # what the kernels this request first ran read (engines/pages.py)
        release_freed_heap()

    def _catch_up(self, decoding: Decoding, finished: Finished) -> None:
        """The answer out, then the draft left out of it reads the conversation, not counted as an answer running (the
        next turn plans as if it had finished); the lock held before the answer is out, so the next turn sees it. While
        another conversation's catch-up holds it, the answer ends at once and its catch-up waits: the next turn sees
        that one under way, and its draft joins once the reads are done."""
        held = self._draft_reading.acquire(blocking=False)
        decoding.request.events.put(finished)
        if not held:
            self._draft_reading.acquire()
        try:
            decoding.catch_up_draft()
        except Exception:
            log.exception("the draft could not read a conversation of %s", self.spec.slug)
        finally:
            self._draft_reading.release()


class Decoding:
    """One request's speculative loop on its own two caches."""

    def __init__(self, engine: OwnEngine, request: ActiveRequest, prompt_ids: list[int], params: DecodingParams):
        self.engine, self.request, self.params = engine, request, params
        self.rng = np.random.default_rng(params.seed)
        self.speculation = params.speculation
        if self.speculation is not None and self.speculation.k is None:
            raise ValueError("the own engine speculates at a K (a confidence threshold is the library's)")
        self.k: int = (self.speculation.k or 0) if self.speculation else 0  # the most tokens proposed a step
        self.scope = params.cache_scope
        self.main: PagedSequence = engine.main.sequence(scope=self.scope, exact=True)
        self.prompt_ids = prompt_ids
        self.emitted: list[int] = []
        self.penalty = (RepetitionPenalty(params.repetition_penalty, prompt_ids)
                        if params.repetition_penalty != 1.0 else None)
        grammar = params.grammar
        self.constraint = TokenConstraint(engine.grammar_vocabulary(), grammar) if grammar else None
        self.drafting = self._drafting(self.speculation) if self.speculation else None
        self.main.drafting = bool(self.drafting and self.drafting.draft)  # its steps come between the draft's
        self.behind: DraftModel | None = None  # a draft left out of this answer, to read the conversation after it
        self.set_aside: DraftModel | None = None  # a draft waiting for the turn before's catch-up, to join this answer
        self.joined = False  # it went on at its K for the batch
        self._within_streams_since: float | None = None  # in the batch, since when the engine has been within them
        self.reads_on = False  # the draft set aside reads the answer so far a chunk a step (out of the batch again)

    def _drafting(self, speculation: Speculation) -> Drafting:
        """The answer's proposers: the lookup where the pair chains it, and the draft unless the lookup goes alone."""
        lookup = self._lookup()
        draft = None if speculation.lookup_only and lookup else self.engine.draft.sequence(scope=self.scope)
        return Drafting(draft, lookup=lookup, params=self.params, speculation=speculation, rng=self.rng,
                        constraint=self.constraint, penalty=self.penalty, judged=self.engine.spec.drafters_judged)

    def _lookup(self) -> PromptLookup | None:
        """The prompt lookup, tried before the draft where the pair chains it."""
        if not self.engine.spec.chained_lookup:
            return None
        return PromptLookup(self.prompt_ids, max_ngram=self.params.max_ngram_size)

    def run(self) -> Finished:
        """The answer; its caches' live tokens then kept in the prefix caches (unless it failed)."""
        kept = None
        try:
            finished = self._decode()
            unread = self._set_aside_unread()
            self.behind = self.behind or unread  # never joined: it reads the conversation after the answer
            kept = self.prompt_ids + self.emitted
            return finished
        finally:
            self.main.close(keep_ids=kept)
            if self.drafting and self.drafting.draft:
                self.drafting.draft.cache.close(keep_ids=kept)
            self._set_aside_unread()  # a failed answer's draft part-way through its read gives its blocks back

    def catch_up_draft(self) -> None:
        """After the answer is out: the draft left out of it reads the conversation so far, for the next turn. Its
        chunks wait while the main reads a prompt, and a chunk under way as one starts is cancelled and read again
        after it: on a host's few cores they would share them with a user waiting for a first token (the next turn's
        among them), whose answer needs no draft until then. Not while the engine runs more answers than the pair's
        speculating streams and the batch speculates without the draft, nor while an answer of another conversation
        runs, before the read or between two of its chunks: the next turn would run in the batch without it, and the
        read, sharing the cores and the draft's inferences, would slow the answers running
        (docs/speculation.md#speculating-in-the-batch). A later turn of this conversation lets it read on: its draft
        joins once the read is done. What it read by then stays in the draft's cache."""
        if self.behind is not None and self._reading_would_slow_others():
            self.behind.cache.close()  # read after a later turn, once the load lets one speculate
        elif self.behind is not None and self.emitted:
            conversation, main = self.prompt_ids + self.emitted[:-1], self.engine.main

            def pause() -> None:
                main.prompts_read(timeout=CATCH_UP_WAIT_S)
                if self._reading_would_slow_others():
                    raise LoadCameBack

            try:
                self.behind.cache.prefill(conversation, pause=pause)
                self.behind.cache.close()
            except LoadCameBack:
                self.behind.cache.close(keep_ids=conversation)  # its full blocks read so far cached

    def _reading_would_slow_others(self) -> bool:
        return self._batched_without_the_draft() or self.engine.answering_beside(scope=self.scope,
                                                                               prompt_ids=self.prompt_ids)

    def _batched_without_the_draft(self) -> bool:
        """Whether the engine's other answers, this one done, are beyond the pair's speculating streams (a turn
        starting then runs in the batch) and no K for the batch lets the draft run there."""
        return self.engine.beyond_speculating_streams and not (self.speculation and self.speculation.batch_k)

    def _draft_missing(self) -> int:
        """What a draft joining now would read: the conversation and the answer so far, less what its pool holds."""
        read = self.prompt_ids + self.emitted[:-1]
        return len(read) - self.engine.draft.cached_tokens(read, self.scope)

    def _reading(self, read: int, total: int) -> None:
        if total >= PROGRESS_MIN_TOKENS:
            self.request.events.put(PromptRead(read, total))

    def _decode(self) -> Finished:
        logits = self.main.prefill(self.prompt_ids, on_chunk=self._reading)[-1]
        self.request.cached_tokens = self.main.cached
        shaped = self.penalty.row(logits) if self.penalty else logits
        first = draw(probabilities(self._allowed(shaped), self.params), self.rng)
        if self.constraint:
            self.constraint.take(first)
        finished = self._emit([first], token_scores([logits], [first], self.params))
        if finished is None:
            self._join_batch_if_busy()  # beyond the speculating streams from the start: no draft read for the batch
        if self.drafting and self.drafting.draft and finished is None:  # after the first token: not in its wait
            if self._draft_missing() > DRAFT_CATCH_UP_TOKENS:
                self.set_aside = self.drafting.leave_draft_behind()
                self.main.drafting = False
                self._draft_joins_once_caught_up()
            else:
                self.drafting.prefill(self.prompt_ids)
        if self.drafting and not (self.drafting.draft or self.drafting.lookup or self.set_aside):
            self.drafting = None  # no proposer left: the main alone
        if self.drafting and self.drafting.lookup:
            self.drafting.lookup.extend([first])
        while finished is None:
            if self.request.stop_requested:
                return Finished(FinishReason.STOPPED)
            self._join_batch_if_busy()
            self._leave_batch_once_alone()
            self._draft_joins_once_caught_up()
            finished = self._emit(*self._step())
        return finished

    def _draft_joins_once_caught_up(self) -> None:
        """A draft set aside joins the answer once no catch-up is under way (the turn before's, which reads most of
        this conversation, runs beside the answer's steps instead of before them: the answer streams meanwhile), if
        it then lacks at most DRAFT_CATCH_UP_TOKENS of the conversation and the answer so far (it reads them between two
        steps); else it reads the conversation after the answer."""
        if self.set_aside is None or self.engine.draft_reading or self.drafting is None:
            return
        if self.reads_on:
            self._draft_reads_on()
            return
        draft, self.set_aside = self.set_aside, None
        if self._draft_missing() > DRAFT_CATCH_UP_TOKENS:
            self.behind = draft
            return
        draft.prefill(self.prompt_ids + self.emitted[:-1])  # the last emitted token: fed as its next step's first
        self.drafting.rejoin(draft)
        self.main.drafting = True

    def _draft_reads_on(self) -> None:
        """Out of the batch again, the draft set aside reads the conversation and the answer so far, at most
        DRAFT_CATCH_UP_TOKENS a step (the answer streams meanwhile, its lookup proposing), and joins once it has read
        them (its pool's blocks of them not read again)."""
        assert self.set_aside is not None and self.drafting is not None
        draft, conversation = self.set_aside, self.prompt_ids + self.emitted[:-1]
        read = len(draft.cache.tokens)
        if not read:
            cached = self.engine.draft.cached_tokens(conversation, self.scope)
            draft.prefill(conversation[:cached + DRAFT_CATCH_UP_TOKENS])
        elif read < len(conversation):
            draft.cache.feed(conversation[read:read + DRAFT_CATCH_UP_TOKENS], rows=1)
        if len(draft.cache.tokens) == len(conversation):
            self.set_aside, self.reads_on = None, False
            self.drafting.rejoin(draft)
            self.main.drafting = True

    def _set_aside_unread(self) -> DraftModel | None:
        """The draft set aside, taken out, to read the conversation after the answer; one part-way through reading it
        (`_draft_reads_on`) keeps what it read in its pool instead, for the next turn."""
        draft, self.set_aside = self.set_aside, None
        if draft is not None and draft.cache.tokens:
            draft.cache.close(keep_ids=list(draft.cache.tokens))
            draft, self.reads_on = None, False
        return draft

    def _join_batch_if_busy(self) -> None:
        """Beyond the pair's speculating streams, an answer speculating goes on at its K for the batch
        (`Speculation.batch_k`; None: without the draft): its steps share every inference with the other answers'
        anyway (engines/own/scheduler.py), and there a verify of many tokens costs more than the draft saves
        (docs/speculation.md#speculating-in-the-batch). Without the draft, the conversation's lookup goes on where
        the pair chains it, where the answer copies (PromptLookup.batched): its proposals cost no inference, a miss
        is the main alone's step. It stays there, and says so (JoinedBatch: on the record)."""
        if not (self.drafting and self.speculation and self.engine.beyond_speculating_streams) or self.joined:
            return
        self.joined = True
        k_before, batch_k = self.k, self.speculation.batch_k
        self.k = min(self.k, batch_k) if batch_k else 0
        lookup = not batch_k and self.drafting.lookup is not None
        if self.drafting.lookup is not None:
            self.drafting.lookup.batched()
        self.request.events.put(JoinedBatch(token=len(self.emitted), k=self.k, k_before=k_before, lookup=lookup))
        if not batch_k:
            self.drafting.stop_draft()
            self.main.drafting = False
            unread = self._set_aside_unread()
            self.behind = self.behind or unread  # it reads the conversation after
            if not lookup:
                self.drafting = None

    def _leave_batch_once_alone(self) -> None:
        """Within the pair's speculating streams again for LEAVE_BATCH_AFTER_S (the other answers ended), an answer that
        went into the batch speculates again at its K: the conversation's lookup at full length at once, the draft once
        it has read the conversation and the answer so far, a chunk a step (`_draft_reads_on`), where what it lacks
        repays the read (LEAVE_BATCH_READ_PER_TOKEN). Not under a grammar, whose state the draft would have to replay.
        Says so (LeftBatch: on the record). Any step's tokens are the main's either way: greedy, the same answer;
        sampled, drawn from the main's distribution in the batch and out of it."""
        if not self.joined or self.constraint is not None or self.engine.beyond_speculating_streams:
            self._within_streams_since = None
            return
        now = time.monotonic()
        self._within_streams_since = self._within_streams_since or now
        left = self.params.max_new_tokens - len(self.emitted)
        if now - self._within_streams_since < LEAVE_BATCH_AFTER_S or left < LEAVE_BATCH_MIN_TOKENS:
            return
        assert self.speculation is not None  # an answer joins the batch only while it speculates
        looks_up = self.engine.spec.chained_lookup
        draft_reads = (not (self.speculation.lookup_only and looks_up) and self.set_aside is None
                       and not (self.drafting and self.drafting.draft)
                       and self._draft_missing() <= LEAVE_BATCH_READ_PER_TOKEN * left)
        if not (looks_up or draft_reads or (self.drafting and self.drafting.draft)):
            return  # nothing would propose: it stays
        self.joined, self.k = False, self.speculation.k or 0  # its K outside the batch
        if self.drafting is None:  # it went on as the main alone: its proposers anew
            self.drafting = Drafting(None, lookup=self._lookup(), params=self.params, speculation=self.speculation,
                                     rng=self.rng, constraint=None, penalty=self.penalty,
                                     judged=self.engine.spec.drafters_judged)
            if self.drafting.lookup is not None:
                self.drafting.lookup.extend(self.emitted)
        elif self.drafting.lookup is not None:
            self.drafting.lookup.unbatched()
        if draft_reads:
            self.set_aside = self.behind or self.drafting.new_draft(self.engine.draft.sequence(scope=self.scope))
            self.behind, self.reads_on = None, True
        self.request.events.put(LeftBatch(token=len(self.emitted), k=self.k))

    def _allowed(self, logits: np.ndarray) -> np.ndarray:
        """The logits with the tokens the grammar refuses now at -inf; unchanged without a grammar."""
        return logits if self.constraint is None else masked(logits, self.constraint.allowed())

    def _step(self) -> tuple[list[int], Scores | None, Proposal | None]:
        """One speculative step: the accepted proposals and the main's own token (and their logprobs), and the
        proposal (None on the main alone)."""
        last = self.emitted[-1]
        room = self.params.max_new_tokens - len(self.emitted) - 1  # never propose past the cap
        started = time.perf_counter()
        proposal = (self.drafting.propose(k=min(self.k, room), room=room, last=last) if self.drafting
                    else Proposal([], Drafter.DRAFT, [], []))
        proposals = proposal.tokens
        verifying = time.perf_counter()
        main_logits = self.main.feed([last, *proposals])
        verify_seconds = time.perf_counter() - verifying
        scored = self.penalty.rows(main_logits, proposals) if self.penalty else main_logits
        if self.constraint:  # the main scores each position under the grammar's state there
            scored = masked(scored, np.stack([*proposal.masks, self.constraint.allowed()]))
        if self.params.temperature == 0:
            accepted, token = greedy_accept(proposals, scored)
        elif proposal.drafter == Drafter.NGRAM:
            accepted, token = accept_fixed(proposals, scored, params=self.params, rng=self.rng)
        else:
            accepted, token = accept(proposals, proposal.qs, scored, params=self.params, rng=self.rng)
        if self.constraint:
            self.constraint.rollback(len(proposals) - accepted)
            self.constraint.take(token)
        self.main.drop_last(len(proposals) - accepted)
        if self.drafting:
            self.drafting.settle(last=last, proposal=proposal, accepted=accepted, token=token,
                                 seconds=time.perf_counter() - started, verify_seconds=verify_seconds)
        tokens = [*proposals[:accepted], token]
        scores = token_scores(main_logits[:accepted + 1], tokens, self.params)
        return tokens, scores, proposal if self.drafting else None

    def _emit(self, tokens: list[int], scores: Scores | None, proposal: Proposal | None = None) -> Finished | None:
        """Deliver one step's tokens, cut at EOS, a stop string or the cap; Finished when it ended."""
        params, reason = self.params, None
        if not params.ignore_eos:
            for index, token in enumerate(tokens):
                if token in self.engine.eos_ids:
                    tokens, reason = tokens[: index + 1], FinishReason.STOP
                    break
        room = params.max_new_tokens - len(self.emitted)
        if len(tokens) >= room:
            tokens, reason = tokens[:room], reason or FinishReason.LENGTH
        if params.stop:
            tokens, reason = self._cut_at_stop_string(tokens, reason)
        self.emitted.extend(tokens)
        if self.penalty:
            self.penalty.extend(tokens)
        if tokens:
            kept = scores.cut(len(tokens)) if scores else Scores(None, None)
            self.request.events.put(StepTokens(
                tokens, time.perf_counter(), kept.logprobs, kept.alternatives,
                drafter=proposal.drafter if proposal else None, proposed=len(proposal.tokens) if proposal else None))
        return Finished(reason) if reason else None

    def _cut_at_stop_string(self, tokens: list[int], reason: FinishReason | None
                            ) -> tuple[list[int], FinishReason | None]:
        """Like the library (stop string not included): the answer ends before the tokens that make up
        the first stop string to appear."""
        decode = self.engine.tokenizer.decode
        full = self.emitted + tokens
        for end in range(len(self.emitted) + 1, len(full) + 1):
            text = decode(full[:end])
            found = [text.find(stop) for stop in self.params.stop if stop in text]
            if found:
                keep = end - 1
                while keep > len(self.emitted) and len(decode(full[:keep])) > min(found):
                    keep -= 1
                return full[len(self.emitted):keep], FinishReason.STOP
        return tokens, reason
