"""Parameter names and shapes of the Llama model (``train.models.llama.Transformer``), from its
config alone: no torch, nothing built. The trainer and preflight count parameters with it; the
memory model (``train.memory``) sizes weights, gradients and optimizer state with it.
"""

from __future__ import annotations

import math

from train.models.presets import ModelConfig


def block_shapes(cfg: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
    """``(name within the block, shape)`` of one transformer block's parameters."""
    d, hd, f = cfg.dim, cfg.head_dim, cfg.hidden_dim
    q, kv = cfg.n_heads * hd, cfg.kv_heads * hd
    return [
        ("attention_norm.weight", (d,)),
        ("attention.wq.weight", (q, d)),
        ("attention.wk.weight", (kv, d)),
        ("attention.wv.weight", (kv, d)),
        ("attention.wo.weight", (d, q)),
        ("ffn_norm.weight", (d,)),
        ("feed_forward.w1.weight", (f, d)),
        ("feed_forward.w3.weight", (f, d)),
        ("feed_forward.w2.weight", (d, f)),
    ]


def outer_shapes(cfg: ModelConfig) -> tuple[list, list]:
    """The parameters before the blocks and after them."""
    d, v = cfg.dim, cfg.vocab_size
    return [("tok_embeddings.weight", (v, d))], [("norm.weight", (d,)), ("output.weight", (v, d))]


def param_shapes(cfg: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
    """``(name, shape)`` of every parameter of ``train.models.llama.Transformer``, in
    ``named_parameters()`` order."""
    block = block_shapes(cfg)
    before, after = outer_shapes(cfg)
    layers = [(f"layers.{i}.{name}", shape) for i in range(cfg.n_layers) for name, shape in block]
    return [*before, *layers, *after]


def param_count(cfg: ModelConfig) -> int:
    """``sum`` of :func:`param_shapes`' sizes without listing the blocks (any ``n_layers``)."""
    before, after = outer_shapes(cfg)
    outer = sum(math.prod(s) for _, s in before + after)
    return outer + cfg.n_layers * sum(math.prod(s) for _, s in block_shapes(cfg))


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token: 6 * N + 12 * L * dim * seq_len.

    N is the parameter count without the token embedding (a lookup, not a matmul);
    6N counts forward (2N) and backward (4N) matmul FLOPs; 12 * L * dim * seq is the
    attention score and value matmuls (QK^T and AV, forward + backward), the same
    formula torchtitan and the PaLM paper use. Causal masking is not discounted.
    """
    d, h, kv = cfg.dim, cfg.hidden_dim, cfg.kv_heads * cfg.head_dim
    per_layer = d * d * 2 + d * kv * 2 + 3 * d * h + 2 * d  # wq, wo, wk, wv, MLP, norms
    n = cfg.n_layers * per_layer + d + d * cfg.vocab_size  # final norm + output projection
    return 6.0 * n + 12.0 * cfg.n_layers * d * seq_len
