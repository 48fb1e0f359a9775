"""The bad-input table, sizes: a model or a step that no memory holds, or that would run for
days, is refused before anything is allocated (exit 2, train/preflight.py). What passes
those checks and still does not fit ends as one line at the allocation (exit 1):
tests/fault/test_fault_oom.py."""

from __future__ import annotations

from bad_input_cases import T


def R(id, what, sets, code, names):  # noqa: N802 - table shorthand: `train run` of a few steps with `sets`
    argv = ["run", *[arg for kv in sets for arg in ("--set", kv)], "--set", "data.source=synthetic",
            "--set", "train.steps=2", "--set", "metrics.progress=false", "--out", "{tmp}/huge-run"]
    return T(id, what, argv, code, names)


SIZE_CASES = [
    R("model-huge", "model.dim=67108864 (far beyond any memory and address space)",
      ["model.dim=67108864"], 2, "model.dim=67108864"),
    R("model-dim-int32", "model.dim=2147483648: weight sizes overflow torch's storage size",
      ["model.dim=2147483648"], 2, "model.dim=2147483648"),
    R("model-layers-huge", "model.n_layers=65537 small layers: 14B parameters, built one by one for minutes",
      ["model.n_layers=65537"], 2, "model.n_layers=65537"),
    R("model-layers-int32", "model.n_layers=2147483648", ["model.n_layers=2147483648"], 2, "model.n_layers=2147483648"),
    R("model-ffn-huge", "model.multiple_of=2147483648 rounds the FFN up to 2^31",
      ["model.multiple_of=2147483648"], 2, "FFN hidden 2147483648"),
    R("global-batch-huge", "train.global_batch_size=2147483648: 134M micro-batches per step",
      ["train.global_batch_size=2147483648"], 2, "train.global_batch_size: 2147483648 needs 134217728 micro-batches"),
    R("seq-huge", "a 2^34-token sequence: its RoPE table alone is 2 TiB (fits no host)",
      ["model.max_seq_len=17179869184", "train.seq_len=17179869184", "train.batch_size=1"], 2,
      "train.seq_len=17179869184"),
]
