"""Build the shipped demo main/draft pair offline: tokenizer, main, FastDraft-style draft, OpenVINO IR.

Run with the `train` extra installed (torch 2.13.0 CPU, transformers, optimum-intel):

    python -m inference.demo.build --stage all

Every stage caches its result under --work (default build/demo_pair), so a later stage can be
re-run alone. To align the shipped draft further with fresh answers of the main (no main training,
about 25 minutes on two cores):

    python -m inference.demo.build --stage corpus tokenizer synth draft export-draft pairjson --draft-from-ir

The corpus is the running Python's own standard library, split into functions that each end with
the end-of-sequence token: the pair is a small code-completion pair that writes a function and
stops. The data stages live in `demo.data`, the models and their training loops in `demo.training`;
this module runs the stages in order and exports, measures and describes the result.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from inference.demo.data import (
    HELDOUT,
    load_tokenizer,
    log,
    stage_corpus,
    stage_synth,
    stage_tokenizer,
)
from inference.demo.training import (
    answer_loss,
    distill_batches,
    draft_from_ir,
    llama,
    lm_loss,
    n_params,
    random_batches,
    token_blocks,
    train_loop,
    widen_mlp,
)

OUT_DEFAULT = Path(__file__).resolve().parents[1] / "models" / "demo-code"


# ---------------------------------------------------------------- main
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
    from inference.benchmark.inprocess import default_variants, draft_cost_ratio, measure_inprocess
    from inference.benchmark.summary import summarize
    from inference.engines.spec import PairSpec

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
    from inference.benchmark.summary import print_table

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
                                      "chat template (inference/demo/data.py, synth_prompt)"}
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
