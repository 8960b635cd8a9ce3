"""Build the shipped demo main/draft pair offline: tokenizer, main, FastDraft-style draft, OpenVINO IR.

Run with the `train` extra installed (torch 2.13.0 CPU, transformers, optimum-intel):

    python -m inference.pairs.demo_build --stage all

Every stage caches its result under --work (default build/demo_pair), so a later stage can be
re-run alone. To align the shipped draft further with fresh answers of the main (no main training,
about 25 minutes on two cores):

    python -m inference.pairs.demo_build --stage corpus tokenizer synth draft export-draft pairjson --draft-from-ir
 The corpus is the running Python's own standard library, split into functions that
each end with the end-of-sequence token: the pair is a small code-completion pair that writes a
function and stops.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import platform
import random
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import time
from pathlib import Path

import torch
import torch.nn.functional as F
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
OUT_DEFAULT = Path(__file__).resolve().parents[1] / "models" / "demo-code"


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


def token_blocks(work: Path, seq_len: int) -> torch.Tensor:
    """The corpus as one stream of documents, each ended by EOS, cut into seq_len blocks."""
    cache = work / f"blocks_{seq_len}.pt"
    if cache.exists():
        return torch.load(cache)
    tok = load_tokenizer(work)
    ids: list[int] = []
    for doc in tqdm(load_corpus(work), desc="tokenize", unit="doc"):
        ids.extend(tok.encode(doc))
        ids.append(tok.eos_token_id)
    n = len(ids) // seq_len
    blocks = torch.tensor(ids[: n * seq_len], dtype=torch.long).view(n, seq_len)
    torch.save(blocks, cache)
    log(f"corpus: {len(ids) / 1e6:.2f} M tokens, {n} blocks of {seq_len}")
    return blocks


# ---------------------------------------------------------------- models
def llama(tok, *, hidden: int, layers: int, heads: int, intermediate: int, max_pos: int = 1024):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_pos,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    return LlamaForCausalLM(cfg)


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def lr_at(step: int, total: int, peak: float, warmup: int = 100) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup))))


def train_loop(model, steps: int, peak_lr: float, batch_fn, loss_fn, desc: str) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=peak_lr, betas=(0.9, 0.95), weight_decay=0.1)
    model.train()
    losses: list[float] = []
    bar = tqdm(range(steps), desc=desc, unit="step")
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, peak_lr)
        loss = loss_fn(model, batch_fn(step))  # fp32: without AMX, bf16 autocast was slower here
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 10 == 0:
            bar.set_postfix(loss=f"{sum(losses[-10:]) / len(losses[-10:]):.3f}")
    model.eval()
    return losses


def lm_loss(model, ids: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids).logits[:, :-1].float()
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1))


def random_batches(blocks: torch.Tensor, batch: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    return lambda step: blocks[torch.randint(len(blocks), (batch,), generator=gen)]


def stage_main(work: Path, a) -> None:
    torch.manual_seed(a.seed)
    tok = load_tokenizer(work)
    blocks = token_blocks(work, a.seq_len)
    model = llama(tok, hidden=a.main_hidden, layers=a.main_layers, heads=a.main_heads, intermediate=a.main_intermediate)
    log(f"main: {n_params(model) / 1e6:.1f} M parameters, {a.main_steps} steps of {a.batch}x{a.seq_len}")
    losses = train_loop(model, a.main_steps, a.main_lr, random_batches(blocks, a.batch, a.seed), lm_loss, "train main")
    model.save_pretrained(work / "main_trained")
    tok.save_pretrained(work / "main_trained")
    record(work, "main_trained", params=n_params(model), steps=a.main_steps, final_loss=sum(losses[-50:]) / 50)


def widen_mlp(model, factor: int):
    """Net2Net widening of every SwiGLU MLP: each hidden unit is copied `factor` times and its
    outgoing weights divided by `factor`, so the function is unchanged but each step costs more."""
    if factor <= 1:
        return model
    for layer in model.model.layers:
        mlp = layer.mlp
        for name in ("gate_proj", "up_proj"):
            lin = getattr(mlp, name)
            wide = torch.nn.Linear(lin.in_features, lin.out_features * factor, bias=False)
            wide.weight.data = lin.weight.data.repeat(factor, 1)
            setattr(mlp, name, wide)
        down = mlp.down_proj
        wide = torch.nn.Linear(down.in_features * factor, down.out_features, bias=False)
        wide.weight.data = down.weight.data.repeat(1, factor) / factor
        mlp.down_proj = wide
    model.config.intermediate_size *= factor
    return model


def stage_grow(work: Path, a) -> None:
    from transformers import LlamaForCausalLM

    tok = load_tokenizer(work)
    small = LlamaForCausalLM.from_pretrained(work / "main_trained").eval()
    probe = token_blocks(work, a.seq_len)[:4]
    with torch.no_grad():
        before = small(input_ids=probe).logits
        grown = widen_mlp(small, a.grow_mlp)
        after = grown(input_ids=probe).logits
    diff = (before - after).abs().max().item()
    grown.save_pretrained(work / "main_hf")
    tok.save_pretrained(work / "main_hf")
    record(work, "main_hf", params=n_params(grown), grow_mlp=a.grow_mlp, max_logit_diff=diff)
    log(f"main grown x{a.grow_mlp} in its MLPs: {n_params(grown) / 1e6:.1f} M parameters, max logit diff {diff:.2e}")


# ---------------------------------------------------------------- draft (FastDraft-style)
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
    (demo_main.shrink: the same function as the served main, 8x cheaper), in the served precision."""
    import openvino as ov
    import openvino_genai as og

    from inference.pairs import demo_main

    compact = work / "main_compact"
    model = ov.Core().read_model(demo_main.SOURCE / "openvino_model.xml")
    demo_main.shrink(model, a.grow_mlp)
    shutil.copytree(demo_main.SOURCE, compact, dirs_exist_ok=True, ignore=shutil.ignore_patterns("openvino_model.*"))
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


