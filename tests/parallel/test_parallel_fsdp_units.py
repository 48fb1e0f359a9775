"""FSDP2's units gather what each pass needs: the embedding's weight is freed after forward
in every ``reshard_after_forward`` mode and never gathered for backward (its backward reads
only token ids and the output gradient); ``never`` keeps the blocks gathered through
backward, ``auto`` gathers every block but the last again. Real gloo ranks on the CPU; the
gradients these runs produce equal DDP's (tests/parallel/test_parallel_equivalence.py)."""

from __future__ import annotations

import pytest

from testlib import FSDP, gloo_runs, load_job, rank0_result


def _gathers(trainer) -> dict:
    """Which units issue an all-gather in forward and in backward of one step, and whether
    the embedding's weight is resharded (a DTensor) when forward is done."""
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup  # test-only: count gathers
    from torch.distributed.tensor import DTensor

    seen: dict[str, list[str]] = {"FORWARD": [], "PRE_BACKWARD": []}
    orig = FSDPParamGroup.unshard

    def unshard(self, *args, **kwargs):
        before = self._all_gather_result
        orig(self, *args, **kwargs)
        if self._all_gather_result is not None and self._all_gather_result is not before:
            seen.setdefault(self._training_state.name, []).append(self._module_fqn)

    model = trainer.par.model
    state = {}

    def after_forward(module, args, output):
        state["embedding_resharded"] = isinstance(module.tok_embeddings.weight, DTensor)
        state["block_resharded"] = isinstance(next(iter(module.layers.values())).attention.wq.weight, DTensor)

    handle = model.register_forward_hook(after_forward)
    FSDPParamGroup.unshard = unshard
    try:
        trainer.train_step()
    finally:
        FSDPParamGroup.unshard = orig
        handle.remove()
    return {"forward": seen["FORWARD"], "backward": seen["PRE_BACKWARD"], **state}


@pytest.mark.parametrize("mode", ["never", "auto"])
def test_embedding_is_not_gathered_for_backward(tmp_path, mode):
    job = load_job(FSDP + [f"parallel.reshard_after_forward={mode}", "train.steps=1"])
    got = rank0_result(gloo_runs, tmp_path, 2, {"run": job}, _gathers)["run"]
    n = job.model.n_layers
    assert "tok_embeddings" in got["forward"], got
    assert got["embedding_resharded"], got
    assert not any(fqn == "tok_embeddings" for fqn in got["backward"]), got
    if mode == "never":
        assert got["backward"] == [] and not got["block_resharded"], got
    else:
        assert sorted(got["backward"]) == sorted(f"layers.{i}" for i in range(n - 1)), got
        assert got["block_resharded"], got
