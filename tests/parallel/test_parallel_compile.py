"""``parallel.compile``: blocks compiled in place (parameter names unchanged) give the
eager losses and gradients, here in the hardest composition we run on CPU: tensor
parallel with sequence parallel, where the embedding's output reaches the first
compiled block as an AsyncCollectiveTensor (the embedding got a zero gradient before
the fix in train/parallel/tp.py). The test compiles with the ``aot_eager`` backend:
Dynamo + AOTAutograd, where that bug lives, without Inductor's C++ code generation
(minutes on 2 CPU cores); Inductor itself runs in the GPU campaign. Inductor's cache
goes to ~/.cache/hopper-train/inductor unless TORCHINDUCTOR_CACHE_DIR is set."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from testlib import FSDP, gloo_runs, load_job, spawn

TP = FSDP + ["parallel.tp=2", "train.batch_size=8", "model.n_layers=1", "train.steps=2",
           "parallel.compile_backend=aot_eager"]


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.full_tensor().clone() for n, p in model.named_parameters()}


def _measure(trainer) -> tuple:
    names = [n for n, _ in trainer.par.model.named_parameters()]
    trainer.forward_backward()
    grads = _grads(trainer.par.model)
    trainer.optimizer.zero_grad(set_to_none=True)
    losses = [trainer.train_step()[0] for _ in range(2)]
    return names, grads, losses


def _worker(rank, world, result_file):
    jobs = {compiled: load_job(TP + [f"parallel.compile={str(compiled).lower()}"]) for compiled in (False, True)}
    gloo_runs(rank, world, jobs, _measure, result_file)


def test_compiled_tp_blocks_match_eager(tmp_path):
    out = tmp_path / "compile.pt"
    spawn(_worker, 2, out)
    runs = torch.load(out)
    (names, grads, losses), (c_names, c_grads, c_losses) = runs[False], runs[True]
    assert c_names == names and not any("_orig_mod" in n for n in names)
    for name, g in grads.items():
        assert g.abs().max() > 0, f"eager grad of {name} is zero"
        torch.testing.assert_close(c_grads[name], g, rtol=1e-4, atol=1e-6, msg=lambda m: f"grad {name}: {m}")
    for a, b in zip(c_losses, losses):
        assert abs(a - b) < 1e-4 * abs(b), (c_losses, losses)


def test_inductor_cache_dir_defaults_to_ours_and_respects_the_user(monkeypatch, tmp_path):
    from torch._inductor.runtime.cache_dir_utils import cache_dir, default_cache_dir

    from train.parallel.compile import inductor_cache_dir

    ours = Path(os.environ["XDG_CACHE_HOME"]) / "hopper-train" / "inductor"  # conftest's XDG_CACHE_HOME
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert inductor_cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    assert inductor_cache_dir() == ours and cache_dir() == str(ours)
    # Inductor writes its /tmp default into the variable when asked first: not a user choice.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    assert inductor_cache_dir() == ours and cache_dir() == str(ours)


def test_activation_memory_budget_is_set_per_job_not_left_behind(monkeypatch, tmp_path):
    """torch's setting is process-wide: each job's compile sets it, 1.0 included."""
    import torch._functorch.config as functorch_config
    from torch import nn

    from train.parallel.compile import apply_compile
    from train.parallel.config import ParallelConfig

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    model = nn.Module()
    model.layers = nn.ModuleDict({"0": nn.Linear(4, 4)})
    with functorch_config.patch(activation_memory_budget=1.0):  # torch's own save/restore
        for budget in (0.5, 1.0):
            pcfg = ParallelConfig(compile=True, compile_backend="aot_eager", activation_memory_budget=budget)
            assert apply_compile(model, pcfg) == 1
            assert functorch_config.activation_memory_budget == budget
