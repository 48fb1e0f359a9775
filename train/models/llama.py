"""A Llama-style decoder: RMSNorm, rotary position embeddings, SwiGLU MLP and
grouped-query attention through ``scaled_dot_product_attention``.

This file knows nothing about parallelism or precision. Tensor-parallel plans,
FSDP, activation checkpointing, torch.compile and FP8 conversion are applied from
outside (``train.parallel``, ``train.precision``); attention reshapes with ``-1``
heads so that a column-sharded projection works unchanged.

The model can be built on the meta device and materialised later with
``model.to_empty(device=...)`` followed by ``model.init_weights(seed)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from train.models.presets import ModelConfig
from train.models.shapes import flops_per_token  # noqa: F401 - the trainer's FLOP count, from the config
from train.models.weights import filler, full_device


def rope_cache(head_dim: int, max_seq_len: int, theta: float, device=None) -> torch.Tensor:
    """(max_seq_len, head_dim) tensor holding cos in the first half and sin in the second."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    t = torch.arange(max_seq_len, device=device, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


def apply_rope(x: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    """x: (batch, seq, heads, head_dim); rotates pairs (i, i + head_dim/2)."""
    seq = x.shape[1]
    half = x.shape[-1] // 2
    cos, sin = cache[:seq, :half], cache[:seq, half:]
    cos = cos[None, :, None, :]
    sin = sin[None, :, None, :]
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    out = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return out.type_as(x)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


class Attention(nn.Module):
    # Grouped-query attention: False copies each KV head for its query heads
    # (repeat_interleave) before SDPA; True lets SDPA share them (enable_gqa=True, no
    # copies saved for backward). Same math; set from outside (train/parallel/attention.py).
    native_gqa = True

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.head_dim = cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * self.head_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        bsz, seq, _ = x.shape
        q = self.wq(x).view(bsz, seq, -1, self.head_dim)
        k = self.wk(x).view(bsz, seq, -1, self.head_dim)
        v = self.wv(x).view(bsz, seq, -1, self.head_dim)
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (b, heads, seq, hd)
        rep = q.shape[1] // k.shape[1]
        if rep > 1 and self.native_gqa:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            if rep > 1:  # grouped-query attention: share each KV head across `rep` query heads
                k = k.repeat_interleave(rep, dim=1)
                v = v.repeat_interleave(rep, dim=1)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out = out.transpose(1, 2).reshape(bsz, seq, -1)
        return self.wo(out)


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg.dim, cfg.hidden_dim)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), rope)
        return x + self.feed_forward(self.ffn_norm(x))


class Output(nn.Linear):
    """The output projection. With a loss head installed (``head``, set from outside by
    ``train.loss``), ``forward(h, targets)`` returns ``head(h, weight, targets)`` (the loss,
    the projection fused into it) instead of logits. Either way it is called as a module,
    so whatever is hooked on this module's forward sees its weight used."""

    head = None

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        if targets is None:
            return super().forward(x)
        if self.head is None:
            raise RuntimeError("Transformer.forward(tokens, targets) needs a loss_head")
        return self.head(x, self.weight, targets)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        # ModuleDict keyed by str(index): FQNs stay stable when blocks are wrapped.
        self.layers = nn.ModuleDict({str(i): TransformerBlock(cfg) for i in range(cfg.n_layers)})
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = Output(cfg.dim, cfg.vocab_size, bias=False)
        self.register_buffer(
            "rope", rope_cache(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta), persistent=False
        )

    @property
    def loss_head(self):
        """Set from outside (``train.loss``): called as ``loss_head(h, output.weight, targets)``
        by ``forward(tokens, targets)``, through the output module (:class:`Output`)."""
        return self.output.head if self.output is not None else None

    @loss_head.setter
    def loss_head(self, head) -> None:
        if self.output is None:
            raise RuntimeError("loss_head: this model has no output layer")
        self.output.head = head

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits; with ``targets`` (and a ``loss_head`` installed) the loss instead."""
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h, self.rope)
        h = self.norm(h) if self.norm is not None else h
        if targets is not None:
            if self.output is None:
                raise RuntimeError("Transformer.forward(tokens, targets) needs a loss_head and the output layer")
            return self.output(h, targets)
        return self.output(h) if self.output is not None else h

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Deterministic initialisation from ``seed`` (same on every rank and device).

        Embedding ~ N(0, 1); projections ~ truncated N(0, 0.02); output projections of
        each block (wo, w2) scaled by 1/sqrt(2 * n_layers) as in GPT-2/Llama.
        """
        device = full_device(self.tok_embeddings.weight)
        if device.type == "meta":
            raise RuntimeError("materialise the model (to_empty) before init_weights")
        self.rope = rope_cache(self.cfg.head_dim, self.cfg.max_seq_len, self.cfg.rope_theta, device=device)
        # One generator on the parameters' device type: identical on every rank, and fast
        # on GPUs for large models (each full tensor is drawn, then sharded if needed).
        fill = filler(device, seed)
        depth_std = 0.02 / math.sqrt(2 * self.cfg.n_layers)

        fill(self.tok_embeddings.weight, 1.0, trunc=False)
        for layer in self.layers.values():
            for lin in (layer.attention.wq, layer.attention.wk, layer.attention.wv, layer.feed_forward.w1,
                        layer.feed_forward.w3):
                fill(lin.weight, 0.02)
            fill(layer.attention.wo.weight, depth_std)
            fill(layer.feed_forward.w2.weight, depth_std)
            layer.attention_norm.reset_parameters()
            layer.ffn_norm.reset_parameters()
        self.norm.reset_parameters()
        fill(self.output.weight, self.cfg.dim ** -0.5)


def count_params(model: nn.Module, exclude_embedding: bool = False) -> int:
    total = sum(p.numel() for p in model.parameters())
    if exclude_embedding and getattr(model, "tok_embeddings", None) is not None:
        total -= model.tok_embeddings.weight.numel()
    return total
