"""What a model family tells the rest of the trainer: one :class:`ModelSpec`.

The trainer, ``train.parallel``, ``train.precision`` and ``train doctor`` ask the spec for the
model's parts (its blocks, the modules FSDP2 shards as units of their own, the output
projection, the tensor-parallel plan, the parameter shapes) instead of naming modules of one
model. A family registers its spec in ``train.models.registry``; a user's model given by
``model.builder=pkg.mod:fn`` gets a spec made from the function alone (:func:`user_spec` there).

Nothing here imports torch: ``train doctor`` reads presets, shapes and memory traits without it.
The tensor-parallel plan is declarative (module name -> style name); ``train.parallel.tp``
turns the style names into torch's parallel styles.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from train.models.presets import ModelConfig

# Tensor-parallel style names a plan may use (``train.parallel.tp`` applies them):
TP_STYLES = {
    # root modules (names from the model's root)
    "embedding": "nn.Embedding sharded over the vocabulary; its output is the residual stream",
    "embedding_full": "nn.Embedding sharded over the vocabulary; its output replicated (more is added to it)",
    "to_residual": "a module whose replicated output becomes the residual stream",
    "output": "nn.Linear output projection sharded over the vocabulary (logits vocabulary-sharded or gathered)",
    "tied_output": "a head called as head(h, weight): the weight is the vocabulary-sharded embedding's",
    # root or block modules
    "norm": "a norm over the residual stream (sequence parallel, or replicated without it)",
    "replicate": "parameters replicated over the TP ranks, plain tensors in and out",
    # block modules (names within a block)
    "gather_input": "a sub-module whose first input (the residual stream) is gathered for its column-wise linears",
    "colwise": "nn.Linear sharded by output features (heads, MLP hidden)",
    "rowwise": "nn.Linear sharded by input features; its output is the residual stream",
}


@dataclass(frozen=True)
class TPPlan:
    """Module name -> style name (:data:`TP_STYLES`): ``root`` from the model's root, applied in
    order; ``block`` within each block. Column-wise layers must see whole heads (attention
    reshapes with ``-1`` heads) and a row-wise layer must follow its column-wise ones."""

    root: Mapping[str, str]
    block: Mapping[str, str]

    def __post_init__(self) -> None:
        for name, style in [*self.root.items(), *self.block.items()]:
            if style not in TP_STYLES:
                raise ValueError(f"tensor-parallel plan: {name}: unknown style {style!r}")


@dataclass(frozen=True)
class MemoryTraits:
    """What ``train doctor``'s memory model needs beyond the parameter shapes: the parameter names
    of the embedding, final norm and output projection (None: tied to the embedding), which
    block weights are sharded row-wise by TP, and what one block saves for backward per token
    (in units of the norm input, the model dim and the MLP hidden size)."""

    embedding: str
    norm: str
    output: str | None
    rowwise: tuple[str, ...]  # parameter name suffixes sharded along dim 1 by TP
    linear: tuple[str, ...]  # parameter name parts that mark a linear layer's weight
    norm_stats: int = 1  # fp32 statistics per token a norm saves (RMSNorm: rstd; LayerNorm: mean and rstd)
    attn_inputs: int = 3  # linears reading the attention norm's output (q, k, v)
    mlp_inputs: int = 2  # linears reading the MLP norm's output
    mlp_saved: int = 4  # tensors of the MLP's hidden width saved (SwiGLU: w1 out, w3 out, silu, product)
    rope: bool = True  # a fp32 (seq, head_dim) rotary table


@dataclass(frozen=True)
class ModelSpec:
    """One model family (or a user's model).

    ``build(cfg)`` makes the model on the current device (the trainer builds on ``meta``);
    ``init(model, seed)`` fills the materialised weights, the same on every rank and mesh.
    ``blocks`` is the attribute holding the repeated blocks (``nn.ModuleDict`` or
    ``nn.ModuleList``): activation checkpointing, per-block compile and FSDP2 units are per
    block. ``embedding`` / ``output``: modules FSDP2 shards as units of their own (None: they
    stay in the root, e.g. with tied weights). ``high_precision``: linears FP8 leaves alone.
    ``loss_head``: the model takes ``forward(tokens, targets)`` with a ``loss_head`` set
    (``train.loss=chunked``)."""

    family: str
    build: Callable[[ModelConfig], Any]
    presets: Mapping[str, ModelConfig] = field(default_factory=dict)
    init: Callable[[Any, int], None] | None = None  # None: model.init_weights(seed)
    blocks: str = "layers"
    embedding: str | None = None
    output: str | None = None
    high_precision: tuple[str, ...] = ()
    loss_head: bool = False
    # model.max_seq_len sizes only buffers (a RoPE table): the trainer builds for train.seq_len
    seq_len_sized: bool = False
    tp: TPPlan | None = None
    param_shapes: Callable[[ModelConfig], list] | None = None  # [(name, shape)] in named_parameters order
    # the sum of param_shapes' sizes without listing the blocks (any n_layers, at once)
    count_params: Callable[[ModelConfig], int] | None = None
    memory: MemoryTraits | None = None
    flops_per_token: Callable[[ModelConfig, int], float] | None = None
    validate: Callable[[ModelConfig], None] | None = None  # family rules beyond ModelConfig.validate
    source: str = ""  # where it comes from (a user's builder path), for messages

    def init_weights(self, model, seed: int) -> None:
        if self.init is not None:
            self.init(model, seed)
        else:
            model.init_weights(seed)

    def block_container(self, model):
        return getattr(model, self.blocks, None)

    def block_items(self, model) -> list[tuple[Any, Any]]:
        """``(key, block)`` of every block: ``str`` keys of a ModuleDict, indices of a ModuleList,
        nothing when the model has no such attribute."""
        container = self.block_container(model)
        if container is None:
            return []
        if hasattr(container, "items"):
            return list(container.items())
        return list(enumerate(container))

    def set_block(self, model, key, block) -> None:
        """Replace one block (activation checkpointing wraps it)."""
        self.block_container(model)[key] = block

    def param_count(self, cfg: ModelConfig) -> int | None:
        """Parameters from the config alone (None: this model does not say without being built)."""
        if self.count_params is not None:
            return self.count_params(cfg)
        if self.param_shapes is None:
            return None
        total = 0
        for _, shape in self.param_shapes(cfg):
            n = 1
            for s in shape:
                n *= s
            total += n
        return total
