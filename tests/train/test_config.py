import dataclasses

import pytest

from testlib import train_cli
from train.config import load_config, parse_overrides
from train.errors import ConfigError
from train.models.presets import MODEL_PRESETS
from train.parallel.dims import ParallelDims
from train.preflight import check_job


def test_presets_load_and_match_llama3_8b():
    for name in ("tiny", "debug", "125m", "350m", "1b", "3b", "8b"):
        cfg = load_config(name)
        assert cfg.model.name == name
    m = MODEL_PRESETS["8b"]
    assert (m.dim, m.n_layers, m.n_heads, m.kv_heads, m.hidden_dim, m.vocab_size) == (4096, 32, 32, 8, 14336, 128256)
    d = MODEL_PRESETS["debug"]
    assert (d.dim, d.n_layers, d.n_heads, d.vocab_size) == (256, 6, 16, 2048)


def test_set_overrides_are_typed():
    cfg = load_config("tiny", ["train.batch_size=3", "optim.lr=1e-3", "model.name=debug", "parallel.compile=true"])
    assert cfg.train.batch_size == 3 and isinstance(cfg.optim.lr, float)
    assert cfg.model.dim == 256  # preset applied before field overrides
    assert cfg.parallel.compile is True
    cfg = load_config("tiny", ["optim.lr=1"])  # int accepted for a float field
    assert cfg.optim.lr == 1.0


@pytest.mark.parametrize("override, culprit", [
    (["train.bogus=1"], "train.bogus"),
    (["bogus.x=1"], "bogus"),
    (["train.batch_size=abc"], "train.batch_size"),
    (["train.batch_size=1.5"], "train.batch_size"),
    (["train.batch_size=0"], "train.batch_size"),
    (["train.steps=-5"], "train.steps"),
    (["train.seq_len=100000"], "train.seq_len"),
    (["model.n_heads=5"], "model.dim"),
    (["model.n_kv_heads=3"], "model.n_kv_heads"),
    (["model.name=70b"], "model.name"),
    (["train.precision=fp64"], "train.precision"),
    (["optim.lr=0"], "optim.lr"),
    (["parallel.compile=maybe"], "parallel.compile"),
    (["train=3"], "train"),
    (["noequals"], "noequals"),
    (["comm.hook=powersgd", "parallel.strategy=fsdp", "parallel.dp_shard=-1", "parallel.dp_replicate=1"],
     "comm.hook"),
])
def test_bad_values_name_the_key(override, culprit):
    with pytest.raises(ConfigError) as err:
        load_config("tiny", override)
    assert culprit in str(err.value)


def test_parse_overrides_nested():
    assert parse_overrides(["a.b=3", "a.c=x", "d=[1, 2]"]) == {"a": {"b": 3, "c": "x"}, "d": [1, 2]}


def test_mesh_and_batch_checks_need_no_process_group():
    cfg = load_config("tiny", ["parallel.strategy=fsdp", "parallel.dp_shard=2", "parallel.dp_replicate=1"])
    with pytest.raises(ConfigError, match="does not match world size 4"):
        ParallelDims.resolve(cfg.parallel, 4, cfg.model)
    dims = ParallelDims.resolve(cfg.parallel, 2, cfg.model)
    assert dims.shape == (1, 2, 1) and (dims.dp, dims.fsdp_enabled, dims.tp_enabled) == (2, True, False)
    tp = dataclasses.replace(cfg.parallel, tp=3, dp_shard=-1)
    with pytest.raises(ConfigError, match="parallel.tp"):
        ParallelDims.resolve(tp, 3, cfg.model)
    cfg = load_config("tiny", ["train.global_batch_size=10", "train.batch_size=4"])
    with pytest.raises(ConfigError, match="global_batch_size"):
        check_job(cfg, 2)
    check_job(load_config("tiny", ["train.global_batch_size=16", "train.batch_size=4"]), 2)


