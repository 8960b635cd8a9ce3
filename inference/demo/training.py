"""The demo pair's models and how they learn: small Llamas, their training loops, the function-
preserving widening that makes the main cost what a bigger model costs, and the distillation
batches the draft learns the main's answers from. Needs the `train` extra (torch, transformers).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from inference.demo.data import load_corpus, load_tokenizer, log


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