def distill_batches(records: list[dict], batch: int, seed: int, pad_id: int):
    """Batches of (ids, labels): labels are the main's own tokens, -100 over the prompt and the padding."""
    gen = torch.Generator().manual_seed(seed)

    def make(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        chosen = [records[i] for i in torch.randint(len(records), (batch,), generator=gen).tolist()]
        width = max(len(r["ids"]) for r in chosen)
        ids = torch.full((batch, width), pad_id, dtype=torch.long)
        labels = torch.full((batch, width), -100, dtype=torch.long)
        for row, r in enumerate(chosen):
            ids[row, : len(r["ids"])] = torch.tensor(r["ids"])
            labels[row, r["prompt"]: len(r["ids"])] = torch.tensor(r["ids"][r["prompt"]:])
        return ids, labels
    return make


def answer_loss(model, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Sequence-level distillation (Kim & Rush 2016): cross-entropy on the main's greedy answer tokens."""
    ids, labels = batch
    logits = model(input_ids=ids).logits[:, :-1].float()
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1), ignore_index=-100)


def draft_from_ir(ir_dir: Path, tok):
    """The committed draft as a torch model (its IR keeps float16 weights: nothing is lost), to go on
    training it. Norm weights are unnamed in the IR: each is placed by the projections it feeds."""
    import openvino as ov
    from transformers import LlamaConfig, LlamaForCausalLM

    model = ov.Core().read_model(ir_dir / "openvino_model.xml")
    weights: dict[str, torch.Tensor] = {}
    for op in model.get_ordered_ops():
        if op.get_type_name() != "Constant" or op.get_output_element_type(0) != ov.Type.f16:
            continue
        name = op.get_friendly_name().removeprefix("self.").removesuffix("_compressed")
        value = torch.from_numpy(op.get_data().astype("float32"))
        if name.endswith(".weight"):
            weights[name] = value
            continue
        multiply = next(iter(op.output(0).get_target_inputs())).get_node()
        multiply = next(iter(multiply.output(0).get_target_inputs())).get_node()  # Convert -> Multiply
        fed = " ".join(t.get_node().get_friendly_name() for t in multiply.output(0).get_target_inputs())
        layer = fed.split("model.layers.")[1].split(".")[0] if "model.layers." in fed else ""
        if "lm_head" in fed:
            weights["model.norm.weight"] = value.flatten()
        elif "q_proj" in fed:
            weights[f"model.layers.{layer}.input_layernorm.weight"] = value.flatten()
        elif "gate_proj" in fed:
            weights[f"model.layers.{layer}.post_attention_layernorm.weight"] = value.flatten()
    config = LlamaConfig.from_pretrained(ir_dir)
    draft = LlamaForCausalLM(config)
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    missing, unexpected = draft.load_state_dict(weights, strict=False)
    if [m for m in missing if "rotary" not in m] or unexpected:
        raise ValueError(f"the draft IR does not map onto {ir_dir}/config.json: "
                         f"missing {missing}, unexpected {unexpected}")
    return draft


