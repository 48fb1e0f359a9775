"""FSDP2's collective buffers from symmetric memory (``parallel.fsdp_symm_mem``).

NCCL 2.28 runs an all-gather on the GPUs' copy engines, with no SM of its own, when the
output buffer is a symmetric window registered with the communicator and the communicator's
CTA policy is zero (``NCCL_CTA_POLICY=2``, documented in NCCL's environment variables). The
GEMMs that an FSDP2 all-gather overlaps then keep all SMs. Without the zero-CTA policy NCCL
uses its symmetric kernels on such buffers instead. A reduce-scatter needs arithmetic, so it has
no copy-engine path; ``all`` does it as an all-to-all between symmetric windows (copy engines,
under the same policy) and a local sum of the rows (:func:`reduce_scatter_by_all_to_all`).

torch >= 2.12 does the all-gather half itself (``FSDPModule.set_symm_mem_for_comm``, used for
``all_gather`` when present); torch 2.11 (the device machines') has the pieces but not the method,
so the same is done through FSDP2's custom-comm hooks (``set_custom_all_gather`` /
``set_custom_reduce_scatter``): each staging buffer is allocated from ``torch.distributed._symmetric_memory``'s NCCL memory
pool (reused from step to step, as FSDP2 frees them) and rendezvoused before the collective.

Only with NCCL on CUDA; anywhere else (gloo on the CPU, no such hooks) the default
collectives are kept, with one warning where the setting named a mode (silently under
``auto``, the default, which applies ``all_gather`` only where it was measured:
:func:`resolved_mode`). :func:`nccl_env` is what the process sets before its communicators
exist: ``NCCL_CTA_POLICY=2`` unless the environment names a policy.
The policy is the communicator's, so every collective runs under it; collectives on buffers
that are not symmetric windows have no zero-CTA path and run their kernels as before.
"""

from __future__ import annotations

import logging
import math
import os

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

CE_MIN_NCCL = (2, 28, 0)  # NCCL's copy-engine collectives (zero-CTA policy)


def _nccl_version() -> tuple:
    return tuple(torch.cuda.nccl.version()) if torch.cuda.is_available() else ()


def _one_node() -> bool:
    """torchrun's view: every rank of the job on this node (symmetric windows need NVLink/P2P peers)."""
    local, world = os.environ.get("LOCAL_WORLD_SIZE", ""), os.environ.get("WORLD_SIZE", "")
    return not (local.isdigit() and world.isdigit() and int(local) < int(world))


def resolved_mode(job, device_type: str = "cuda") -> str:
    """``parallel.fsdp_symm_mem`` for this job: ``auto`` is ``all_gather`` where it was measured to
    win (FSDP2 on CUDA within one node, NCCL with copy-engine collectives, the zero-CTA policy not
    overridden, no CPU offload), else ``none``."""
    pcfg = job.parallel
    if pcfg.fsdp_symm_mem != "auto":
        return pcfg.fsdp_symm_mem
    policy = os.environ.get("NCCL_CTA_POLICY", "2")
    usable = (pcfg.strategy == "fsdp" and not pcfg.cpu_offload and device_type == "cuda"
              and job.train.device != "cpu" and policy == "2"
              and _one_node() and _nccl_version() >= CE_MIN_NCCL)
    return "all_gather" if usable else "none"


def nccl_env(job) -> dict[str, str]:
    """NCCL variables that ``parallel.fsdp_symm_mem`` needs before the process group starts:
    the zero-CTA policy (copy-engine all-gather) when NCCL has it and nothing else set a policy."""
    if job.parallel.strategy != "fsdp" or resolved_mode(job) == "none" or "NCCL_CTA_POLICY" in os.environ:
        return {}
    version = _nccl_version()
    if not version:
        return {}
    if version < CE_MIN_NCCL:
        log.warning("parallel.fsdp_symm_mem: NCCL %s has no copy-engine collectives (>= %s): symmetric kernels instead",
                    ".".join(map(str, version)), ".".join(map(str, CE_MIN_NCCL)))
        return {}
    return {"NCCL_CTA_POLICY": "2"}


def _comm_bases():
    """torch's FSDP2 comm interfaces (private module, public ``set_custom_*`` methods), or None."""
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
    except ImportError:
        return None
    return AllGather, ReduceScatter


class GradTransport:
    """The dtype in which ``all``'s reduce-scatter carries the gradients: the unsharded gradients'
    own (``param_dtype``, bf16 in bf16 training; None: the reduce dtype). FSDP2 accumulates the
    gradients of unsynced micro-steps in the reduce dtype, so once gradient accumulation has begun
    they travel in the reduce dtype for the rest of the run: a bf16 buffer would round the
    accumulated sums. :meth:`accumulating` is called by the all-gather of any unit whose gradients
    are not synced in its step (the bundle's ``no_sync``, or ``set_requires_gradient_sync`` called
    any other way): every unit all-gathers in forward, before its gradients exist."""

    def __init__(self, grad_dtype: torch.dtype | None):
        self.dtype = grad_dtype

    def accumulating(self) -> None:
        self.dtype = None


