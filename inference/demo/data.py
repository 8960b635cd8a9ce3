"""The demo pair's data: its corpus (the running Python's own standard library, one function per
document), its byte-level BPE tokenizer and chat template, and the synthetic set the draft is
distilled on (the main's own answers to prompts like those users send, FastDraft-style).

Stages of `inference.demo.build`; they need the `train` extra (tokenizers, transformers).
"""

from __future__ import annotations

import ast
import json
import random
import shutil
import sysconfig
import textwrap
import time
from pathlib import Path

from tqdm import tqdm

EOS = "<|endoftext|>"
PAD = "<|pad|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}# {{ message['content'] }}\n"
    "{% elif message['role'] == 'user' %}{{ message['content'] }}"
    "{% else %}{{ message['content'] }}" + EOS + "\n"
    "{% endif %}{% endfor %}"
)
HELDOUT = Path(__file__).resolve().parents[1] / "prompts" / "heldout.json"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------- corpus
def stdlib_functions(max_chars: int = 4000) -> list[str]:
    """Every function and method of the stdlib (tests excluded), dedented, as one document each."""
    root = Path(sysconfig.get_paths()["stdlib"])
    heldout = json.loads(HELDOUT.read_text())
    heldout_heads = {p.splitlines()[0].strip() for name in ("code", "code-loopy") for p in heldout[name]}
    docs: list[str] = []
    files = sorted(p for p in root.rglob("*.py") if not {"test", "tests", "site-packages", "idlelib"} & set(p.parts))
    for path in tqdm(files, desc="corpus", unit="file"):
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                segment = ast.get_source_segment(source, node)
                if not segment or len(segment) > max_chars:
                    continue
                text = textwrap.dedent(" " * node.col_offset + segment)
                if text.splitlines()[0].strip() in heldout_heads:
                    continue  # keep the held-out prompts out of training
                docs.append(text)
    return docs


def stage_corpus(work: Path, seed: int) -> None:
    docs = stdlib_functions()
    random.Random(seed).shuffle(docs)
    (work / "corpus.json").write_text(json.dumps(docs))
    log(f"corpus: {len(docs)} functions, {sum(map(len, docs)) / 1e6:.1f} M characters")


def load_corpus(work: Path) -> list[str]:
    return json.loads((work / "corpus.json").read_text())


# ---------------------------------------------------------------- tokenizer
def stage_tokenizer(work: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    docs = load_corpus(work)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=True,
    )
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS, pad_token=PAD, unk_token=None)
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 1024
    fast.save_pretrained(work / "tokenizer")
    log(f"tokenizer: {fast.vocab_size} tokens")


def load_tokenizer(work: Path):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(work / "tokenizer")


# ---------------------------------------------------------------- synthetic answers of the main
SYSTEM_PROMPTS = ("You are a helpful coding assistant.", "Answer with Python code only.",
                  "You write clear, short code.")
REQUESTS = ("Write a Python function that {}", "Write a function to {}", "How do I {}?", "{}", "Python: {}",
            "Can you write code that {}?", "Implement this: {}")


def function_parts(doc: str) -> tuple[str, str, list[str]] | None:
    """(signature with decorators, first docstring line, all lines) of one corpus function."""
    try:
        fn = ast.parse(doc).body[0]
    except (SyntaxError, IndexError):
        return None
    lines = doc.splitlines()
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or fn.body[0].lineno - 1 <= fn.lineno - 1:
        return None  # a one-line function has no signature of its own
    signature = "\n".join(lines[: fn.body[0].lineno - 1])
    docline = (ast.get_docstring(fn) or "").strip().splitlines()[0:1]
    return signature, (docline[0] if docline else ""), lines


def synth_prompt(rng: random.Random, doc: str, docs: list[str]) -> tuple[str, str] | None:
    """One prompt like those users send, and its kind: code to complete (a signature, with a docstring
    as in the held-out set, or a partial body) or a chat request through the pair's chat template."""
    parts = function_parts(doc)
    if parts is None:
        return None
    signature, docline, lines = parts
    kind = rng.choices(["docstring", "signature", "partial", "request", "follow-up"], [35, 10, 15, 30, 10])[0]
    if kind in ("docstring", "request", "follow-up") and not docline:
        kind = "partial"
    if kind == "docstring" and docline:
        return f'{signature}\n    """{docline}"""\n', kind
    if kind == "partial" and len(lines) > 3:
        return "\n".join(lines[: rng.randint(2, min(8, len(lines) - 1))]) + "\n", kind
    if kind in ("request", "follow-up"):
        ask = rng.choice(REQUESTS).format(docline[0].lower() + docline[1:].rstrip("."))
        turns = f"# {rng.choice(SYSTEM_PROMPTS)}\n" if rng.random() < 0.3 else ""
        if kind == "follow-up":  # an earlier turn: its request and an answer, as the chat template renders them
            earlier = function_parts(rng.choice(docs))
            if earlier and earlier[1]:
                turns += rng.choice(REQUESTS).format(earlier[1]) + "\n".join(earlier[2]) + EOS + "\n"
        return turns + ask, kind
    return signature + "\n", "signature"


def stage_synth(work: Path, a) -> None:
    """The main's own greedy answers to many varied prompts: the draft learns what the main says.

    Generated with openvino-genai on the committed main shrunk back to its trained width
    (main_model.shrink: the same function as the served main, 8x cheaper), in the served precision."""
    import openvino as ov
    import openvino_genai as og

    from inference.demo import main_model

    compact = work / "main_compact"
    model = ov.Core().read_model(main_model.SOURCE / "openvino_model.xml")
    main_model.shrink(model, a.grow_mlp)
    shutil.copytree(main_model.SOURCE, compact, dirs_exist_ok=True, ignore=shutil.ignore_patterns("openvino_model.*"))
    ov.save_model(model, compact / "openvino_model.xml", compress_to_fp16=False)
    scheduler = og.SchedulerConfig()
    scheduler.cache_size = 2
    pipe = og.ContinuousBatchingPipeline(str(compact), scheduler, "CPU", {
        "INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"})
    tok = pipe.get_tokenizer()
    rng = random.Random(a.seed + 1)
    docs = load_corpus(work)
    records: list[dict] = []
    bar = tqdm(total=a.synth_sequences, desc="main answers", unit="seq")
    while len(records) < a.synth_sequences:
        batch = [made for made in (synth_prompt(rng, rng.choice(docs), docs) for _ in range(64)) if made]
        ids = [tok.encode(prompt, add_special_tokens=False).input_ids for prompt, _ in batch]
        configs = []
        for _ in batch:
            cfg = og.GenerationConfig()
            cfg.max_new_tokens = a.synth_new_tokens
            cfg.ignore_eos = rng.random() < 0.5  # the benchmark ignores EOS; the chat stops at it
            configs.append(cfg)
        for (_, kind), prompt_ids, result in zip(batch, ids, pipe.generate(ids, configs), strict=True):
            prompt_list = [int(t) for t in prompt_ids.data[0]]
            records.append({"kind": kind, "prompt": len(prompt_list),
                            "ids": prompt_list + [int(t) for t in result.m_generation_ids[0]]})
        bar.update(len(batch))
    bar.close()
    (work / "synth.json").write_text(json.dumps(records))
    kinds = {k: sum(r["kind"] == k for r in records) for k in sorted({r["kind"] for r in records})}
    log(f"synthetic set: {len(records)} answers of the main, {sum(len(r['ids']) - r['prompt'] for r in records)} "
        f"tokens; prompts by kind {kinds}")
