"""Train the small demo model committed under models/demo (`python tools/train.py`).

Everything is generated here, nothing is downloaded: the corpus comes from
`mpllm.training.corpus` (fixed seed), the byte-level BPE tokenizer from
`mpllm.training.tokenizers.train_tokenizer_json`, and the model is the PLE architecture
of the release model (`mpllm.reference.torch_model.PLEModel`) trained with AdamW and a cosine
schedule on CPU. The last part of training fake-quantizes the weights to
int4 (straight-through), so the exported model.bin loses little to
quantization. Outputs, in --out:

  model.bin          esp32-ai format (mpllm.formats.esp32ai.write_model_bin)
  tokenizer.json     Hugging Face tokenizers JSON
  train_report.json  the facts RECIPE.md quotes: command, seed, steps, losses,
                     sizes, hashes, wall time and one greedy story

`--family llama2c` trains llama2.c's Llama instead (mpllm.reference.torch_llama,
the shape of llama2.c's stories260K by default) on the same corpus, with a
sentencepiece vocabulary (mpllm.training.llama2c_vocab), and writes what
llama2.c's own scripts write: model.bin (its v0 checkpoint, fp32: the
converter quantizes) and tokenizer.bin. Each story starts with BOS, as
llama2.c trains, so the model ends a story by writing the next BOS.

Torch is only needed here (pip install -e .[dev]); running the model is not.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from ..atomic import atomic_write_bytes
from ..formats.align import align_up
from ..formats.esp32ai import write_model_bin
from ..formats.model import Config
from ..reference.torch_model import PLEModel, TorchTwin, to_weights
from . import corpus
from .tokenizers import train_tokenizer_json

EOT_ID = 0  # train_tokenizer_json puts <|endoftext|> first
FAMILIES = ("ple", "llama2c")
#: per family: the defaults of the options whose default is None
DEFAULTS = {
    "ple": {"vocab": 1000, "layers": 6, "dim": 96, "heads": 4, "kv_heads": 4, "ffn": 66,
            "qat_frac": 0.3},
    # llama2.c's stories260K shape
    "llama2c": {"vocab": 512, "layers": 5, "dim": 64, "heads": 8, "kv_heads": 4, "ffn": 172,
                "qat_frac": 0.0},
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Train the demo PLE TinyStories model on a generated corpus (CPU).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--family", choices=FAMILIES, default="ple",
                   help="ple: the esp32-ai architecture (model.bin + tokenizer.json); llama2c: "
                        "llama2.c's Llama (model.bin + tokenizer.bin as llama2.c writes them)")
    p.add_argument("--out", default="models/demo", help="output directory")
    p.add_argument("--seed", type=int, default=1234, help="corpus, init and data-order seed")
    p.add_argument("--steps", type=int, default=1200, help="optimizer steps")
    p.add_argument("--batch", type=int, default=8, help="sequences per step")
    p.add_argument("--stories", type=int, default=20000, help="training stories")
    p.add_argument("--val-stories", type=int, default=300, help="held-out stories")
    p.add_argument("--vocab", type=int, default=None,
                   help="tokenizer size (= output vocab); default 1000, llama2c 512")
    p.add_argument("--vocab-in", type=int, default=0,
                   help="embedding/PLE rows; 0 = tokenizer size rounded up to a multiple of 64 "
                        "(spare rows mirror the release, whose input vocab exceeds its tokenizer)")
    p.add_argument("--layers", type=int, default=None, help="default 6, llama2c 5")
    p.add_argument("--dim", type=int, default=None, help="default 96, llama2c 64")
    p.add_argument("--heads", type=int, default=None, help="default 4, llama2c 8")
    p.add_argument("--kv-heads", type=int, default=None,
                   help="llama2c: key/value heads, each shared by heads/kv-heads query heads "
                        "(default 4)")
    p.add_argument("--ffn", type=int, default=None, help="FFN width; default 66, llama2c 172")
    p.add_argument("--ple", type=int, default=128, help="per-layer embedding width P")
    p.add_argument("--ctx", type=int, default=256, help="context length (training window)")
    p.add_argument("--group", type=int, default=128, help="int4 quantization group")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    p.add_argument("--min-lr-frac", type=float, default=0.1, help="final lr / peak lr")
    p.add_argument("--warmup", type=int, default=60, help="linear warm-up steps")
    p.add_argument("--wd", type=float, default=0.1, help="AdamW weight decay (matrices only)")
    p.add_argument("--qat-frac", type=float, default=None,
                   help="fraction of the final steps trained with int4 fake quantization "
                        "(default 0.3; llama2c: 0, its checkpoint is fp32)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--prompt", default="Once upon a time", help="greedy check prompt")
    return p


@dataclass
class Data:
    tokenizer_json: str  # ple: the tokenizer.json text; llama2c: ""
    vocab_out: int
    train: torch.Tensor  # [n_windows, ctx + 1] int64
    val: torch.Tensor
    train_tokens: int  # corpus tokens including one EOT (llama2c: one BOS) per story
    tokenizer_bin: bytes = b""  # llama2c: llama2.c's tokenizer.bin


def _windows(encoded: Sequence[Sequence[int]], ctx: int, end_id: int | None = EOT_ID
             ) -> torch.Tensor:
    """Windows of ctx+1 tokens: one starting at every story that has ctx+1
    tokens after it, and for every story too long to end inside that window,
    one more that ends with its end.

    Windows start where stories start because generation always starts a
    story at position 0; what follows the story's EOT is the next story
    (end_id None: each story's ids already start with BOS, which ends the one
    before). The second window of a long story is what teaches a long story
    its ending (the end token comes only after an ending, never after a
    window's cut), and it starts mid-story, as a co-written story's context
    does once the chat has rolled it over.
    """
    stream: list[int] = []
    starts: list[int] = []
    for ids in encoded:
        starts.append(len(stream))
        stream.extend(ids)
        if end_id is not None:
            stream.append(end_id)
    arr = np.asarray(stream, np.int64)
    # where each story's end token is: its EOT, or the next story's BOS
    ends = [s - 1 for s in starts[1:]] + [len(arr) - 1] if end_id is not None else starts[1:]
    tails = [e - ctx for s, e in zip(starts, ends) if e - s > ctx and e - ctx >= 0]
    starts = [s for s in starts if s + ctx + 1 <= len(arr)]
    if not starts:
        raise ValueError(f"corpus of {len(arr)} tokens is too short for one window of {ctx + 1}")
    return torch.from_numpy(np.stack([arr[s:s + ctx + 1] for s in starts + tails]))


def make_data(args: argparse.Namespace) -> Data:
    from tokenizers import Tokenizer

    texts = corpus.stories(args.stories + args.val_stories, args.seed)
    train_texts, val_texts = texts[:args.stories], texts[args.stories:]
    tok_json = train_tokenizer_json(train_texts, args.vocab)
    tok = Tokenizer.from_str(tok_json)
    if tok.token_to_id(corpus.EOT) != EOT_ID:
        raise RuntimeError(f"tokenizer puts {corpus.EOT} at id {tok.token_to_id(corpus.EOT)}, "
                           f"expected {EOT_ID}")
    tr = [e.ids for e in tok.encode_batch(train_texts)]
    va = [e.ids for e in tok.encode_batch(val_texts)]
    too_long = sum(len(x) + 1 > args.ctx for x in tr + va)
    if too_long:
        # Only tiny tokenizers (tests) get here; windows then cut those stories.
        print(f"note: {too_long} stories need more than --ctx {args.ctx} tokens with their EOT",
              flush=True)
    return Data(tok_json, tok.get_vocab_size(), _windows(tr, args.ctx), _windows(va, args.ctx),
                sum(len(x) + 1 for x in tr))


def make_llama2c_data(args: argparse.Namespace) -> Data:
    """The corpus under a sentencepiece vocabulary trained on it, each story
    encoded as llama2.c encodes a text: BOS first (llm.Tokenizer's rule, the
    one the board runs)."""
    from llm_tokenizer import Tokenizer

    from ..formats import llama2c
    from ..formats.tokenizer import tokenizer_section
    from .llama2c_vocab import train_vocab

    texts = corpus.stories(args.stories + args.val_stories, args.seed)
    train_texts, val_texts = texts[:args.stories], texts[args.stories:]
    pieces, scores = train_vocab(train_texts, args.vocab)
    tok = Tokenizer(tokenizer_section(llama2c.tokenizer_tables(pieces, scores)))
    tr = [tok.encode(t) for t in train_texts]
    va = [tok.encode(t) for t in val_texts]
    return Data("", len(pieces), _windows(tr, args.ctx, None), _windows(va, args.ctx, None),
                sum(len(x) for x in tr), llama2c.tokenizer_bin_bytes(pieces, scores))


def lr_at(step: int, args: argparse.Namespace) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    t = (step - args.warmup) / max(1, args.steps - args.warmup)
    lo = args.lr * args.min_lr_frac
    return lo + 0.5 * (args.lr - lo) * (1.0 + math.cos(math.pi * min(1.0, t)))


def _loss(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    logits = model(batch[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


@torch.no_grad()
def evaluate(model: torch.nn.Module, windows: torch.Tensor, batch: int) -> float:
    """Mean cross-entropy per predicted token (nats) over `windows`."""
    was = model.training
    model.eval()
    total, n = 0.0, 0
    for i in range(0, len(windows), batch):
        b = windows[i:i + batch]
        total += float(_loss(model, b)) * b.shape[0]
        n += b.shape[0]
    model.train(was)
    return total / n


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class Trained:
    first_loss: float
    recent: list[float]  # the last 20 steps' losses
    history: list[dict]  # the evaluations during training
    seconds: float


def _decayed(name: str, p: torch.nn.Parameter) -> bool:
    """AdamW decays the matrices the forward pass multiplies, not lookup tables or norms."""
    return p.ndim >= 2 and name not in ("tok_emb", "ple_table", "tok_embeddings")


def train_loop(model: torch.nn.Module, data: Data, args: argparse.Namespace,
               t_start: float) -> Trained:
    """AdamW over the training windows with warm-up and cosine decay; the last
    qat_frac of the steps fake-quantized (models that have `fake_quant`)."""
    named = list(model.named_parameters())
    opt = torch.optim.AdamW([{"params": [p for n, p in named if _decayed(n, p)],
                              "weight_decay": args.wd},
                             {"params": [p for n, p in named if not _decayed(n, p)],
                              "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(args.seed)
    order = torch.randperm(len(data.train), generator=gen)
    cursor = 0
    qat_from = args.steps - round(args.qat_frac * args.steps)
    eval_windows = data.val[:64]
    history: list[dict] = []
    recent: list[float] = []
    t_train = time.time()
    t_log, tok_log = t_train, 0
    first_loss = math.nan
    for step in range(args.steps):
        if step == qat_from and args.qat_frac > 0:
            model.fake_quant = True
            print(f"step {step}: int4 fake quantization on for the remaining "
                  f"{args.steps - step} steps", flush=True)
        if cursor + args.batch > len(order):
            order = torch.randperm(len(data.train), generator=gen)
            cursor = 0
        batch = data.train[order[cursor:cursor + args.batch]]
        cursor += args.batch
        lr = lr_at(step, args)
        for g in opt.param_groups:
            g["lr"] = lr
        loss = _loss(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        lv = loss.item()
        if step == 0:
            first_loss = lv
        if not math.isfinite(lv):
            raise RuntimeError(f"training diverged at step {step}: loss {lv}")
        recent = (recent + [lv])[-20:]
        tok_log += batch.numel() - batch.shape[0]
        last = step + 1 == args.steps
        if (step + 1) % args.log_every == 0 or last:
            now = time.time()
            print(f"step {step + 1}/{args.steps} loss {lv:.4f} (avg20 {np.mean(recent):.4f}) "
                  f"lr {lr:.2e} {tok_log / (now - t_log):.0f} tok/s "
                  f"elapsed {now - t_start:.0f}s", flush=True)
            t_log, tok_log = now, 0
        if (step + 1) % args.eval_every == 0 and not last:
            vl = evaluate(model, eval_windows, args.batch)
            history.append({"step": step + 1, "train_avg20": float(np.mean(recent)), "val": vl})
            print(f"step {step + 1}: val loss {vl:.4f} (first {len(eval_windows)} windows)",
                  flush=True)
    return Trained(first_loss, recent, history, time.time() - t_train)


def _train_new(model: torch.nn.Module, data: Data, args: argparse.Namespace, t_start: float,
               shape: str) -> Trained:
    """Initialise `model` from the seed, say what is trained on what, and train it."""
    model.reset_parameters(seed=args.seed)  # type: ignore[operator]
    print(f"corpus: {args.stories} train / {args.val_stories} val stories, "
          f"{data.train_tokens} train tokens, {len(data.train)} windows of {args.ctx + 1}; "
          f"tokenizer {data.vocab_out} entries", flush=True)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {shape}; {n_params} parameters", flush=True)
    return train_loop(model, data, args, t_start)


def _report(args: argparse.Namespace, data: Data, t: Trained, t_start: float,
            files: Sequence[Path], **facts: object) -> dict:
    """The report's keys shared by the families; `facts` adds the family's own."""
    return {
        "command": "python tools/train.py " + shlex.join(sys.argv[1:])
        if Path(sys.argv[0]).name == "train.py" else None,
        "args": vars(args),
        "family": args.family,
        "seed": args.seed,
        "steps": args.steps,
        "tokens_seen": args.steps * args.batch * args.ctx,
        "train_tokens": data.train_tokens,
        **facts,
        "first_step_loss": t.first_loss,
        "train_loss_avg_last20": float(np.mean(t.recent)),
        "val_windows": len(data.val),
        "history": t.history,
        "train_seconds": round(t.seconds, 1),
        "total_seconds": round(time.time() - t_start, 1),
        "files": {p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in files},
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def _write_report(out: Path, report: dict, model_path: Path) -> None:
    atomic_write_bytes(out / "train_report.json",
                       (json.dumps(report, indent=1) + "\n").encode("utf-8"))
    names = ", ".join(report["files"])
    print(f"wrote {names} ({model_path.stat().st_size} bytes of model) and "
          f"{out / 'train_report.json'} in {report['total_seconds']:.0f}s", flush=True)


def run(args: argparse.Namespace) -> dict:
    """Train, export and check; returns the report (also written to train_report.json)."""
    t_start = time.time()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.family == "llama2c":
        return run_llama2c(args, out, t_start)

    data = make_data(args)
    vocab_in = args.vocab_in or align_up(data.vocab_out, 64)
    cfg = Config(vocab_in=vocab_in, vocab_out=data.vocab_out, dim=args.dim,
                 n_layers=args.layers, n_heads=args.heads, ffn=args.ffn, ple_dim=args.ple,
                 seq_len=args.ctx, group=args.group)
    model = PLEModel(cfg)
    n_params = model.n_params()
    t = _train_new(model, data, args, t_start,
                   f"vocab_in {vocab_in}, vocab_out {data.vocab_out}, D {cfg.dim}, "
                   f"L {cfg.n_layers}, H {cfg.n_heads}, F {cfg.ffn}, P {cfg.ple_dim}, "
                   f"ctx {cfg.seq_len}")

    val_fp32 = evaluate(model, data.val, args.batch)
    weights = to_weights(model, group=args.group)
    twin = TorchTwin.from_weights(weights)
    val_int4 = evaluate(twin.module, data.val, args.batch)
    print(f"final: train avg20 {np.mean(t.recent):.4f}, val {val_fp32:.4f} "
          f"({'fake-quant ' if model.fake_quant else ''}fp32 module), "
          f"val {val_int4:.4f} (exported int4 weights), {len(data.val)} val windows", flush=True)

    model_path, tok_path = out / "model.bin", out / "tokenizer.json"
    write_model_bin(weights, model_path)
    atomic_write_bytes(tok_path, data.tokenizer_json.encode("utf-8"))

    from tokenizers import Tokenizer
    tok = Tokenizer.from_str(data.tokenizer_json)
    prompt_ids = tok.encode(args.prompt).ids
    story_ids = twin.generate(prompt_ids, cfg.seq_len - len(prompt_ids), eot=EOT_ID)
    ended = bool(story_ids) and story_ids[-1] == EOT_ID
    text = args.prompt + tok.decode([t for t in story_ids if t != EOT_ID])
    print(f"greedy ({len(story_ids)} tokens, {'ends with' if ended else 'NO'} "
          f"<|endoftext|>):\n{text}", flush=True)

    report = _report(
        args, data, t, t_start, (model_path, tok_path),
        config={k: getattr(cfg, k) for k in ("vocab_in", "vocab_out", "dim", "n_layers",
                                             "n_heads", "ffn", "ple_dim", "seq_len",
                                             "group", "rope_theta", "tied_head")},
        parameters=n_params,
        parameters_by_tensor={
            "tok_emb": model.tok_emb.numel(), "ple_table": model.ple_table.numel(),
            "ple_model_proj": model.ple_model_proj.numel(),
            "core_matrices": sum(p.numel() for n, p in model.layers.named_parameters()
                                 if p.ndim == 2),
            "norm_weights": sum(p.numel() for p in model.parameters() if p.ndim == 1),
        },
        val_loss_fp32=val_fp32, val_loss_int4=val_int4,
        greedy={"prompt": args.prompt, "prompt_ids": prompt_ids, "ids": story_ids,
                "text": text, "ends_with_eot": ended})
    _write_report(out, report, model_path)
    return report


@torch.no_grad()
def greedy_llama(model: torch.nn.Module, prompt_ids: Sequence[int], max_new: int,
                 stop: Sequence[int]) -> list[int]:
    """Greedy continuation of prompt_ids, up to and including the first id in `stop`."""
    ids = list(prompt_ids)
    out: list[int] = []
    was = model.training
    model.eval()
    while len(out) < max_new:
        nxt = int(model(torch.tensor([ids]))[0, -1].argmax())
        out.append(nxt)
        ids.append(nxt)
        if nxt in stop:
            break
    model.train(was)
    return out


def run_llama2c(args: argparse.Namespace, out: Path, t_start: float) -> dict:
    """--family llama2c: llama2.c's Llama on the corpus; its model.bin (v0) and tokenizer.bin."""
    from llm_tokenizer import Tokenizer

    from ..formats import llama2c
    from ..formats.tokenizer import tokenizer_section
    from ..reference.torch_llama import LlamaModel

    data = make_llama2c_data(args)
    cfg = llama2c.Llama2cConfig(dim=args.dim, hidden_dim=args.ffn, n_layers=args.layers,
                                n_heads=args.heads, n_kv_heads=args.kv_heads,
                                vocab_size=data.vocab_out, seq_len=args.ctx,
                                shared_classifier=True)
    model = LlamaModel(cfg)
    t = _train_new(model, data, args, t_start,
                   f"llama2.c Llama, vocab {cfg.vocab_size}, dim {cfg.dim}, "
                   f"hidden {cfg.hidden_dim}, layers {cfg.n_layers}, heads {cfg.n_heads} "
                   f"(kv {cfg.n_kv_heads}), ctx {cfg.seq_len}")
    val_fp32 = evaluate(model, data.val, args.batch)
    print(f"final: train avg20 {np.mean(t.recent):.4f}, val {val_fp32:.4f}, "
          f"{len(data.val)} val windows", flush=True)

    model_path, tok_path = out / "model.bin", out / "tokenizer.bin"
    atomic_write_bytes(model_path, llama2c.checkpoint_bytes(model.to_checkpoint(), 0))
    atomic_write_bytes(tok_path, data.tokenizer_bin)
    tok = Tokenizer(tokenizer_section(llama2c.load_tokenizer_bin(tok_path)))
    prompt_ids = tok.encode(args.prompt)
    story_ids = greedy_llama(model, prompt_ids, cfg.seq_len - len(prompt_ids), tok.stop_ids)
    ended = bool(story_ids) and story_ids[-1] in tok.stop_ids
    text = tok.decode(prompt_ids + [t for t in story_ids if t not in tok.stop_ids])
    print(f"greedy ({len(story_ids)} tokens, {'ends with' if ended else 'NO'} BOS/EOS):\n"
          f"{text}", flush=True)
    report = _report(
        args, data, t, t_start, (model_path, tok_path),
        config={"dim": cfg.dim, "hidden_dim": cfg.hidden_dim, "n_layers": cfg.n_layers,
                "n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads,
                "vocab_size": cfg.vocab_size, "seq_len": cfg.seq_len,
                "shared_classifier": cfg.shared_classifier},
        parameters=model.n_params(), val_loss_fp32=val_fp32,
        greedy={"prompt": args.prompt, "prompt_ids": prompt_ids, "ids": story_ids,
                "text": text, "ends_with_stop": ended})
    _write_report(out, report, model_path)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for name, value in DEFAULTS[args.family].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.family == "llama2c" and args.qat_frac:
        raise SystemExit("train.py: --qat-frac applies to --family ple (a llama2.c checkpoint "
                         "is fp32; the converter quantizes it)")
    for name in ("steps", "batch", "stories", "val_stories", "vocab", "threads", "log_every",
                 "eval_every", "layers", "dim", "heads", "kv_heads", "ffn"):
        if getattr(args, name) <= 0:
            raise SystemExit(f"train.py: --{name.replace('_', '-')} must be positive")
    if not 0.0 <= args.qat_frac <= 1.0:
        raise SystemExit("train.py: --qat-frac must be in 0..1")
    if args.family == "llama2c":
        from ..formats.llama2c import CheckpointError, Llama2cConfig, check_config
        try:
            check_config(Llama2cConfig(args.dim, args.ffn, args.layers, args.heads,
                                       args.kv_heads, args.vocab, args.ctx, True), "train.py")
        except CheckpointError as e:
            raise SystemExit(str(e)) from None
    if args.vocab_in and args.vocab_in < args.vocab:
        raise SystemExit(f"train.py: --vocab-in {args.vocab_in} is below --vocab {args.vocab}")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    run(args)
    return 0
