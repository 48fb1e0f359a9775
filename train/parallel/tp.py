"""Tensor parallelism (Megatron-style) with ``parallelize_module`` on the ``tp`` mesh, from the
model's declarative plan (``ModelSpec.tp``, style names in ``train.models.spec.TP_STYLES``).

In a block the column-wise linears (attention's q/k/v, the MLP's up projections) are
sharded by output features and the row-wise ones (attention's output, the MLP's down
projection) by input features, so each of attention and MLP needs one reduction. Attention
reshapes with ``-1`` heads, so the local shard holds ``n_heads / tp`` heads and no model code
changes.

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

import inspect

from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
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


def apply_tp(model: nn.Module, tp_mesh, sequence_parallel: bool = True, loss_parallel: bool = False,
             spec=None) -> None:
    """Parallelize ``model`` (possibly on the meta device) in place by ``spec.tp`` (``spec``: the
    model's :class:`~train.models.spec.ModelSpec`; by default :func:`~train.models.registry.spec_of`
    it). That the TP degree divides heads and MLP is checked by
    :class:`~train.parallel.dims.ParallelDims`."""
    from train.models.registry import spec_of

    spec = spec or spec_of(model)
    if spec.tp is None:
        raise ValueError(f"model family {spec.family}: no tensor-parallel plan")
    residual = Shard(1) if sequence_parallel else Replicate()
    layouts = _Layouts(tp_mesh, residual, sequence_parallel, loss_parallel)
    for name, style in spec.tp.root.items():
        layouts.apply(model, name, style)
    for _, block in spec.block_items(model):
        for name, style in spec.tp.block.items():
            layouts.apply(block, name, style, plan=spec.tp.block)
    for module in layouts.replicated:
        _replicate(module, tp_mesh)


class _Layouts:
    """The style names of a plan as torch's parallel styles for one mesh and layout."""

    def __init__(self, mesh, residual, sequence_parallel: bool, loss_parallel: bool):
        self.mesh, self.residual, self.sp, self.loss_parallel = mesh, residual, sequence_parallel, loss_parallel
        self.replicated: list[nn.Module] = []  # parameters replicated, plain tensors in and out (applied last)

    def apply(self, parent: nn.Module, name: str, style: str, plan=None) -> None:
        module = parent.get_submodule(name)
        logits = Shard(-1) if self.loss_parallel else Replicate()
        if style == "norm" and not self.sp or style == "replicate":
            self.replicated.append(module)
            return
        if style == "embedding":
            styles = [RowwiseParallel(input_layouts=Replicate(), output_layouts=self.residual)]
        elif style == "embedding_full":
            styles = [RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())]
        elif style == "to_residual":
            styles = [PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=self.residual)]
        elif style == "output":  # torch's style even with float8 (kept in high precision)
            styles = [ColwiseParallel(input_layouts=self.residual, output_layouts=logits,
                                      use_local_output=not self.loss_parallel)]
        elif style == "tied_output":  # head(h, weight): h gathered, the vocabulary-sharded weight as it is
            styles = [PrepareModuleInput(input_layouts=(self.residual, None), desired_input_layouts=(Replicate(), None),
                                         use_local_output=False),
                      PrepareModuleOutput(output_layouts=Shard(-1), desired_output_layouts=logits,
                                          use_local_output=not self.loss_parallel)]
        elif style == "norm":
            styles = [SequenceParallel()]
        elif style == "gather_input":
            consumers = [parent.get_submodule(n) for n, s in plan.items() if s == "colwise" and n.startswith(name + ".")]
            rest = (None,) * (_positional_args(module) - 1)
            styles = [_prepare_input(consumers, input_layouts=(self.residual, *rest),
                                     desired_input_layouts=(Replicate(), *rest))]
        elif style == "colwise":
            styles = [_linear_style(module, "col")]
        else:  # rowwise
            styles = [_linear_style(module, "row", output_layouts=self.residual)]
        for one in styles:
            parallelize_module(module, self.mesh, one)
        if style in ("embedding", "to_residual"):
            # its output feeds the first (possibly compiled) block
            module.register_forward_hook(_wait_async_output)


def _positional_args(module: nn.Module) -> int:
    """How many positional arguments ``module.forward`` takes (the layouts name each)."""
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(p.kind in kinds for p in inspect.signature(module.forward).parameters.values())


def _wait_async_output(module, inputs, output):
    """Resolve an ``AsyncCollectiveTensor`` (what ``to_local()`` returns after a
    redistribute) before it enters a compiled block: fed directly into a compiled region
    it lost its gradient (torch 2.13 CPU: the embedding got zero grad under TP +
    compile). The clone waits for the collective and keeps the autograd link."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    return output.clone() if isinstance(output, AsyncCollectiveTensor) else output


def _replicate(module: nn.Module, tp_mesh) -> None:
    """Parameters as ``Replicate()`` DTensors with plain-tensor inputs/outputs: norms without
    sequence parallelism (they see full activations), position tables. So every parameter lives
    on the TP mesh (one mesh for FSDP and for the global gradient norm)."""
    from torch.distributed.tensor import distribute_module

    def to_local_output(mod, outputs, device_mesh):
        return outputs.to_local() if hasattr(outputs, "to_local") else outputs

    def to_replicate_input(mod, inputs, device_mesh):
        from torch.distributed.tensor import DTensor

        return tuple(
            DTensor.from_local(x, device_mesh, [Replicate()], run_check=False) if not isinstance(x, DTensor) else x
            for x in inputs
        )

    distribute_module(module, tp_mesh, input_fn=to_replicate_input, output_fn=to_local_output)