def stage_draft(work: Path, a) -> None:
    torch.manual_seed(a.seed + 2)
    tok = load_tokenizer(work)
    blocks = token_blocks(work, a.seq_len)
    if a.draft_from_ir:  # go on from the shipped draft: its pretraining and first distillation are kept
        draft = draft_from_ir(Path(a.out) / "draft", tok)
        shipped = json.loads((Path(a.out) / "pair.json").read_text())["draft"]
        pre = [shipped["pretrain_loss"]] * 50
        a.draft_pretrain_steps = shipped["pretrain_steps"]
        rounds = shipped.get("distillation_rounds") or [{"steps": shipped["distill_steps"],
                                                          "loss": shipped["distill_loss"]}]
    else:
        rounds = []
        draft = llama(tok, hidden=a.draft_hidden, layers=a.draft_layers, heads=a.draft_heads,
                      intermediate=a.draft_intermediate)
        pre = train_loop(draft, a.draft_pretrain_steps, a.draft_lr, random_batches(blocks, a.batch, a.seed + 3),
                         lm_loss, "pretrain draft")
    log(f"draft: {n_params(draft) / 1e6:.2f} M parameters")
    records = json.loads((work / "synth.json").read_text())
    dist = train_loop(draft, a.draft_distill_steps, a.draft_lr / 2,
                      distill_batches(records, a.batch, a.seed + 4, tok.pad_token_id), answer_loss, "distill draft")
    draft.save_pretrained(work / "draft_hf")
    tok.save_pretrained(work / "draft_hf")
    loss = sum(dist[-50:]) / 50
    rounds.append({"steps": a.draft_distill_steps, "peak_lr": a.draft_lr / 2, "loss": loss,
                   "data": f"CE on the main's greedy answers to {len(records)} prompts"})
    record(work, "draft_hf", params=n_params(draft), pretrain_steps=a.draft_pretrain_steps,
           pretrain_loss=sum(pre[-50:]) / 50, distill_steps=sum(r["steps"] for r in rounds),
           distill_answers=len(records), distill_loss=loss, distillation_rounds=rounds)


# ---------------------------------------------------------------- export
def export(src: Path, dst: Path, weight_format: str) -> None:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    cmd = [sys.executable, "-m", "optimum.commands.optimum_cli", "export", "openvino", "--model", str(src),
           "--task", "text-generation-with-past", "--weight-format", weight_format, str(dst)]
    log(" ".join(cmd))
    subprocess.run(cmd, check=True, env=env)
    for leftover in ("tokenizer.json", "vocab.json", "merges.txt"):
        (dst / leftover).unlink(missing_ok=True)  # the IR tokenizer is what the app loads


def stage_export_main(work: Path, a) -> None:
    export(work / "main_hf", Path(a.out) / "main", a.main_weights)
    record(work, "export_main", weights=a.main_weights)


def stage_export_draft(work: Path, a) -> None:
    export(work / "draft_hf", Path(a.out) / "draft", a.draft_weights)
    record(work, "export_draft", weights=a.draft_weights)


