"""parallel.fsdp_symm_mem: where ``auto`` turns FSDP2's symmetric-memory all-gather on, the NCCL
variable the trainer sets for it, and the settings it refuses (the GPU side is in
test_parallel_gpu.py; on gloo the fallback trains as DDP does, test_parallel_equivalence.py)."""

from __future__ import annotations

import pytest

from testlib import load_job
from train.errors import ConfigError
from train.parallel import symm_comm


@pytest.fixture
def nccl_228(monkeypatch):
    """A CUDA build with NCCL 2.28.9, one node of 2 ranks, no CTA policy in the environment."""
    monkeypatch.setattr(symm_comm, "_nccl_version", lambda: (2, 28, 9))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("NCCL_CTA_POLICY", raising=False)


FSDP = ["parallel.strategy=fsdp", "train.device=cuda"]


@pytest.mark.parametrize("overrides, env, expected", [
    (FSDP, {}, "all_gather"),
    (FSDP + ["parallel.fsdp_symm_mem=none"], {}, "none"),
    (FSDP + ["parallel.fsdp_symm_mem=all"], {}, "all"),
    ([], {}, "none"),  # DDP
    (FSDP + ["parallel.cpu_offload=true"], {}, "none"),
    (["parallel.strategy=fsdp"], {}, "none"),  # testlib's BASE: train.device=cpu
    (FSDP, {"LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "4"}, "none"),  # two nodes
    (FSDP, {"NCCL_CTA_POLICY": "1"}, "none"),  # the environment chose another policy
    (FSDP, {"NCCL_CTA_POLICY": "2"}, "all_gather"),
], ids=["fsdp", "none", "all", "ddp", "offload", "cpu", "two_nodes", "policy1", "policy2"])
def test_auto_turns_on_only_where_measured(nccl_228, monkeypatch, overrides, env, expected):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    job = load_job(overrides)
    assert symm_comm.resolved_mode(job) == expected
    want_env = {"NCCL_CTA_POLICY": "2"} if expected != "none" and "NCCL_CTA_POLICY" not in env else {}
    assert symm_comm.nccl_env(job) == want_env


def test_auto_is_off_before_nccl_2_28(nccl_228, monkeypatch):
    monkeypatch.setattr(symm_comm, "_nccl_version", lambda: (2, 27, 7))
    job = load_job(FSDP)
    assert symm_comm.resolved_mode(job) == "none" and symm_comm.nccl_env(job) == {}


def test_auto_is_off_without_cuda():
    """This machine (no GPU): nothing to set, nothing applied."""
    job = load_job(FSDP)
    if symm_comm._nccl_version():
        pytest.skip("CUDA present")
    assert symm_comm.resolved_mode(job) == "none" and symm_comm.nccl_env(job) == {}


@pytest.mark.parametrize("overrides, culprit", [
    (FSDP + ["parallel.fsdp_symm_mem=all", "parallel.cpu_offload=true"], "parallel.cpu_offload"),
    (FSDP + ["parallel.fsdp_symm_mem=some"], "must be auto, none, all_gather or all"),
])
def test_refused_settings_name_the_culprit(overrides, culprit):
    with pytest.raises(ConfigError, match="parallel.fsdp_symm_mem") as info:
        load_job(overrides)
    assert culprit in str(info.value)


def _all_to_all_reduce_scatter(rank, world, result_file):
    """Each rank's output of ``reduce_scatter_by_all_to_all`` against the rows of every rank's input
    gathered and reduced here (gloo, real processes), for SUM and AVG in fp32 and bf16."""
    import torch
    import torch.distributed as dist

    group, out = dist.group.WORLD, {}
    for dtype in (torch.float32, torch.bfloat16):
        inp = torch.randn(world * 1000, generator=torch.Generator().manual_seed(rank)).to(dtype) * (rank + 1)
        every = [torch.empty_like(inp) for _ in range(world)]
        dist.all_gather(every, inp)
        mine = torch.stack([t.view(world, -1)[rank].float() for t in every])  # row r: rank r's part of my shard
        for op, want in ((dist.ReduceOp.SUM, mine.sum(0)), (dist.ReduceOp.AVG, mine.sum(0) / world)):
            got = torch.empty(inp.numel() // world, dtype=dtype)
            symm_comm.reduce_scatter_by_all_to_all(got, inp, group, op, torch.empty_like(inp))
            out[(str(dtype), str(op), rank)] = (got, want.to(dtype))
            if dtype == torch.bfloat16:  # bf16 rows summed into an fp32 output: the fp32 sums of their fp32 copies
                wide = torch.empty(inp.numel() // world, dtype=torch.float32)
                symm_comm.reduce_scatter_by_all_to_all(wide, inp, group, op, torch.empty_like(inp))
                out[("bf16->fp32", str(op), rank)] = (wide, want)
    gathered = [None] * world
    dist.all_gather_object(gathered, out)
    if rank == 0:
        torch.save({k: v for part in gathered for k, v in part.items()}, result_file)


@pytest.mark.parametrize("world", [2, 4])
def test_reduce_scatter_by_all_to_all_is_a_reduce_scatter(tmp_path, world):
    """``all``'s reduce-scatter (all-to-all, then a local sum or mean): every rank gets the sum or mean
    of its shard over the ranks; with 2 ranks bit for bit (one addition per element, as NCCL's)."""
    import torch

    from testlib import rank0_result

    results = rank0_result(_all_to_all_reduce_scatter, tmp_path, world)
    assert len(results) == 3 * 2 * world
    for (dtype, op, rank), (got, want) in results.items():
        if world == 2:
            assert torch.equal(got, want), (dtype, op, rank)
        else:
            torch.testing.assert_close(got, want, rtol=1e-2 if dtype == "torch.bfloat16" else 1e-5, atol=1e-5)


def _fsdp_grads(rank, world, result_file):
    """FSDP2 on gloo, a few linears, one backward with FSDP2's collectives and one with the
    trainer's (``_make_comms()["plain"]``: the symmetric-memory classes' plain-buffer bases, as
    symmetric memory needs CUDA): the sharded gradients of both."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))  # gloo, on a machine with GPUs too
    all_gather, reduce_scatter = symm_comm._make_comms()["plain"]
    grads = {}
    for custom in (False, True):
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(3)])
        for layer in model:
            fully_shard(layer, mesh=mesh)
            if custom:
                layer.set_custom_all_gather(all_gather(layer))
                layer.set_custom_reduce_scatter(reduce_scatter(world))
        fully_shard(model, mesh=mesh)
        x = torch.randn(4, 16, generator=torch.Generator().manual_seed(rank))
        model(x).square().mean().backward()
        grads[custom] = {n: p.grad.to_local().clone() for n, p in model.named_parameters()}
    same = all(torch.equal(grads[False][n], grads[True][n]) for n in grads[False])
    flags = [None] * world
    dist.all_gather_object(flags, same)
    if rank == 0:
        torch.save(flags, result_file)


@pytest.mark.skipif(symm_comm._comm_bases() is None, reason="this torch has no FSDP2 custom-comm hooks (2.7 has none)")
def test_fsdp2_trains_the_same_with_the_all_to_all_reduce_scatter(tmp_path):
    """Through FSDP2's custom reduce-scatter hook (the op, shapes and buffers FSDP2 hands it): the
    same gradients on every rank, bit for bit, as FSDP2's own reduce-scatter."""
    from testlib import rank0_result

    assert rank0_result(_fsdp_grads, tmp_path, 2) == [True, True]


def _fsdp_bf16_grads(rank, world, result_file):
    """FSDP2 on gloo with bf16 parameters and an fp32 reduction: FSDP2's own collectives against the
    trainer's (``_make_comms()["plain"]``) carrying the bf16 gradients, for one step without
    gradient accumulation, one accumulated through the bundle's ``no_sync``, and one accumulated by
    calling ``set_requires_gradient_sync(False)`` directly: the sharded gradients of each, and the
    dtypes each all-to-all carried."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from train.parallel.fsdp import _no_sync

    mesh = init_device_mesh("cpu", (world,))  # gloo, on a machine with GPUs too
    all_gather, base = symm_comm._make_comms()["plain"]
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    grads, carried = {}, {}
    for how in ("single", "no_sync", "direct"):
        for custom in (False, True):
            seen = carried.setdefault(how, []) if custom else []

            class Recording(base):
                def __call__(self, output_tensor, input_tensor, group, op, async_op=False, seen=seen):
                    seen.append((str(input_tensor.dtype), str(output_tensor.dtype)))
                    super().__call__(output_tensor, input_tensor, group, op, async_op)

            torch.manual_seed(0)
            model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(3)])
            transport = symm_comm.GradTransport(torch.bfloat16)
            for layer in model:
                fully_shard(layer, mesh=mesh, mp_policy=policy)
                if custom:
                    layer.set_custom_all_gather(all_gather(layer, transport))
                    layer.set_custom_reduce_scatter(Recording(world, transport))
            fully_shard(model, mesh=mesh, mp_policy=policy)
            x = [torch.randn(4, 16, generator=torch.Generator().manual_seed(10 * rank + i)) for i in range(2)]
            if how == "no_sync":
                with _no_sync(model):
                    model(x[1]).square().mean().backward()
            elif how == "direct":
                model.set_requires_gradient_sync(False)
                model(x[1]).square().mean().backward()
                model.set_requires_gradient_sync(True)
            model(x[0]).square().mean().backward()
            grads[(custom, how)] = {n: p.grad.to_local().clone() for n, p in model.named_parameters()}
    same = {how: all(torch.equal(grads[(False, how)][n], grads[(True, how)][n]) for n in grads[(False, how)])
            for how in carried}
    gathered = [None] * world
    dist.all_gather_object(gathered, (same, carried))
    if rank == 0:
        torch.save(gathered, result_file)


@pytest.mark.skipif(symm_comm._comm_bases() is None, reason="this torch has no FSDP2 custom-comm hooks (2.7 has none)")
def test_the_all_to_all_reduce_scatter_carries_bf16_gradients_and_sums_them_in_fp32(tmp_path):
    """bf16 training, fp32 reduction: the all-to-all carries the bf16 gradients (half of FSDP2's fp32
    buffer) into fp32 sums, bit for bit FSDP2's own fp32 reduce-scatter with 2 ranks. Once gradient
    accumulation has begun (FSDP2 accumulates in fp32), whether through the bundle's ``no_sync`` or
    ``set_requires_gradient_sync`` called directly, it carries fp32, and the accumulated gradients
    are bit for bit FSDP2's too."""
    from testlib import rank0_result

    bf16, fp32 = ("torch.bfloat16", "torch.float32"), ("torch.float32", "torch.float32")
    for same, carried in rank0_result(_fsdp_bf16_grads, tmp_path, 2):
        assert same == {"single": True, "no_sync": True, "direct": True}
        assert carried == {"single": [bf16] * 3, "no_sync": [fp32] * 3, "direct": [fp32] * 3}, carried


def _trainer_grads(rank, world, result_file):
    """The Trainer with FSDP2 on gloo, bf16 parameters, with and without gradient accumulation:
    FSDP2's own collectives (``fsdp_symm_mem=none``) against ``all`` installed by ``apply_fsdp`` as
    on CUDA (only the symmetric-memory parts swapped for their plain bases): losses and gradient
    norms per step, and the dtypes each reduce-scatter carried."""
    import tempfile
    from pathlib import Path

    import torch
    from torch.distributed import _symmetric_memory

    from testlib import FSDP, load_job
    from train.distributed import DistInfo
    from train.trainer import Trainer

    comms = symm_comm._make_comms()
    carried, registered = [], []

    def recording(base):
        class Recording(base):
            def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
                carried.append(str(input_tensor.dtype))
                super().__call__(output_tensor, input_tensor, group, op, async_op)
        return Recording

    symm_comm._why_not = lambda *a: None
    symm_comm._symm_setup = lambda *a: True
    # "symm": the symmetric-memory classes themselves, with the two CUDA-only calls they make
    # (the NCCL pool's allocation, the rendezvous) standing in as plain buffers and a record
    symm_comm._SymmAlloc.allocate = lambda self, size, *, dtype, device: torch.empty(size, dtype=dtype, device=device)
    _symmetric_memory.rendezvous = lambda buf, group: registered.append((str(buf.dtype), group))
    info = DistInfo(rank, rank, world, torch.device("cpu"), "gloo")
    out = {}
    for accum in ([], ["train.batch_size=2", "train.global_batch_size=8"]):
        for mode in ("none", "all", "symm"):
            carried.clear()
            registered.clear()
            ag, rs = comms["symm" if mode == "symm" else "plain"]
            symm_comm._comm_classes = lambda ag=ag, rs=rs: (ag, recording(rs))
            setting = "all" if mode == "symm" else mode
            job = load_job(FSDP + accum + [f"parallel.fsdp_symm_mem={setting}", "parallel.fsdp_param_dtype=bf16"])
            trainer = Trainer(job, info, Path(tempfile.mkdtemp()))
            out[(bool(accum), mode)] = ([trainer.train_step()[:2] for _ in range(job.train.steps)], sorted(set(carried)),
                                        sorted(set(registered)))
            trainer.metrics.close()
    if rank == 0:
        torch.save(out, result_file)


@pytest.mark.skipif(symm_comm._comm_bases() is None, reason="this torch has no FSDP2 custom-comm hooks (2.7 has none)")
def test_the_trainer_installs_the_bf16_reduce_scatter_and_widens_it_for_accumulation(tmp_path):
    """Through ``apply_fsdp`` and the Trainer's own loop (its ``no_sync`` for accumulation): with
    bf16 parameters, ``all`` carries bf16 gradients, or fp32 ones under gradient accumulation, and
    trains bit for bit as FSDP2's own fp32 reduce-scatter with 2 ranks; the symmetric-memory classes
    (their NCCL-pool allocation and rendezvous recorded instead of made) register every buffer the
    collectives use, in those dtypes."""
    from testlib import rank0_result

    out = rank0_result(_trainer_grads, tmp_path, 2)
    for accum in (False, True):
        assert out[(accum, "none")][1:] == ([], [])  # FSDP2's own collectives
        for mode in ("all", "symm"):
            assert out[(accum, mode)][1] == (["torch.float32"] if accum else ["torch.bfloat16"]), mode
            assert out[(accum, mode)][0] == out[(accum, "none")][0], (accum, mode)
        assert out[(accum, "all")][2] == []
        registered = {dtype for dtype, _ in out[(accum, "symm")][2]}
        assert registered == ({"torch.bfloat16", "torch.float32"} if accum else {"torch.bfloat16"}), registered
