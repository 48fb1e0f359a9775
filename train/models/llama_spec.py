"""The Llama family's :class:`~train.models.spec.ModelSpec`: presets, parameter shapes, the
tensor-parallel plan, FSDP2 units and the memory traits of ``train.models.llama.Transformer``."""

from __future__ import annotations

from train.errors import ConfigError
from train.models.presets import MODEL_PRESETS, ModelConfig
from train.models.shapes import flops_per_token, param_count, param_shapes
from train.models.spec import MemoryTraits, ModelSpec, TPPlan


def build(cfg: ModelConfig):
    from train.models.llama import Transformer

    return Transformer(cfg)


def validate(cfg: ModelConfig) -> None:
    if cfg.head_dim % 2:
        raise ConfigError(f"model.dim/n_heads: head dim {cfg.head_dim} must be even for RoPE")


# Per block: wq/wk/wv and w1/w3 column-wise, wo and w2 row-wise: one reduction each for
# attention and MLP; the inputs of both are gathered from the (sequence-sharded) stream.
TP = TPPlan(
    root={"tok_embeddings": "embedding", "output": "output", "norm": "norm"},
    block={
        "attention": "gather_input",
        "attention.wq": "colwise", "attention.wk": "colwise", "attention.wv": "colwise",
        "attention.wo": "rowwise",
        "feed_forward": "gather_input",
        "feed_forward.w1": "colwise", "feed_forward.w3": "colwise",
        "feed_forward.w2": "rowwise",
        "attention_norm": "norm", "ffn_norm": "norm",
    },
)

SPEC = ModelSpec(
    family="llama",
    build=build,
    presets=MODEL_PRESETS,
    blocks="layers",
    embedding="tok_embeddings",
    output="output",
    high_precision=("output",),  # large vocabulary logits: kept out of FP8
    loss_head=True,
    seq_len_sized=True,  # the RoPE table: only the positions used
    tp=TP,
    param_shapes=param_shapes,
    count_params=param_count,
    memory=MemoryTraits(
        embedding="tok_embeddings.weight", norm="norm.weight", output="output.weight",
        rowwise=("attention.wo.weight", "feed_forward.w2.weight"), linear=("attention.w", "feed_forward.w"),
    ),
    flops_per_token=flops_per_token,
    validate=validate,
)