class _SymmAlloc:
    """Staging buffers from the symmetric-memory pool of the NCCL backend."""

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        from torch.distributed import _symmetric_memory as symm_mem

        with torch.cuda.use_mem_pool(symm_mem.get_mem_pool(device)):
            return torch.empty(size, dtype=dtype, device=device)


def reduce_scatter_by_all_to_all(output: torch.Tensor, input: torch.Tensor, group, op, scratch: torch.Tensor) -> None:
    """``reduce_scatter_tensor(output, input, op)`` as an all-to-all into ``scratch`` (same size and
    dtype as ``input``: row r then holds rank r's part of this rank's shard) and a local sum or mean
    of the rows in ``output``'s dtype. NCCL runs an all-to-all between symmetric windows on the copy
    engines under the zero-CTA policy, so only the short sum takes SMs. ``input`` may be narrower than
    ``output`` (bf16 gradients, an fp32 reduction): the rows travel in bf16 and are summed in fp32,
    the same addends in the same precision as NCCL's fp32 reduce-scatter of their fp32 copies (bit for
    bit with 2 ranks, where the order cannot differ). ``op``: SUM or AVG; any other (FSDP2's
    PREMUL_SUM for a custom divide factor) takes NCCL's reduce-scatter in ``output``'s dtype."""
    if op not in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
        dist.reduce_scatter_tensor(output, input.to(output.dtype), op=op, group=group)
        return
    dist.all_to_all_single(scratch, input, group=group)
    rows = scratch.view(group.size(), -1)
    reduce = torch.sum if op == dist.ReduceOp.SUM else torch.mean
    reduce(rows, dim=0, dtype=output.dtype, out=output.view(-1))


def syncs_gradients(unit) -> bool:
    """Whether FSDP2 reduce-scatters ``unit``'s gradients in this backward (False between
    ``set_requires_gradient_sync(False)`` and ``(True)``: it accumulates them unreduced, in the
    reduce dtype). False where this torch does not say (so the caller assumes accumulation)."""
    try:
        group = unit._get_fsdp_state()._fsdp_param_group
    except AttributeError:
        return False
    return group is None or bool(getattr(group, "reduce_grads", False))


def _make_comms() -> dict:
    """FSDP2's custom collectives (``set_custom_*``): ``"symm"`` (all-gather, reduce-scatter) on
    symmetric memory, and ``"plain"``, the same on plain buffers (their bases); {} where this torch
    has no such hooks."""
    bases = _comm_bases()
    if bases is None:
        return {}
    (plain_ag, symm_ag), (plain_rs, symm_rs) = _all_gathers(bases[0]), _reduce_scatters(bases[1])
    return {"symm": (symm_ag, symm_rs), "plain": (plain_ag, plain_rs)}


def _all_gathers(all_gather_base) -> tuple:
    """(plain, symmetric-memory) all-gather classes on FSDP2's ``AllGather`` interface."""

    class AllGatherComm(all_gather_base):
        """FSDP2's all-gather (in place: the output buffer holds this rank's input). Every unit's
        forward all-gathers, so here it also notes gradient accumulation for ``transport``: a unit
        that does not sync its gradients in this step has them accumulated in the reduce dtype."""

        def __init__(self, unit=None, transport: GradTransport | None = None):
            self._unit, self._transport = unit, transport

        def allocate(self, size, *, dtype, device):
            return torch.empty(size, dtype=dtype, device=device)

        def _register(self, buf: torch.Tensor, group) -> None:
            """Make ``buf`` usable by the collective (nothing for plain buffers)."""

        def __call__(self, output_tensor, input_tensor, group, async_op=False):
            t = self._transport
            if t is not None and t.dtype is not None and self._unit is not None and not syncs_gradients(self._unit):
                t.accumulating()
            self._register(output_tensor, group)  # only the output: it holds this rank's input
            return dist.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)

    class SymmAllGather(AllGatherComm):
        def allocate(self, size, *, dtype, device):
            return _SymmAlloc().allocate(size, dtype=dtype, device=device)

        def _register(self, buf, group):
            from torch.distributed import _symmetric_memory as symm_mem

            symm_mem.rendezvous(buf, group=group.group_name)

    return AllGatherComm, SymmAllGather


