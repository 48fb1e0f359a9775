"""The bad-input table, benchmarks: ``train bench step``, ``comm`` and ``compression`` check
what ``train run`` checks of a job (launcher environment, device, data, metric files) and
their own options before any process group, report or run directory exists (exit 2)."""

from __future__ import annotations

from bad_input_cases import T

STEP = ("bench", "step", "--preset", "tiny", "--steps", "1", "--warmup", "0", "--out", "{tmp}/bench")
# a two-rank launcher environment that passes check_launcher_env (nothing listens: no case gets that far)
TWO = (("WORLD_SIZE", "2"), ("RANK", "0"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1"),
       ("MASTER_PORT", "29599"))
EIGHT = (("WORLD_SIZE", "8"), *TWO[1:])
COMM = ("bench", "comm", "--backend", "gloo", "--no-p2p", "--out", "{tmp}/comm")
COMPRESSION = ("bench", "compression", "--preset", "tiny", "--steps", "4", "--variants", "none",
               "--out", "{tmp}/comp")

BENCH_CASES = [
    T("bench-step-device-cuda", "bench step --device cuda without a GPU (was a traceback)",
      [*STEP, "--device", "cuda"], 2, "--device cuda: no CUDA GPU"),
    T("bench-step-rank-word", "bench step under RANK=abc (was an int() traceback)", [*STEP], 2,
      "environment RANK='abc'", env=(("RANK", "abc"),)),
    T("bench-step-world-no-rank", "bench step under WORLD_SIZE=2 alone (was a traceback, or a wait)", [*STEP], 2,
      "WORLD_SIZE=2 without RANK", env=(("WORLD_SIZE", "2"),)),
    T("bench-step-set-owned", "--set of a key a grid option sets (the row said batch 1, the run used 3)",
      [*STEP, "--batch", "1", "--set", "train.batch_size=3"], 2, "--set 'train.batch_size': set by --batch"),
    T("bench-step-set-device", "--set train.device against --device", [*STEP, "--set", "train.device=cpu"], 2,
      "--set 'train.device': set by --device"),
    T("bench-step-plan-total", "--plan of 1001 one-point grids (the limit was per grid)",
      [*STEP, "--plan", "{points_yaml}"], 2, "more than 1000 points in all"),
    T("bench-step-cache-in-run", "data.cache_dir inside another run's checkpoints/ (16 MB were written there)",
      [*STEP, "--data", "embedded", "--set", "data.cache_dir={run}/checkpoints"], 2, "data.cache_dir"),
    T("bench-step-prom-dir", "metrics.prometheus_file naming a directory", [*STEP, "--set",
                                                                             "metrics.prometheus_file={prom_dir}"],
      2, "metrics.prometheus_file"),
    T("bench-step-data-missing", "a token file that does not exist (was an error row and exit 0)",
      [*STEP, "--data", "file", "--set", "data.path={tmp}/none.bin"], 2, "data.path"),
    T("bench-comm-max-seconds-inf", "--max-seconds 1e308 (was an OverflowError on every rank)",
      [*COMM, "--max-seconds", "1e308"], 2, "--max-seconds in (0, 3600.0]"),
    T("bench-comm-min-bytes-empty", "--min-bytes '' (the default was used)", [*COMM, "--min-bytes", ""], 2,
      "not a size: ''"),
    T("bench-comm-name-p2p", "--name of 97 characters: NAME_p2p is too long (found after the sweep)",
      ["bench", "comm", "--out", "{tmp}/comm", "--name", "n" * 97], 2, "at most 96 characters here"),
    T("bench-comm-apply-own-report", "--apply naming the run's own report (found after the sweep)",
      [*COMM, "--apply", "{tmp}/comm/comm.json"], 2, "that is this run's own report"),
    T("bench-comm-rank-word", "bench comm under RANK=abc (was an int() traceback)", [*COMM], 2,
      "environment RANK='abc'", env=(("WORLD_SIZE", "2"), ("RANK", "abc"))),
    T("bench-comm-nccl-no-gpu", "--backend nccl without a GPU (was exit 1 naming train.device)",
      ["bench", "comm", "--backend", "nccl", "--no-p2p", "--out", "{tmp}/comm"], 2, "--backend nccl", env=TWO),
    T("bench-comm-size-host",
      "64 GiB messages, 8 processes on one host: their buffers exceed its memory (was a traceback)",
      [*COMM, "--min-bytes", "64G", "--max-bytes", "64G"], 2, "the largest message needs about", env=EIGHT),
    T("bench-compression-set-owned", "--set train.steps against --steps (the timing window was empty, exit 0)",
      [*COMPRESSION, "--set", "train.steps=2"], 2, "--set 'train.steps'", env=TWO),
    T("bench-compression-cache-in-run", "data.cache_dir inside another run's checkpoints/",
      [*COMPRESSION, "--set", "data.source=embedded", "--set", "data.cache_dir={run}/checkpoints"], 2,
      "data.cache_dir", env=TWO),
]
