"""Tensor parallelism (Megatron-style) with ``parallelize_module`` on the ``tp`` mesh.

Per block: ``wq/wk/wv`` and ``w1/w3`` column-wise, ``wo`` and ``w2`` row-wise, so each
of attention and MLP needs one reduction. Attention reshapes with ``-1`` heads, so the
local shard holds ``n_heads / tp`` heads and no model code changes.

With ``sequence_parallel`` (default) the residual stream between TP regions is sharded
over the sequence: norms run on ``Shard(1)`` activations (``SequenceParallel``), the
inputs of attention and MLP are all-gathered (``PrepareModuleInput``) and the row-wise
outputs reduce-scattered back; without it the residual stream is replicated and the
norm weights are plain replicated DTensors. ``loss_parallel`` keeps the logits sharded
over the vocabulary; the loss is then computed under ``loss_parallel()``
(``Parallelized.loss_context``).

FP8 (torchao, tensorwise): the float8 variants of the styles are used so that the
all-gathers move float8 data.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)


def _is_float8_tensorwise(module: nn.Module) -> bool:
    from train.precision.fp8_torchao import uses_float8_tensorwise

    return uses_float8_tensorwise(module)


def _linear_style(module: nn.Module, kind: str, **kwargs):
    """torchao's float8 style for a tensorwise ``Float8Linear`` (its all-gathers move
    float8 data), torch's otherwise (layers the FP8 filter kept in high precision)."""
    if _is_float8_tensorwise(module):
        from torchao.float8.float8_tensor_parallel import (
            Float8ColwiseParallel,
            Float8RowwiseParallel,
        )

        return (Float8ColwiseParallel if kind == "col" else Float8RowwiseParallel)(**kwargs)
    return (ColwiseParallel if kind == "col" else RowwiseParallel)(**kwargs)


def _prepare_input(consumers: list[nn.Module], **kwargs):
    """All-gather a sub-module's input; in float8 when every consumer is float8."""
    if all(_is_float8_tensorwise(m) for m in consumers):
        from torchao.float8.float8_tensor_parallel import PrepareFloat8ModuleInput

        return PrepareFloat8ModuleInput(**kwargs)
    return PrepareModuleInput(**kwargs)


def apply_tp(model: nn.Module, tp_mesh, sequence_parallel: bool = True, loss_parallel: bool = False) -> None:
    """Parallelize ``model`` (a Transformer, possibly on the meta device) in place. That
    the TP degree divides heads and MLP is checked by :class:`~train.parallel.dims.ParallelDims`."""
    sp = sequence_parallel
    residual = Shard(1) if sp else Replicate()

    # Embedding, final norm, output projection. The output projection stays torch's
    # ColwiseParallel even with float8 (it is kept in high precision).
    root_plan = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=residual),
        "output": ColwiseParallel(
            input_layouts=residual,
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        ),
    }
    if sp:
        root_plan["norm"] = SequenceParallel()
    parallelize_module(model, tp_mesh, root_plan)

    for block in model.layers.values():
        attn, ffn = block.attention, block.feed_forward
        plan = {
            "attention": _prepare_input(
                [attn.wq, attn.wk, attn.wv], input_layouts=(residual, None), desired_input_layouts=(Replicate(), None)
            ),
            "attention.wq": _linear_style(attn.wq, "col"),
            "attention.wk": _linear_style(attn.wk, "col"),
            "attention.wv": _linear_style(attn.wv, "col"),
            "attention.wo": _linear_style(attn.wo, "row", output_layouts=residual),
            "feed_forward": _prepare_input(
                [ffn.w1, ffn.w3], input_layouts=(residual,), desired_input_layouts=(Replicate(),)
            ),
            "feed_forward.w1": _linear_style(ffn.w1, "col"),
            "feed_forward.w2": _linear_style(ffn.w2, "row", output_layouts=residual),
            "feed_forward.w3": _linear_style(ffn.w3, "col"),
        }
        if sp:
            plan["attention_norm"] = SequenceParallel()
            plan["ffn_norm"] = SequenceParallel()
        parallelize_module(block, tp_mesh, plan)

    if not sp:
        _replicate_norms(model, tp_mesh)
    # The embedding's output feeds the first (possibly compiled) block.
    model.tok_embeddings.register_forward_hook(_wait_async_output)


def _wait_async_output(module, inputs, output):
    """Resolve an ``AsyncCollectiveTensor`` (what ``to_local()`` returns after a
    redistribute) before it enters a compiled block: fed directly into a compiled region
    it lost its gradient (torch 2.13 CPU: the embedding got zero grad under TP +
    compile). The clone waits for the collective and keeps the autograd link."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    return output.clone() if isinstance(output, AsyncCollectiveTensor) else output


def _replicate_norms(model: nn.Module, tp_mesh) -> None:
    """Without sequence parallelism the norms see full (replicated) activations. Their
    weights become ``Replicate()`` DTensors anyway, with plain-tensor inputs/outputs,
    so that every parameter lives on the TP mesh (one mesh for FSDP and for the global
    gradient norm)."""
    from torch.distributed.tensor import distribute_module

    def to_local_output(mod, outputs, device_mesh):
        return outputs.to_local() if hasattr(outputs, "to_local") else outputs

    def to_replicate_input(mod, inputs, device_mesh):
        from torch.distributed.tensor import DTensor

        return tuple(
            DTensor.from_local(x, device_mesh, [Replicate()], run_check=False) if not isinstance(x, DTensor) else x
            for x in inputs
        )

    norms = [model.norm] + [m for block in model.layers.values() for m in (block.attention_norm, block.ffn_norm)]
    for norm in norms:
        distribute_module(norm, tp_mesh, input_fn=to_replicate_input, output_fn=to_local_output)
