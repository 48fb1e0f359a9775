"""The bad-input table, sizes: a model or a step that no memory holds, or that would run for
days, is refused before anything is allocated (exit 2, train/preflight.py); what passes
those checks and still does not fit ends as one line at the allocation (exit 1)."""

from __future__ import annotations

from bad_input_cases import T

SYNTH = ("--set", "data.source=synthetic", "--set", "train.steps=2", "--set", "metrics.progress=false")

SIZE_CASES = [
    T("model-huge", "model.dim=67108864 (far beyond any memory and address space)",
      ["run", "--set", "model.dim=67108864", *SYNTH, "--out", "{tmp}/huge-run"], 2,
      "model.dim=67108864"),
    T("model-dim-int32", "model.dim=2147483648: weight sizes overflow torch's storage size",
      ["run", "--set", "model.dim=2147483648", *SYNTH, "--out", "{tmp}/huge-run"], 2, "model.dim=2147483648"),
    T("model-layers-huge", "model.n_layers=65537 small layers: 14B parameters, built one by one for minutes",
      ["run", "--set", "model.n_layers=65537", *SYNTH, "--out", "{tmp}/huge-run"], 2, "model.n_layers=65537"),
    T("model-layers-int32", "model.n_layers=2147483648",
      ["run", "--set", "model.n_layers=2147483648", *SYNTH, "--out", "{tmp}/huge-run"], 2,
      "model.n_layers=2147483648"),
    T("model-ffn-huge", "model.multiple_of=2147483648 rounds the FFN up to 2^31",
      ["run", "--set", "model.multiple_of=2147483648", *SYNTH, "--out", "{tmp}/huge-run"], 2, "FFN hidden 2147483648"),
    T("global-batch-huge", "train.global_batch_size=2147483648: 134M micro-batches per step",
      ["run", "--set", "train.global_batch_size=2147483648", *SYNTH, "--out", "{tmp}/huge-run"], 2,
      "train.global_batch_size: 2147483648 needs 134217728 micro-batches"),
    T("oom-at-build", "a 2^34-token sequence: its RoPE table alone is 2 TiB (passes the checks, fits no host)",
      ["run", "--set", "model.max_seq_len=17179869184", "--set", "train.seq_len=17179869184",
       "--set", "train.batch_size=1", *SYNTH, "--out", "{tmp}/huge-run"], 1,
      "out of memory on rank 0 (cpu) while building the model"),
]
