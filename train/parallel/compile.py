"""``torch.compile`` per transformer block (``parallel.compile``, ``parallel.compile_mode``,
``parallel.activation_memory_budget`` and its ``_skip_last``, ``parallel.recompute_param_casts``).

Blocks are compiled in place with ``nn.Module.compile`` (no ``_orig_mod.`` wrapper, so
parameter names do not change). All blocks share one code object and, with torch's
default of inlining built-in nn modules, one compiled graph: compile time does not grow
with depth.

Where the parameters are cast inside the compiled blocks (autocast over fp32 parameters:
DDP, and ``parallel.fsdp_one_rank=cast``), the partitioner would save each block's bf16 copy
of its weights for backward: 2 bytes per parameter held from forward to backward, because a
cast whose output a backward matmul reads is "materialized in backward" and never
recomputed by its heuristics. ``parallel.recompute_param_casts`` (the automatic plan's choice on one
GPU; at 1b bf16 on one H200 it saves 1.81 GiB for 0.5% of the throughput) tags those
casts (narrowing casts of the graph's inputs) ``MUST_RECOMPUTE`` in a joint-graph pass
(Inductor's ``joint_custom_post_pass``), so backward casts the fp32 parameter again, as
FSDP re-gathers a resharded one: one more read of the weights per step, bit-identical
values (tests/parallel/test_parallel_compile.py).

``parallel.activation_memory_budget_skip_last`` = k leaves the budget off the last k blocks
(as ``ac_skip_last`` does for checkpointing): backward reaches them first, so what they save
is freed early. The first blocks are then compiled by a backend of their own that applies the
budget while it partitions (``torch._functorch.config.patch``); Dynamo keeps one graph per
backend, so there are two graphs, each shared by its blocks.

Inductor's on-disk caches live under ``TORCHINDUCTOR_CACHE_DIR``; when unset it defaults
to ``~/.cache/hopper-train/inductor`` (``$XDG_CACHE_HOME`` honoured) rather than a /tmp
directory, so that a second launch of the same model reuses the compiled kernels.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch
from torch import fx, nn

from train.paths import default_cache_dir

_NARROW = (torch.bfloat16, torch.float16)
_CAST_PASS_UUID = "hopper-train.recompute_param_casts.v1"  # Inductor's FX graph cache key of the pass
log = logging.getLogger(__name__)


def _torch_default_cache_dir() -> str | None:
    """Inductor's own default (``/tmp/torchinductor_$USER``). Inductor writes it into
    ``TORCHINDUCTOR_CACHE_DIR`` the first time anything asks for its cache directory, so
    that value in the environment does not mean the user chose it."""
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:  # private module moved: only an unset variable counts as unset
        return None
    return os.path.abspath(default_cache_dir())


def inductor_cache_dir() -> Path:
    """Set ``TORCHINDUCTOR_CACHE_DIR`` if the user has not, and return it."""
    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not current or os.path.abspath(current) == _torch_default_cache_dir():
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(default_cache_dir() / "inductor")
    path = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    path.mkdir(parents=True, exist_ok=True)
    return path


def apply_compile(model: nn.Module, pcfg, spec=None) -> int:
    """Compile every block of ``model`` in place; returns how many. ``spec``: the model's
    :class:`~train.models.spec.ModelSpec` (by default :func:`~train.models.registry.spec_of` it)."""
    if not pcfg.compile:
        return 0
    from train.models.registry import spec_of

    spec = spec or spec_of(model)
    inductor_cache_dir()
    # process-wide: set on every compile, so that one job's budget does not outlive it
    import torch._functorch.config as functorch_config

    blocks = [block for _, block in spec.block_items(model)]
    budgeted = len(blocks)  # the first blocks, compiled under the budget
    skip = pcfg.activation_memory_budget_skip_last
    if skip and pcfg.activation_memory_budget < 1 and pcfg.compile_backend == "inductor":
        budgeted = max(0, len(blocks) - skip)
    functorch_config.activation_memory_budget = pcfg.activation_memory_budget if budgeted == len(blocks) else 1.0
    if pcfg.compile_backend == "inductor":
        _install_cast_pass(pcfg.recompute_param_casts)
    kwargs = {"backend": pcfg.compile_backend, "fullgraph": True}
    if pcfg.compile_backend == "inductor" and pcfg.compile_mode != "default":
        kwargs["mode"] = pcfg.compile_mode
    first = kwargs
    if budgeted < len(blocks):
        first = {"backend": _budget_backend(pcfg.activation_memory_budget, pcfg.compile_mode), "fullgraph": True}
    for i, block in enumerate(blocks):
        block.compile(**(first if i < budgeted else kwargs))
    return len(blocks)


def _budget_backend(budget: float, mode: str):
    """Inductor, with ``budget`` as the partitioner's activation memory budget while it compiles
    (one object: the blocks compiled with it share their graph)."""
    import torch._functorch.config as functorch_config
    from torch._inductor import list_mode_options
    from torch._inductor.compile_fx import compile_fx

    patches = list_mode_options(mode) if mode != "default" else {}

    def inductor_under_budget(gm: fx.GraphModule, example_inputs):
        with functorch_config.patch(activation_memory_budget=budget):
            return compile_fx(gm, example_inputs, config_patches=patches)

    return inductor_under_budget


def tag_param_casts(graph: fx.Graph) -> int:
    """Mark every narrowing cast (fp32 -> bf16/fp16) of a forward input of a joint graph
    ``MUST_RECOMPUTE``; returns how many. The partitioner then recomputes the cast in
    backward from the input (the fp32 parameter, alive anyway) instead of saving it."""
    from torch.utils.checkpoint import CheckpointPolicy

    casts = (torch.ops.prims.convert_element_type.default, torch.ops.aten._to_copy.default)
    tagged = 0
    for node in graph.nodes:
        if node.op != "call_function" or node.target not in casts or not isinstance(node.args[0], fx.Node):
            continue
        src = node.args[0]
        if src.op != "placeholder" or str(src.target).startswith("tangents"):
            continue
        before, after = src.meta.get("val"), node.meta.get("val")
        if (isinstance(before, torch.Tensor) and isinstance(after, torch.Tensor)
                and before.dtype == torch.float32 and after.dtype in _NARROW):
            node.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
            tagged += 1
    return tagged


def _install_cast_pass(enabled: bool) -> None:
    """Set (or clear) our joint-graph pass in Inductor's process-wide config, on every
    compile like the budget above. A pass someone else installed is left alone."""
    import torch._inductor.config as inductor_config
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class RecomputeParamCasts(CustomGraphPass):
        def __call__(self, graph: fx.Graph) -> None:
            tag_param_casts(graph)

        def uuid(self) -> str:
            return _CAST_PASS_UUID

    current = inductor_config.joint_custom_post_pass
    if current is not None and getattr(current, "uuid", lambda: None)() != _CAST_PASS_UUID:
        log.warning("parallel.recompute_param_casts: Inductor's joint_custom_post_pass is already set (%r); "
                    "parameter casts are saved for backward", current)
        return
    inductor_config.joint_custom_post_pass = RecomputeParamCasts() if enabled else None
