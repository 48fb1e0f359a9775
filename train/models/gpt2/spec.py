"""The GPT-2 family's :class:`~train.models.spec.ModelSpec`: presets, parameter shapes, the
tensor-parallel plan and the memory traits of ``train.models.gpt2.model.GPT2`` (no torch here).

FSDP2 shards every block as a unit of its own; the embedding and the tied head stay in the
root, since they share the one weight. Under tensor parallelism the token embedding is
sharded over the vocabulary and the tied head computes vocabulary-sharded logits from the
same shard; the position embedding is replicated and the sum of both becomes the
(sequence-sharded) residual stream.
"""

from __future__ import annotations

from train.errors import ConfigError
from train.models.presets import ModelConfig
from train.models.spec import MemoryTraits, ModelSpec, TPPlan


def build(cfg: ModelConfig):
    from train.models.gpt2.model import GPT2

    return GPT2(cfg)


def validate(cfg: ModelConfig) -> None:
    if not cfg.ffn_hidden:
        raise ConfigError(f"model.ffn_hidden: the gpt2 family needs the MLP width set (GPT-2: 4 * model.dim = "
                          f"{4 * cfg.dim})")


def _preset(name: str, dim: int, n_layers: int, n_heads: int, vocab_size: int, max_seq_len: int) -> ModelConfig:
    return ModelConfig(name=name, family="gpt2", dim=dim, n_layers=n_layers, n_heads=n_heads, vocab_size=vocab_size,
                       ffn_hidden=4 * dim, max_seq_len=max_seq_len, norm_eps=1e-5)


# gpt2-124m is GPT-2 small (dim 768, 12 layers, 12 heads, vocabulary 50257, 1024 positions).
PRESETS = {
    "gpt2-tiny": _preset("gpt2-tiny", 128, 4, 4, 256, 256),
    "gpt2-124m": _preset("gpt2-124m", 768, 12, 12, 50257, 1024),
    "gpt2-350m": _preset("gpt2-350m", 1024, 24, 16, 50257, 1024),
}


def block_shapes(cfg: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
    d, f = cfg.dim, cfg.hidden_dim
    q, kv = cfg.n_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    out = [("ln_1.weight", (d,)), ("ln_1.bias", (d,))]
    for name, rows, cols in (("attn.q_proj", q, d), ("attn.k_proj", kv, d), ("attn.v_proj", kv, d),
                             ("attn.out_proj", d, q)):
        out += [(f"{name}.weight", (rows, cols)), (f"{name}.bias", (rows,))]
    out += [("ln_2.weight", (d,)), ("ln_2.bias", (d,)),
            ("mlp.fc.weight", (f, d)), ("mlp.fc.bias", (f,)), ("mlp.proj.weight", (d, f)), ("mlp.proj.bias", (d,))]
    return out


def param_shapes(cfg: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
    """``(name, shape)`` of every parameter of ``GPT2``, in ``named_parameters()`` order (the
    head is tied: no parameter of its own)."""
    d = cfg.dim
    layers = [(f"h.{i}.{name}", shape) for i in range(cfg.n_layers) for name, shape in block_shapes(cfg)]
    return [("embed.wte.weight", (cfg.vocab_size, d)), ("embed.wpe.weight", (cfg.max_seq_len, d)), *layers,
            ("ln_f.weight", (d,)), ("ln_f.bias", (d,))]


def _block_params(cfg: ModelConfig) -> int:
    total = 0
    for _, shape in block_shapes(cfg):
        n = 1
        for s in shape:
            n *= s
        total += n
    return total


def param_count(cfg: ModelConfig) -> int:
    """The sum of :func:`param_shapes`' sizes without listing the blocks (any ``n_layers``)."""
    return cfg.vocab_size * cfg.dim + cfg.max_seq_len * cfg.dim + cfg.n_layers * _block_params(cfg) + 2 * cfg.dim


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """6 N + 12 L d s as for Llama: N counts the blocks, the final norm and the (tied) output
    projection's matmul, not the embedding lookups."""
    n = cfg.n_layers * _block_params(cfg) + 2 * cfg.dim + cfg.vocab_size * cfg.dim
    return 6.0 * n + 12.0 * cfg.n_layers * cfg.dim * seq_len


TP = TPPlan(
    root={"embed.wte": "embedding_full", "embed.wpe": "replicate", "embed": "to_residual",
          "ln_f": "norm", "lm_head": "tied_output"},
    block={
        "attn": "gather_input",
        "attn.q_proj": "colwise", "attn.k_proj": "colwise", "attn.v_proj": "colwise",
        "attn.out_proj": "rowwise",
        "mlp": "gather_input",
        "mlp.fc": "colwise", "mlp.proj": "rowwise",
        "ln_1": "norm", "ln_2": "norm",
    },
)

SPEC = ModelSpec(
    family="gpt2",
    build=build,
    presets=PRESETS,
    blocks="h",
    embedding=None,  # tied to the head: both in the root unit
    output=None,
    loss_head=True,
    tp=TP,
    param_shapes=param_shapes,
    count_params=param_count,
    memory=MemoryTraits(
        embedding="embed.wte.weight", norm="ln_f.weight", output=None,
        rowwise=("attn.out_proj.weight", "mlp.proj.weight"), linear=("attn.", "mlp."),
        norm_stats=2, attn_inputs=3, mlp_inputs=1, mlp_saved=2, rope=False,
    ),
    flops_per_token=flops_per_token,
    validate=validate,
)
