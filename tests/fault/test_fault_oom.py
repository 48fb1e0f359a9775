"""A run that passes every check before it starts and still does not fit: one line naming the
sizes, exit 1, no traceback; the run directory keeps what it had (its config and metrics)."""

from __future__ import annotations

from testlib import train_cli

# a 4M-token vocabulary on a tiny model: 0.13B parameters (preflight passes), but the eager
# loss's logits at the first step are 256 x 256 x 4M fp32 = 1 TiB, more than any CI host
SETS = ["model.vocab_size=4194304", "model.dim=16", "train.batch_size=256", "train.seq_len=256",
        "train.loss=eager", "data.source=synthetic", "train.steps=2", "metrics.progress=false"]


def test_out_of_memory_at_a_step_is_one_line_exit_1(tmp_path):
    out = tmp_path / "run"
    r = train_cli(["run", *[a for kv in SETS for a in ("--set", kv)], "--out", str(out)], timeout=240)
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert errors[0].startswith("error: out of memory on rank 0 (cpu) at step 1: "), errors[0]
    for name in ("model.vocab_size=4194304", "train.batch_size=256", "train.seq_len=256"):
        assert name in errors[0], (name, errors[0])
    assert (out / "config.yaml").is_file() and (out / "metrics.jsonl").is_file()
