"""Train the embedded demo model ``tinyllm`` from CPython's own documentation.

Run through ``make model``; it needs torch (CPU), tokenizers, safetensors and numpy,
installed in the separate ``.venv-train`` so torch never becomes a run-time dependency.

Strategy:

* **Corpus** (deterministic for a given CPython version): ``pydoc_data.topics`` plus the
  docstrings of every stdlib module, class and function, read with ``ast`` from the
  source files (nothing is imported, so no module side effects). Both are PSF-licensed.
  Each text becomes one chat-formatted document, ``<|user|>\\n{name}\\n<|assistant|>\\n
  {text}<|endoftext|>``, so the model learns the chat template it is served with.
  Every 20th document (by position in a fixed order) is held out for validation.
* **Tokenizer**: byte-level BPE with 1,024 tokens, trained with ``tokenizers``.
* **Model**: a Llama-style decoder (RMSNorm, RoPE, SwiGLU, tied embeddings), hidden
  128, 4 layers, 4 heads, about 0.9 M parameters, trained with AdamW on one CPU thread
  for a fixed number of steps, with fixed seeds, so a rerun gives the same weights.
* **Output**: ``weights.safetensors`` (fp16), ``tokenizer.json`` and ``config.json``
  in ``src/zeroserve/models/tinyllm/``. ``config.json`` records the validation loss in
  bits per character and the corpus hash, and nothing time-dependent: with the same
  CPython, torch and library versions, a rerun writes byte-identical files (checked:
  two runs gave the same weights.safetensors and tokenizer.json SHA-256).

The numpy inference in ``zeroserve.models.tinyllm`` mirrors ``forward`` below exactly
(RoPE in the "rotate half" convention, RMSNorm eps, SwiGLU).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import math
import os
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from torch import nn

SEED = 1234
EOS = "<|endoftext|>"
# Chat roles are single tokens so templated prompts tokenize the same way every time.
SPECIAL_TOKENS = [EOS, "<|system|>", "<|user|>", "<|assistant|>"]

CONFIG = {
    "vocab_size": 1024,
    "hidden_size": 128,
    "num_layers": 4,
    "num_heads": 4,
    "intermediate_size": 352,  # ~8/3 * hidden, rounded to a multiple of 32 (SwiGLU)
    "max_position_embeddings": 512,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
}

# Training schedule: sized to take about 8 minutes on one core of the project machine.
SEQ_LEN = 512  # = max_position_embeddings: the served context is all trained
BATCH = 8
STEPS = 700
WARMUP = 60
LR = 3e-3
MIN_LR = 3e-4
WEIGHT_DECAY = 0.05
VAL_EVERY = 20  # every 20th document is validation
OUT_DIR = Path(__file__).resolve().parents[1] / "src" / "zeroserve" / "models" / "tinyllm"

# Stdlib folders that are tests, demos or vendored tools rather than library docs.
_SKIP_DIRS = {
    "test",
    "tests",
    "idle_test",
    "idlelib",
    "lib2to3",
    "turtledemo",
    "ensurepip",
    "site-packages",
    "dist-packages",
    "__pycache__",
    "pydoc_data",
    "tkinter",
    "venv",
}


# -- corpus ---------------------------------------------------------------------------
def _docstrings(path: Path, module: str) -> list[tuple[str, str]]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    out: list[tuple[str, str]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                if child.name.startswith("_") and not child.name.startswith("__"):
                    continue
                name = f"{prefix}.{child.name}"
                doc = ast.get_docstring(child)
                if doc and len(doc) >= 40:
                    out.append((name, doc))
                if isinstance(child, ast.ClassDef):
                    visit(child, name)

    doc = ast.get_docstring(tree)
    if doc and len(doc) >= 40:
        out.append((module, doc))
    visit(tree, module)
    return out


def build_corpus() -> list[str]:
    """Chat-formatted documents in a fixed order."""
    import pydoc_data.topics as topics

    pairs: list[tuple[str, str]] = [(k, topics.topics[k]) for k in sorted(topics.topics)]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.rglob("*.py")):
        rel = path.relative_to(stdlib)
        if any(part in _SKIP_DIRS for part in rel.parts[:-1]) or rel.name.startswith("test_"):
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if not parts or any(p.startswith("_") and p != "__main__" for p in parts):
            continue
        pairs.extend(_docstrings(path, ".".join(parts)))
    return [f"<|user|>\n{name}\n<|assistant|>\n{text.strip()}{EOS}" for name, text in pairs]


def train_tokenizer(docs: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=CONFIG["vocab_size"],
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer)
    return tok


# -- model ----------------------------------------------------------------------------
def rope_tables(head_dim: int, n: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    ang = np.outer(np.arange(n, dtype=np.float64), inv)
    ang = np.concatenate([ang, ang], axis=-1)
    return torch.tensor(np.cos(ang), dtype=torch.float32), torch.tensor(
        np.sin(ang), dtype=torch.float32
    )


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Block(nn.Module):
    def __init__(self, c: dict[str, object]) -> None:
        super().__init__()
        d, f, eps = int(c["hidden_size"]), int(c["intermediate_size"]), float(c["rms_norm_eps"])
        self.nh = int(c["num_heads"])
        self.attn_norm = RMSNorm(d, eps)
        self.wq = nn.Linear(d, d, bias=False)
        self.wk = nn.Linear(d, d, bias=False)
        self.wv = nn.Linear(d, d, bias=False)
        self.wo = nn.Linear(d, d, bias=False)
        self.mlp_norm = RMSNorm(d, eps)
        self.w_gate = nn.Linear(d, f, bias=False)
        self.w_up = nn.Linear(d, f, bias=False)
        self.w_down = nn.Linear(f, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.attn_norm(x)
        q = self.wq(h).view(b, t, self.nh, -1).transpose(1, 2)
        k = self.wk(h).view(b, t, self.nh, -1).transpose(1, 2)
        v = self.wv(h).view(b, t, self.nh, -1).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(a.transpose(1, 2).reshape(b, t, d))
        h = self.mlp_norm(x)
        return x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))


class TinyLlama(nn.Module):
    def __init__(self, c: dict[str, object]) -> None:
        super().__init__()
        d = int(c["hidden_size"])
        self.embed = nn.Embedding(int(c["vocab_size"]), d)
        self.layers = nn.ModuleList(Block(c) for _ in range(int(c["num_layers"])))
        self.norm = RMSNorm(d, float(c["rms_norm_eps"]))
        cos, sin = rope_tables(
            d // int(c["num_heads"]), int(c["max_position_embeddings"]), float(c["rope_theta"])
        )
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.apply(self._init)
        # Scale residual projections down with depth (GPT-2 style), for stable early steps.
        for layer in self.layers:
            for lin in (layer.wo, layer.w_down):
                nn.init.normal_(lin.weight, std=0.02 / math.sqrt(2 * len(self.layers)))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        x = self.embed(ids)
        cos, sin = self.cos[:t], self.sin[:t]
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x) @ self.embed.weight.T  # tied embeddings


def export(model: TinyLlama) -> dict[str, torch.Tensor]:
    """Tensor names the numpy runtime reads; linear weights stored as (in, out)."""
    out = {"embed": model.embed.weight, "norm": model.norm.weight}
    for i, layer in enumerate(model.layers):
        p = f"layers.{i}."
        out[p + "attn_norm"] = layer.attn_norm.weight
        out[p + "mlp_norm"] = layer.mlp_norm.weight
        out[p + "wqkv"] = torch.cat([layer.wq.weight, layer.wk.weight, layer.wv.weight]).T
        out[p + "wo"] = layer.wo.weight.T
        out[p + "w_gate_up"] = torch.cat([layer.w_gate.weight, layer.w_up.weight]).T
        out[p + "w_down"] = layer.w_down.weight.T
    return {k: v.detach().to(torch.float16).contiguous() for k, v in out.items()}


# -- training -------------------------------------------------------------------------
@torch.no_grad()
def evaluate(model: TinyLlama, val: torch.Tensor) -> float:
    """Mean cross-entropy in nats per token over the whole validation stream."""
    model.eval()
    total, count = 0.0, 0
    n = (len(val) - 1) // SEQ_LEN
    for i in range(0, n, BATCH):
        rows = [val[j * SEQ_LEN : (j + 1) * SEQ_LEN + 1] for j in range(i, min(n, i + BATCH))]
        xb = torch.stack(rows)
        logits = model(xb[:, :-1])
        loss = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), xb[:, 1:].reshape(-1), reduction="sum"
        )
        total += float(loss)
        count += xb[:, 1:].numel()
    model.train()
    return total / count


def lr_at(step: int, steps: int) -> float:
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    frac = (step - WARMUP) / max(1, steps - WARMUP)
    return MIN_LR + 0.5 * (LR - MIN_LR) * (1 + math.cos(math.pi * frac))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--out", type=Path, default=OUT_DIR)
    args = ap.parse_args()

    torch.set_num_threads(1)  # one core: the project machine is shared
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    t0 = time.monotonic()

    docs = build_corpus()
    corpus_sha = hashlib.sha256("".join(docs).encode()).hexdigest()
    train_docs = [d for i, d in enumerate(docs) if i % VAL_EVERY != VAL_EVERY - 1]
    val_docs = [d for i, d in enumerate(docs) if i % VAL_EVERY == VAL_EVERY - 1]
    print(
        f"corpus: {len(docs)} docs, {sum(map(len, docs)) / 1e6:.2f} M chars, "
        f"sha256 {corpus_sha[:16]}",
        flush=True,
    )

    tok = train_tokenizer(train_docs)
    eos = tok.token_to_id(EOS)

    def encode(ds: list[str]) -> torch.Tensor:
        ids: list[int] = []
        for enc in tok.encode_batch(ds):
            ids.extend(enc.ids)
        return torch.tensor(ids, dtype=torch.long)

    train_ids, val_ids = encode(train_docs), encode(val_docs)
    # Characters per validation token; a special token counts as one character, not as
    # its literal spelling, so the template does not flatter the bits/char figure.
    val_chars = sum(
        len(d) - sum(d.count(s) * (len(s) - 1) for s in SPECIAL_TOKENS) for d in val_docs
    )
    chars_per_token = val_chars / len(val_ids)
    print(
        f"tokens: train {len(train_ids)}, val {len(val_ids)}, "
        f"{chars_per_token:.2f} chars/token ({time.monotonic() - t0:.1f}s)",
        flush=True,
    )

    model = TinyLlama(CONFIG)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"parameters: {n_params}", flush=True)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": WEIGHT_DECAY},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=LR,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    gen = torch.Generator().manual_seed(SEED)
    t_train = time.monotonic()
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps)
        starts = torch.randint(0, len(train_ids) - SEQ_LEN - 1, (BATCH,), generator=gen)
        xb = torch.stack([train_ids[s : s + SEQ_LEN + 1] for s in starts.tolist()])
        logits = model(xb[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), xb[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == args.steps - 1:
            print(
                f"step {step:5d} loss {loss.item():.3f} ({time.monotonic() - t_train:.0f}s)",
                flush=True,
            )

    val_nats = evaluate(model, val_ids)
    bits_per_char = val_nats / math.log(2) / chars_per_token
    train_s = time.monotonic() - t_train
    print(
        f"validation: {val_nats:.3f} nats/token = {bits_per_char:.3f} bits/char "
        f"(training {train_s:.0f}s)",
        flush=True,
    )

    args.out.mkdir(parents=True, exist_ok=True)
    tensors = export(model)
    save_file(tensors, str(args.out / "weights.safetensors"), metadata={"format": "np"})
    tok.save(str(args.out / "tokenizer.json"))
    config = dict(CONFIG)
    config.update(
        {
            "model_type": "tinyllm",
            "eos_token": EOS,
            "eos_token_id": eos,
            "special_tokens": SPECIAL_TOKENS,
            "parameters": n_params,
            "training": {
                "corpus": "CPython pydoc_data.topics + stdlib docstrings (PSF-2.0)",
                "corpus_sha256": corpus_sha,
                "python": sys.version.split()[0],
                "torch": torch.__version__,
                "steps": args.steps,
                "batch": BATCH,
                "seq_len": SEQ_LEN,
                "seed": SEED,
                "train_tokens": len(train_ids),
                "val_nats_per_token": round(val_nats, 4),
                "val_bits_per_char": round(bits_per_char, 4),
            },
        }
    )
    (args.out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    size = os.path.getsize(args.out / "weights.safetensors")
    print(f"wrote {args.out} (weights {size / 1e6:.2f} MB)", flush=True)


if __name__ == "__main__":
    main()
