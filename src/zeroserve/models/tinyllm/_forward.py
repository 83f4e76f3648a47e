"""The tinyllm forward pass in numpy: a Llama-style decoder with a per-request KV cache.

It mirrors ``tools/train_tinyllm.py`` exactly: pre-norm blocks with RMSNorm, rotary
position embeddings in the "rotate half" convention, causal multi-head attention, a
SwiGLU MLP, a final RMSNorm and an output projection tied to the token embeddings.

Invariants: ``Weights`` is read-only after construction and shared by every request;
all mutable state of one generation lives in its ``KVCache``, so any number of threads
may run forward passes at once. Everything is float32 and C-contiguous; the fused
``wqkv`` / ``w_gate_up`` matrices are stored (in, out) so each projection is a single
``x @ W``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

F32 = np.float32


@dataclass(frozen=True)
class Layer:
    """One block's matrices, (in, out); the RMSNorm gains are folded into them."""

    wqkv: np.ndarray
    wo: np.ndarray
    w_gate_up: np.ndarray
    w_down: np.ndarray


@dataclass(frozen=True)
class Weights:
    """Model weights (float32) plus the precomputed RoPE tables."""

    embed: np.ndarray  # (vocab, d)
    embed_t: np.ndarray  # (d, vocab): tied output projection, final norm gain folded in
    layers: tuple[Layer, ...]
    num_heads: int
    head_dim: int
    eps: float
    cos: np.ndarray  # (max_positions, head_dim)
    sin_signed: np.ndarray  # sin with the rotate-half sign folded in: (-sin | +sin)
    max_positions: int

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, np.ndarray], config: Mapping[str, Any]) -> Weights:
        def f32(name: str) -> np.ndarray:
            return np.ascontiguousarray(tensors[name], dtype=F32)

        d = int(config["hidden_size"])
        heads = int(config["num_heads"])
        head_dim = d // heads
        n_pos = int(config["max_position_embeddings"])
        inv = 1.0 / (float(config["rope_theta"]) ** (np.arange(0, head_dim, 2) / head_dim))
        ang = np.outer(np.arange(n_pos, dtype=np.float64), inv)
        ang = np.concatenate([ang, ang], axis=-1)
        sin = np.sin(ang)
        half = head_dim // 2
        sin[:, :half] *= -1.0
        embed = f32("embed")
        # Fold constants into the matrices once, saving numpy calls per decode step:
        # RMSNorm's gain into the projection that follows it ((x*r*g) @ W = (x*r) @ (g W)),
        # and attention's 1/sqrt(head_dim) into the query columns (RoPE is linear).
        scale = np.ones(3 * d, dtype=F32)
        scale[:d] = 1.0 / np.sqrt(head_dim)

        def folded(norm: str, weight: str, cols: np.ndarray | None = None) -> np.ndarray:
            w = tensors[norm].astype(F32)[:, None] * tensors[weight].astype(F32)
            if cols is not None:
                w = w * cols
            return np.ascontiguousarray(w, dtype=F32)

        layers = tuple(
            Layer(
                wqkv=folded(f"layers.{i}.attn_norm", f"layers.{i}.wqkv", scale),
                wo=f32(f"layers.{i}.wo"),
                w_gate_up=folded(f"layers.{i}.mlp_norm", f"layers.{i}.w_gate_up"),
                w_down=f32(f"layers.{i}.w_down"),
            )
            for i in range(int(config["num_layers"]))
        )
        return cls(
            embed=embed,
            embed_t=np.ascontiguousarray(
                tensors["norm"].astype(F32)[:, None] * embed.T,
                dtype=F32,
            ),
            layers=layers,
            num_heads=heads,
            head_dim=head_dim,
            eps=float(config["rms_norm_eps"]),
            cos=np.cos(ang).astype(F32),
            sin_signed=sin.astype(F32),
            max_positions=n_pos,
        )


class KVCache:
    """Keys and values of one generation: per layer, ``(heads, capacity, head_dim)``."""

    __slots__ = ("capacity", "k", "length", "v")

    def __init__(self, w: Weights, capacity: int) -> None:
        shape = (w.num_heads, capacity, w.head_dim)
        self.k = [np.empty(shape, dtype=F32) for _ in w.layers]
        self.v = [np.empty(shape, dtype=F32) for _ in w.layers]
        self.capacity = capacity
        self.length = 0


def _rms_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm without its gain (folded into the next matrix)."""
    ms = np.mean(x * x, axis=-1, keepdims=True)
    ms += eps
    out: np.ndarray = x / np.sqrt(ms)
    return out


def forward(w: Weights, ids: np.ndarray, cache: KVCache) -> np.ndarray:
    """Run ``ids`` (positions ``cache.length ..``) through the model and extend ``cache``.

    Returns the logits (float32, ``(vocab,)``) for the last position only: generation
    never needs the others.
    """
    t = len(ids)
    start = cache.length
    end = start + t
    if end > cache.capacity:
        raise ValueError(f"KV cache full: {end} positions > capacity {cache.capacity}")
    heads, hd = w.num_heads, w.head_dim
    d = heads * hd
    half = hd // 2
    cos = w.cos[start:end, None, :]  # (t, 1, hd): broadcast over the q and k heads
    sin = w.sin_signed[start:end, None, :]
    mask = None
    if t > 1:  # causal mask for the new queries against every cached key
        mask = np.triu(np.full((t, end), -np.inf, dtype=F32), k=start + 1)
    x = w.embed[ids]  # (t, d), a fresh array (fancy indexing copies)
    for i, layer in enumerate(w.layers):
        h = _rms_norm(x, w.eps)
        qkv = h @ layer.wqkv  # (t, 3d)
        qk = qkv[:, : 2 * d].reshape(t, 2 * heads, hd)
        # RoPE: x*cos + rotate_half(x)*sin, with rotate_half's sign folded into ``sin``.
        rot = np.concatenate([qk[..., half:], qk[..., :half]], axis=-1)
        qk = qk * cos + rot * sin
        q = qk[:, :heads].transpose(1, 0, 2)  # (heads, t, hd)
        k_cache, v_cache = cache.k[i], cache.v[i]
        k_cache[:, start:end] = qk[:, heads:].transpose(1, 0, 2)
        v_cache[:, start:end] = qkv[:, 2 * d :].reshape(t, heads, hd).transpose(1, 0, 2)
        scores = q @ k_cache[:, :end].transpose(0, 2, 1)  # (heads, t, end)
        if mask is not None:
            scores += mask
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        att = scores @ v_cache[:, :end]  # (heads, t, hd)
        x += att.transpose(1, 0, 2).reshape(t, d) @ layer.wo
        h = _rms_norm(x, w.eps)
        gu = h @ layer.w_gate_up
        f = gu.shape[1] // 2
        gate = gu[:, :f]
        # SiLU(gate) * up. sigmoid(g) = (1 + tanh(g/2)) / 2 never overflows, unlike exp.
        act = np.tanh(gate * F32(0.5))
        act += F32(1.0)
        act *= gate
        act *= F32(0.5)
        act *= gu[:, f:]
        x += act @ layer.w_down
    cache.length = end
    last = _rms_norm(x[-1], w.eps)
    out: np.ndarray = last @ w.embed_t
    return out
