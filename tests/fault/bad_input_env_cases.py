"""The bad-input table, ``train``: what the environment and the cache hold (launcher variables
for ``train preflight`` too, Inductor's cache directory, the embedded corpus cache), and a
config section that is not a mapping under an override."""

from __future__ import annotations

from bad_input_cases import TINY, T

ENV_CASES = [
    T("world-size-long", "WORLD_SIZE of 8 digits (was called not an integer)", ["run"], 2,
      "WORLD_SIZE='12345678': more than 9999999 processes", env=[("WORLD_SIZE", "12345678")]),
    T("preflight-rank-beyond-world", "train preflight with RANK=5 of WORLD_SIZE=2 (it waited for the rendezvous, "
      "then blamed the node: exit 4)", ["preflight", "--timeout", "5"], 2, "RANK=5 is not below WORLD_SIZE=2",
      env=[("WORLD_SIZE", "2"), ("RANK", "5"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1"),
           ("MASTER_PORT", "29599")]),
    T("inductor-cache-env-system", "TORCHINDUCTOR_CACHE_DIR=/etc/...: compiled kernels were written into /etc",
      ["run", *TINY, "--set", "parallel.compile=true"], 2,
      "environment TORCHINDUCTOR_CACHE_DIR '/etc/hopper-train-inductor' is a system directory",
      env=[("TORCHINDUCTOR_CACHE_DIR", "/etc/hopper-train-inductor")]),
    T("triton-cache-env-system", "TRITON_CACHE_DIR=/etc/... when compiling (Triton writes its kernels there)",
      ["run", *TINY, "--set", "parallel.compile=true"], 2,
      "environment TRITON_CACHE_DIR '/etc/hopper-train-triton' is a system directory",
      env=[("TRITON_CACHE_DIR", "/etc/hopper-train-triton")]),
    T("cache-corpus-fifo", "data.cache_dir whose embedded corpus file is a FIFO (the memory map hung)",
      ["run", *TINY, "--set", "data.cache_dir={corpus_fifo}"], 2, "stdlib-bytes-8mb.bin' is a FIFO, not an embedded corpus"),
    T("cache-corpus-odd", "data.cache_dir whose embedded corpus file has 3 bytes (a numpy traceback)",
      ["run", *TINY, "--set", "data.cache_dir={corpus_odd}"], 2, "stdlib-bytes-8mb.bin' is 3 bytes, not an embedded corpus"),
    T("trace-steps-unicode", "metrics.trace_steps in Arabic-Indic digits (int() read them as 1:2)",
      ["run", "--set", "metrics.trace_steps=\u0661:\u0662"], 2, "expected integers A:B (ASCII digits)"),
    T("yaml-section-list-with-set", "--config whose train: is a list, with --steps (the file's train: was dropped unread)",
      ["run", "--config", "{section_list_yaml}", "--steps", "3"], 2, "train: expected a mapping, got list"),
]
