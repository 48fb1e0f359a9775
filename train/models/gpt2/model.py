"""A GPT-2-style decoder: LayerNorm, a GELU MLP, learned position embeddings, biases, and the
output projection tied to the token embedding.

Like ``train.models.llama`` this file knows nothing of parallelism or precision; its spec
(``train.models.gpt2.spec``) tells the trainer which modules are the blocks and how tensor
parallelism shards them. The tied output head holds no weight of its own: it is called as
``lm_head(h, wte.weight)``, so the one parameter lives in the embedding (one FSDP2 unit, one
tensor-parallel placement) and the head only sees it as an input.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from train.models.presets import ModelConfig
from train.models.weights import filler, full_device


class Embeddings(nn.Module):
    """Token plus learned position embeddings."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.wpe = nn.Embedding(cfg.max_seq_len, cfg.dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.wte(tokens) + self.wpe(positions)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.head_dim = cfg.head_dim
        self.q_proj = nn.Linear(cfg.dim, cfg.n_heads * self.head_dim)
        self.k_proj = nn.Linear(cfg.dim, cfg.kv_heads * self.head_dim)
        self.v_proj = nn.Linear(cfg.dim, cfg.kv_heads * self.head_dim)
        self.out_proj = nn.Linear(cfg.n_heads * self.head_dim, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bsz, seq, _ = x.shape
        # -1 heads: a column-sharded projection holds n_heads / tp of them
        q, k, v = (proj(x).view(bsz, seq, -1, self.head_dim).transpose(1, 2)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        rep = q.shape[1] // k.shape[1]
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out_proj(out.transpose(1, 2).reshape(bsz, seq, -1))


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc = nn.Linear(dim, hidden)
        self.proj = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.mlp = MLP(cfg.dim, cfg.hidden_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class TiedHead(nn.Module):
    """The output projection with the token embedding's weight, passed in. With a loss head
    installed (``head``, set from outside by ``train.loss``), ``forward(h, weight, targets)``
    returns ``head(h, weight, targets)`` (the loss) instead of logits."""

    head = None

    def forward(self, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        if targets is None:
            return F.linear(h, weight)
        if self.head is None:
            raise RuntimeError("GPT2.forward(tokens, targets) needs a loss_head")
        return self.head(h, weight, targets)


class GPT2(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = Embeddings(cfg)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.lm_head = TiedHead()

    @property
    def loss_head(self):
        return self.lm_head.head

    @loss_head.setter
    def loss_head(self, head) -> None:
        self.lm_head.head = head

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits; with ``targets`` (and a ``loss_head`` installed) the loss instead."""
        x = self.embed(tokens)
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        if targets is None:
            return self.lm_head(x, self.embed.wte.weight)
        return self.lm_head(x, self.embed.wte.weight, targets)

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Deterministic initialisation from ``seed`` (the same on every rank and mesh): GPT-2's
        N(0, 0.02) weights, N(0, 0.01) positions, each block's output projections scaled by
        1/sqrt(2 * n_layers), zero biases, unit LayerNorms."""
        device = full_device(self.embed.wte.weight)
        if device.type == "meta":
            raise RuntimeError("materialise the model (to_empty) before init_weights")
        fill = filler(device, seed)
        depth_std = 0.02 / math.sqrt(2 * self.cfg.n_layers)
        fill(self.embed.wte.weight, 0.02, trunc=False)
        fill(self.embed.wpe.weight, 0.01, trunc=False)
        for block in self.h:
            for lin, std in ((block.attn.q_proj, 0.02), (block.attn.k_proj, 0.02), (block.attn.v_proj, 0.02),
                             (block.attn.out_proj, depth_std), (block.mlp.fc, 0.02), (block.mlp.proj, depth_std)):
                fill(lin.weight, std)
                lin.bias.zero_()
            for norm in (block.ln_1, block.ln_2):
                norm.reset_parameters()
        self.ln_f.reset_parameters()