def _reduce_scatters(reduce_scatter_base) -> tuple:
    """(plain, symmetric-memory) reduce-scatter classes on FSDP2's ``ReduceScatter`` interface."""

    class AllToAllReduceScatter(reduce_scatter_base):
        """FSDP2's reduce-scatter as :func:`reduce_scatter_by_all_to_all`. FSDP2 asks for the input,
        then the output (1/world of its size), then calls. The output, which FSDP2 keeps as the
        sharded gradient, always comes from the default allocator.

        ``transport``: the gradients' dtype (:class:`GradTransport`). Where it is narrower than the
        reduce dtype (bf16 gradients, fp32 reduction), the input buffer is allocated in it: FSDP2's
        copy-in then copies the gradients without a cast, the all-to-all moves half the bytes, and
        the sum is done in the reduce dtype into the output. The buffers here are plain tensors;
        :class:`SymmReduceScatter` takes them from symmetric memory."""

        def __init__(self, world: int, transport: GradTransport | None = None):
            self._world, self._input_numel, self._transport = world, None, transport

        def _buffer(self, size, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
            """A buffer the all-to-all reads or writes (the input, the scratch)."""
            return torch.empty(size, dtype=dtype, device=device)

        def _register(self, buf: torch.Tensor, group) -> None:
            """Make ``buf`` usable by the all-to-all (nothing for plain buffers)."""

        def allocate(self, size, *, dtype, device):
            numel = math.prod(int(s) for s in size)
            if self._input_numel is not None and numel * self._world == self._input_numel:
                self._input_numel = None
                return torch.empty(size, dtype=dtype, device=device)
            self._input_numel = numel
            narrow = self._transport.dtype if self._transport is not None else None
            if narrow is not None and narrow.is_floating_point and narrow.itemsize < dtype.itemsize:
                dtype = narrow
            return self._buffer(size, dtype, device)

        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            self._input_numel = None  # the next allocate is the next reduce's input
            scratch = self._buffer(input_tensor.shape, input_tensor.dtype, input_tensor.device)
            for buf in (input_tensor, scratch):
                self._register(buf, group)
            reduce_scatter_by_all_to_all(output_tensor, input_tensor, group, op, scratch)

    class SymmReduceScatter(AllToAllReduceScatter):
        """The input and the all-to-all's scratch are symmetric windows. The output stays in the
        default allocator: in the pool it would hold memory that the rest of the step cannot reuse
        (8b on 2xH100 ran out of memory so)."""

        def _buffer(self, size, dtype, device):
            return _SymmAlloc().allocate(size, dtype=dtype, device=device)

        def _register(self, buf, group):
            from torch.distributed import _symmetric_memory as symm_mem

            symm_mem.rendezvous(buf, group=group.group_name)

    return AllToAllReduceScatter, SymmReduceScatter


def _comm_classes() -> tuple:
    """The (all-gather, reduce-scatter) classes :func:`apply_symm_mem` installs."""
    return _make_comms()["symm"]


def _symm_setup(mode: str, group) -> bool:
    """Symmetric memory on NCCL for this process, the communicator up: whether it is usable."""
    from torch.distributed import _symmetric_memory as symm_mem

    try:  # once per process; a later Trainer (bench step's next point) finds it set
        symm_mem.set_backend("NCCL")
    except RuntimeError as exc:
        if str(symm_mem.get_backend(torch.device("cuda", torch.cuda.current_device()))).upper() != "NCCL":
            log.warning("parallel.fsdp_symm_mem=%s: %s; FSDP2 keeps its default collectives", mode,
                        " ".join(str(exc).split())[:200])
            return False
    dist.barrier(group=group)  # the communicator exists before the first rendezvous
    return True


def _why_not(device_type: str, group, native: bool) -> str | None:
    """Why symmetric-memory buffers cannot be used here, or None."""
    if device_type != "cuda" or "nccl" not in str(dist.get_backend(group)).lower():
        return "needs NCCL on CUDA"
    if not native and _comm_bases() is None:
        return "this torch has neither FSDPModule.set_symm_mem_for_comm nor FSDP2's custom collectives"
    return None


def apply_symm_mem(units: list, job, device_type: str, group, grad_dtype: torch.dtype | None = None) -> bool:
    """Put the FSDP2 units' collectives (``units`` in forward order) on symmetric-memory buffers
    (:func:`resolved_mode`: all_gather | all). ``grad_dtype``: the unsharded gradients' dtype
    (FSDP2's ``param_dtype``), in which ``all``'s reduce-scatter carries them while no gradient
    accumulation has begun (:class:`GradTransport`; it sums in the reduce dtype). Returns whether it
    was applied; else the default collectives stay (one warning where the setting asked for it,
    silently under ``auto``)."""
    mode = resolved_mode(job, device_type)
    if mode == "none" or not units or group.size() < 2:
        return False
    # torch >= 2.12 has the all-gather half itself; it cannot be combined with a custom reduce-scatter
    native = mode == "all_gather" and hasattr(units[0], "set_symm_mem_for_comm")
    why = _why_not(device_type, group, native)
    if why is not None:
        if job.parallel.fsdp_symm_mem != "auto":
            log.warning("parallel.fsdp_symm_mem=%s: %s; FSDP2 keeps its default collectives", mode, why)
        return False
    if not _symm_setup(mode, group):
        return False
    transport = GradTransport(grad_dtype)
    if not syncs_gradients(units[0]):  # this torch does not say: carry the reduce dtype
        transport.accumulating()
    comms = None if native else _comm_classes()
    for unit in units:
        if native:
            unit.set_symm_mem_for_comm("NCCL")
            continue
        unit.set_custom_all_gather(comms[0](unit, transport))
        if mode == "all":
            unit.set_custom_reduce_scatter(comms[1](group.size(), transport))
    return True
