"""A user's own model, given to ``train run`` by import path (``model.builder=usermodels:build``,
with tests/ on the Python path): not a registered family, no spec of its own. Its blocks are in
``layers`` (activation checkpointing, compile and FSDP2 units find them there) and it has no
``init_weights``, so the trainer initialises it with each module's ``reset_parameters()``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MixerBlock(nn.Module):
    """Pre-norm residual block: a causal token mix (a learned lower-triangular matrix over the
    sequence) and a GELU MLP."""

    def __init__(self, dim: int, seq: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mix = nn.Parameter(torch.zeros(seq, seq))
        self.up = nn.Linear(dim, 2 * dim)
        self.down = nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.shape[1]
        weights = self.mix[:s, :s].masked_fill(torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1),
                                               float("-inf")).softmax(-1)
        x = x + weights @ self.norm(x)
        return x + self.down(F.gelu(self.up(x)))

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.mix)


class TinyLM(nn.Module):
    def __init__(self, vocab: int, dim: int, n_layers: int, seq: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(MixerBlock(dim, seq) for _ in range(n_layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.layers:
            x = block(x)
        return self.head(self.norm(x))


def build(cfg) -> nn.Module:
    """``model.builder=usermodels:build``: the shapes from the job's ``model`` section."""
    return TinyLM(cfg.vocab_size, cfg.dim, cfg.n_layers, cfg.max_seq_len)


def not_a_module(cfg):
    return {"dim": cfg.dim}


NOT_CALLABLE = 3