def measure_pair(main_dir: Path, draft_dir: Path, prompts: list[str], ks, repeats: int, thresholds=()) -> dict:
    """Greedy, 128 new tokens, concurrency 1, in-process: main alone vs with the draft, same backend."""
    from inference.benchmark.inprocess import default_variants, draft_cost_ratio, measure_inprocess, summarize
    from inference.engines.base import PairSpec

    spec = PairSpec(slug="demo-code", main_dir=str(main_dir), draft_dir=str(draft_dir))
    variants = default_variants(ks=ks, thresholds=thresholds)
    bar = tqdm(desc=f"measure {main_dir.name}", unit="gen")

    def progress(done: int, total: int, label: str) -> None:
        bar.total = total
        bar.update(done - bar.n)

    results = measure_inprocess(spec=spec, prompts=prompts, variants=variants, max_new_tokens=128, repeats=repeats,
                                progress=progress)
    bar.close()
    ratio = draft_cost_ratio(spec=spec, prompt=prompts[0])
    return {"draft_main_cost_ratio": ratio, "rows": summarize(results, cost_ratio=ratio)}


def stage_measure(work: Path, a) -> None:
    """Measure the exported pair on held-out prompts, and how the speedup grows with the main's size."""
    from inference.benchmark.inprocess import print_table

    out = Path(a.out)
    prompts = json.loads(HELDOUT.read_text())["code"]
    full = measure_pair(out / "main", out / "draft", prompts, range(1, 9), repeats=1, thresholds=(0.3, 0.5))
    print_table(full["rows"], out=log)
    k_rows = [r for r in full["rows"] if r["variant"].startswith("K=")]
    best = max(k_rows, key=lambda r: r["speedup"])
    best_k = int(best["variant"][2:])
    curve = []
    for factor in sorted({1, a.grow_mlp // 2, a.grow_mlp} - {0}):
        if factor == a.grow_mlp:
            row = best
            params = json.loads((work / "record.json").read_text())["main_hf"]["params"]
        else:
            from transformers import LlamaForCausalLM

            grown = widen_mlp(LlamaForCausalLM.from_pretrained(work / "main_trained"), factor)
            params = n_params(grown)
            grown.save_pretrained(work / f"main_x{factor}")
            load_tokenizer(work).save_pretrained(work / f"main_x{factor}")
            export(work / f"main_x{factor}", work / f"main_x{factor}_ir", a.main_weights)
            row = next(r for r in measure_pair(work / f"main_x{factor}_ir", out / "draft", prompts[:6], [best_k],
                                               repeats=1)["rows"] if r["variant"] == f"K={best_k}")
        curve.append({"main_params": params, "mlp_growth": factor, "k": best_k,
                      "acceptance_rate": row["acceptance_rate"],
                      "speedup": row["speedup"]})
        log(f"main x{factor} ({params / 1e6:.0f} M): speedup {row['speedup']:.2f} at K={best_k}")
    measured = {
        "when": time.strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}",
        "settings": "greedy, 128 new tokens (EOS ignored), concurrency 1, in-process ContinuousBatchingPipeline, "
                    "f32 inference with f32 KV cache, main alone on the same backend as the baseline",
        "prompts": f"{len(prompts)} held-out code prompts (inference/prompts/heldout.json)",
        "best_k": best_k,
        "acceptance_at_best_k": best["acceptance_rate"],
        "speedup_at_best_k": best["speedup"],
        "theoretical_speedup_at_best_k": best.get("theoretical_speedup"),
        "identical_to_main_on_all_prompts": all(r["identical_to_plain"] for r in full["rows"]),
        "draft_main_cost_ratio": full["draft_main_cost_ratio"],
        "variants": full["rows"],
        "main_size_curve": curve,
    }
    pair_path = out / "pair.json"
    pair = json.loads(pair_path.read_text()) if pair_path.exists() else {}
    pair["measured"] = measured
    pair_path.write_text(json.dumps(pair, indent=1) + "\n")
    log(f"best K={best_k}: acceptance {best['acceptance_rate']:.2f}, speedup {best['speedup']:.2f}x, "
        f"identical: {measured['identical_to_main_on_all_prompts']}")


def stage_pair_json(work: Path, a) -> None:
    """pair.json: how the pair was made (the measure stage adds the numbers). Only what this build
    made is rewritten: a draft trained further keeps the main's section as it was."""
    from transformers import AutoConfig

    info = json.loads((work / "record.json").read_text())
    out = Path(a.out)
    pair_path = out / "pair.json"
    pair = json.loads(pair_path.read_text()) if pair_path.exists() else {}
    keep = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
    pair.update({
        "name": "demo-code",
        "description": "Python code-completion pair trained offline on CPython's standard library.",
        "corpus": f"CPython {sys.version.split()[0]} standard library (tests excluded), one function per document",
        "seed": a.seed,
        "recommended": {"inference_precision": "f32", "kv_cache_precision": "f32"},
    })
    if "main_hf" in info:
        cfg = AutoConfig.from_pretrained(work / "main_hf").to_dict()
        pair["main"] = {**pair.get("main", {}), **{k: cfg[k] for k in keep}, **info["main_hf"],
                        "trained": info.get("main_trained", {}),
                        "weights": info.get("export_main", {}).get("weights"),
                        "growth": "Net2Net MLP widening after training (function-preserving): the main computes "
                                  "what the trained model computes, at the cost of a model this size"}
    if "draft_hf" in info:
        cfg = AutoConfig.from_pretrained(work / "draft_hf").to_dict()
        pair["draft"] = {**{k: cfg[k] for k in keep}, **info["draft_hf"],
                         "weights": info.get("export_draft", {}).get("weights"),
                         "alignment": "FastDraft-style: pretrained on the corpus, then distilled (in the rounds "
                                      "listed, where listed) on the main's own "
                                      "greedy answers (sequence-level: cross-entropy on the answer tokens) to "
                                      f"{info['draft_hf'].get('distill_answers', 0)} prompts drawn from the corpus: "
                                      "signatures with docstrings, partial bodies, and chat requests through the "
                                      "chat template (inference/pairs/demo_build.py, synth_prompt)"}
    pair_path.write_text(json.dumps(pair, indent=1) + "\n")
    log(f"wrote {pair_path}")


def record(work: Path, key: str, **values) -> None:
    path = work / "record.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[key] = values
    path.write_text(json.dumps(data, indent=1))


STAGES = {
    "corpus": lambda w, a: stage_corpus(w, a.seed),
    "tokenizer": lambda w, a: stage_tokenizer(w, a.vocab_size),
    "main": stage_main,
    "grow": stage_grow,
    "export-main": stage_export_main,
    "synth": stage_synth,
    "draft": stage_draft,
    "export-draft": stage_export_draft,
    "pairjson": stage_pair_json,
    "measure": stage_measure,
}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stage", nargs="+", default=["all"], choices=["all", *STAGES])
    p.add_argument("--work", default="build/demo_pair")
    p.add_argument("--out", default=str(OUT_DEFAULT))
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--main-hidden", type=int, default=384)
    p.add_argument("--main-layers", type=int, default=6)
    p.add_argument("--main-heads", type=int, default=6)
    p.add_argument("--main-intermediate", type=int, default=1024)
    p.add_argument("--main-steps", type=int, default=900)
    p.add_argument("--main-lr", type=float, default=1.5e-3)
    p.add_argument("--grow-mlp", type=int, default=8)
    p.add_argument("--synth-sequences", type=int, default=8000)
    p.add_argument("--synth-new-tokens", type=int, default=128)
    p.add_argument("--draft-hidden", type=int, default=256)
    p.add_argument("--draft-layers", type=int, default=2)
    p.add_argument("--draft-heads", type=int, default=4)
    p.add_argument("--draft-intermediate", type=int, default=768)
    p.add_argument("--draft-pretrain-steps", type=int, default=300)
    p.add_argument("--draft-distill-steps", type=int, default=900)
    p.add_argument("--draft-lr", type=float, default=2e-3)
    p.add_argument("--draft-from-ir", action="store_true",
                   help="go on training the committed draft (out/draft) instead of a new one")
    p.add_argument("--main-weights", default="int8", choices=["fp16", "int8", "int4"])
    p.add_argument("--draft-weights", default="fp16", choices=["fp16", "int8", "int4"])
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    stages = list(STAGES) if a.stage == ["all"] else a.stage
    for name in stages:
        log(f"stage {name}")
        STAGES[name](work, a)


if __name__ == "__main__":
    main()