def test_preflight_sizes_params_against_the_whole_device_and_shards_with_fsdp(monkeypatch):
    """check_fits: this rank's fp32 parameters against all of its device's memory (here a pretend
    1 GiB host); FSDP divides by the shard ranks, DDP does not. The micro-batch bound too."""
    from train import preflight

    monkeypatch.setattr(preflight, "device_memory", lambda job: ("a 1 GiB host", 2**30))
    big = ["model.n_layers=2000", "train.device=cpu"]  # 2000 x 213k + 66k = 426M params, 1.589 GiB fp32
    with pytest.raises(ConfigError, match=r"model.n_layers=2000.*1.589 GiB in fp32 on each rank, more than all 1 GiB"):
        check_job(load_config("tiny", big), 2)
    check_job(load_config("tiny", big + ["parallel.strategy=fsdp"]), 2)  # 0.79 GiB each
    with pytest.raises(ConfigError, match=r"\(sharded 2 ways\)"):
        check_job(load_config("tiny", ["model.n_layers=5000", "train.device=cpu", "parallel.strategy=fsdp"]), 2)
    # the RoPE table (4 x seq x head_dim) and one micro-batch's bf16 hidden states (2 x b x seq x dim)
    long = ["train.device=cpu", "model.max_seq_len=4194304", "train.seq_len=4194304"]  # 0.5 + 1 GiB at b=1
    with pytest.raises(ConfigError, match=r"train.seq_len=4194304 with train.batch_size=1 .*RoPE table \(0.5 GiB\)"
                       r" and one micro-batch's hidden states \(1 GiB\)"):
        check_job(load_config("tiny", long + ["train.batch_size=1"]), 1)
    check_job(load_config("tiny", long[:1] + ["model.max_seq_len=1048576", "train.seq_len=1048576",
                                               "train.batch_size=1"]), 1)  # 0.375 GiB
    accum = ["train.batch_size=1", f"train.global_batch_size={2 * (preflight.MAX_ACCUM + 1)}"]
    with pytest.raises(ConfigError, match=f"needs {preflight.MAX_ACCUM + 1} micro-batches"):
        check_job(load_config("tiny", accum), 2)
    check_job(load_config("tiny", ["train.batch_size=1", f"train.global_batch_size={2 * preflight.MAX_ACCUM}"]), 2)


def test_cli_config_error_is_one_line_exit_2(tmp_path):
    out = tmp_path / "run"
    res = train_cli(["run", "--out", str(out), "--set", "train.batch_size=0"])
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert lines == ["error: train.batch_size: must be > 0, got 0"], res.stderr
    assert not out.exists()


def test_cli_malformed_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: {steps: [1,\n")
    res = train_cli(["run", "--config", str(bad), "--out", str(tmp_path / "o")])
    assert res.returncode == 2 and "malformed YAML" in res.stderr and "Traceback" not in res.stderr
    res = train_cli(["run", "--config", str(tmp_path / "nope.yaml"), "--out", str(tmp_path / "o")])
    assert res.returncode == 2 and "no such file or preset" in res.stderr


def test_cli_world_size_mismatch_rejected_before_process_group(tmp_path):
    res = train_cli(["run", "--out", str(tmp_path / "o"), "--set", "parallel.strategy=fsdp",
                     "--set", "parallel.dp_shard=4", "--set", "parallel.dp_replicate=1"],
                    extra_env={"WORLD_SIZE": "2", "RANK": "0"})
    assert res.returncode == 2 and "does not match world size 2" in res.stderr, res.stderr


@pytest.mark.parametrize("where", ["/tmp", "/tmp/corpus-cache", "/dev/shm/cache", "/run/user/1000", "/var/tmp/x"])
def test_a_cache_dir_in_scratch_space_is_accepted(where):
    """One cache file goes there: /tmp and the memory file systems are ordinary places for it."""
    assert load_config("tiny", [f"data.cache_dir={where}"]).data.cache_dir == where


@pytest.mark.parametrize("where", ["/", "/etc", "/usr/lib/x", "/proc/self", "/dev", "/sys/x"])
def test_a_cache_dir_in_a_system_directory_is_refused(where):
    with pytest.raises(ConfigError, match="data.cache_dir: .* is a system directory"):
        load_config("tiny", [f"data.cache_dir={where}"])


@pytest.mark.parametrize(("item", "key", "text"), [
    ("data.tokenizer=12345678", "tokenizer", "12345678"),  # a sha256 prefix of digits only
    ("data.path=2024.10", "path", "2024.10"),  # not the float 2024.1
    ("data.cache_dir=2024", "cache_dir", "2024"),
    ("data.tokenizer=yes", "tokenizer", "yes"),
])
def test_a_text_field_set_from_the_command_line_keeps_the_text_as_typed(item, key, text):
    """--set gives a text field what was typed, where YAML would read a number, a date or a
    boolean; number fields still get numbers."""
    job = load_config("tiny", [item, "train.steps=12"])
    assert getattr(job.data, key) == text and job.train.steps == 12
    assert load_config("tiny", ["metrics.wandb_project=2026-01-01"]).metrics.wandb_project == "2026-01-01"
