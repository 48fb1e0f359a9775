"""What the bad-input cases run against: the files their {placeholders} name (and an
earlier run every ``train`` case points --out at), the snapshot that proves no file was
touched, and the per-case deadline."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import stat
from pathlib import Path

from bad_input_cases import Case
from bad_input_data import BOMB_YAML, DATA_FILES

CASE_TIMEOUT_S = 60  # per case: a hang (alias bomb, FIFO read, peers that never come) fails the case


def fixtures(tmp: Path) -> dict[str, str]:
    """Files the cases refer to, plus an existing run (``run``) every train case
    points --out at unless it names its own: it must come through untouched."""
    return {**_config_files(tmp), **_token_files(tmp), **_run_dirs(tmp)}


def _config_files(tmp: Path) -> dict[str, str]:
    (tmp / "bad.yaml").write_text("train:\n  steps: [1, 2\n")
    (tmp / "list.yaml").write_text("- a\n- b\n")
    (tmp / "evil.yaml").write_text('model: !!python/object/apply:os.system ["touch PWNED"]\n')
    (tmp / "binary.yaml").write_bytes(b"\xff\xfe\x00\x81garbage")
    (tmp / "unknown.yaml").write_text("train:\n  bogus: 1\n")
    (tmp / "bomb.yaml").write_text(BOMB_YAML)
    (tmp / "deep.yaml").write_text("a: " + "[" * 10000 + "]" * 10000 + "\n")
    (tmp / "huge.yaml").write_text("# " + "x" * (2 << 20) + "\n")
    (tmp / "dupkey.yaml").write_text("train:\n  steps: 1\n  steps: 2\n")
    (tmp / "recursive.yaml").write_text("a: &a [*a]\n")
    os.mkfifo(tmp / "fifo.yaml")
    (tmp / "adir").mkdir()
    (tmp / "badtok").mkdir()
    (tmp / "badtok" / "tokenizer.json").write_text('{"model": "not a tokenizer"}\n')
    (tmp / "afile").write_text("not a directory\n")
    (tmp / "long_int.yaml").write_text("train:\n  steps: " + "9" * 5000 + "\n")
    (tmp / "bad_date.yaml").write_text("train:\n  seed: 2026-13-45\n")
    (tmp / "dir.prom").mkdir()
    (tmp / "dir.yaml").mkdir()
    (tmp / "link.sh").symlink_to(tmp / "afile")
    (tmp / "dangling").symlink_to(tmp / "nowhere")
    (tmp / "etc_link").symlink_to("/etc")
    generic = (Path(__file__).resolve().parents[2] / "core" / "profiles" / "generic.yaml").read_text()
    profiles = {"ifs_profile": ("OMP_NUM_THREADS:", "IFS:"), "copy_profile": ("", ""), "int_key_profile": ("OMP_NUM_THREADS:", "1:"),
                "nul_env_profile": ('value: "4"', 'value: "4\\0x"'),
                "huge_gpus_profile": ("gpus_per_node: 8", "gpus_per_node: 99999999999999999999"),
                "octal_gpus_profile": ("gpus_per_node: 8", "gpus_per_node: 010"),
                "node_selector_profile": ("notes:", 'k8s:\n  node_selector:\n    "bad key!": "v v"\nnotes:'),
                "long_selector_profile": ("notes:", "k8s:\n  node_selector:\n    " + "a" * 64 + ": v\nnotes:")}
    for name, (old, new) in profiles.items():
        (tmp / f"{name}.yaml").write_text(generic.replace(old, new))
    infiniband = (Path(__file__).resolve().parents[2] / "core" / "fabrics" / "infiniband.yaml").read_text()
    (tmp / "long_rdma_fabric.yaml").write_text(infiniband.replace("name: rdma/ib", "name: rdma/" + "a" * 70))
    (tmp / "int_key.yaml").write_text("train:\n  1: 2\n")
    (tmp / "octal.yaml").write_text("train:\n  steps: 010\n")
    (tmp / "number_text.yaml").write_text("data:\n  tokenizer: 2024.10\n")
    (tmp / "section_list.yaml").write_text("train: [steps, 2]\n")
    (tmp / "points.yaml").write_text("- {}\n" * 1001)  # 1001 one-point grids
    return {"etc_link": str(tmp / "etc_link"), **{name: str(tmp / f"{name}.yaml") for name in profiles},
            "int_key_yaml": str(tmp / "int_key.yaml"), "long_rdma_fabric": str(tmp / "long_rdma_fabric.yaml"), "octal_yaml": str(tmp / "octal.yaml"),
            "number_text_yaml": str(tmp / "number_text.yaml"),
            "section_list_yaml": str(tmp / "section_list.yaml"),
            "points_yaml": str(tmp / "points.yaml"),
            "tmp": str(tmp), "dir": str(tmp / "adir"), "badtok_dir": str(tmp / "badtok"), "afile": str(tmp / "afile"),
            "bad_yaml": str(tmp / "bad.yaml"), "list_yaml": str(tmp / "list.yaml"), "evil_yaml": str(tmp / "evil.yaml"),
            "binary_yaml": str(tmp / "binary.yaml"), "unknown_key_yaml": str(tmp / "unknown.yaml"),
            "bomb_yaml": str(tmp / "bomb.yaml"), "deep_yaml": str(tmp / "deep.yaml"), "huge_yaml": str(tmp / "huge.yaml"),
            "dupkey_yaml": str(tmp / "dupkey.yaml"), "recursive_yaml": str(tmp / "recursive.yaml"),
            "long_int_yaml": str(tmp / "long_int.yaml"), "bad_date_yaml": str(tmp / "bad_date.yaml"),
            "prom_dir": str(tmp / "dir.prom"), "yaml_dir": str(tmp / "dir.yaml"),
            "fifo": str(tmp / "fifo.yaml"), "symlink": str(tmp / "link.sh"), "dangling": str(tmp / "dangling")}


def _token_files(tmp: Path) -> dict[str, str]:
    import numpy as np

    (tmp / "truncated.bin").write_bytes(b"\x01\x00" * 500 + b"\x07")
    (tmp / "truncated.json").write_text(json.dumps({"dtype": "uint16", "vocab_size": 256}))
    np.arange(1000, dtype=np.uint16).tofile(tmp / "short.bin")
    (tmp / "short.json").write_text(json.dumps({"dtype": "uint16", "vocab_size": 256, "num_tokens": 5000}))
    np.arange(1000, dtype=np.uint16).tofile(tmp / "nometa.bin")
    np.arange(5000, dtype=np.uint16).tofile(tmp / "bigvocab.bin")
    (tmp / "bigvocab.json").write_text(json.dumps({"dtype": "uint16", "vocab_size": 50257}))
    (np.arange(5000) % 256).astype(np.uint16).tofile(tmp / "tokmeta.bin")
    (tmp / "tokmeta.json").write_text(json.dumps({"dtype": "uint16", "vocab_size": 256, "num_tokens": 5000,
                                                  "tokenizer": {"name": "gpt2", "sha256": "ab" * 32}}))
    for name in ("corpus_fifo", "corpus_odd"):  # data.cache_dir holding a bad embedded corpus cache
        (tmp / name).mkdir()
    os.mkfifo(tmp / "corpus_fifo" / "stdlib-bytes-8mb.bin")  # data.embedded_mb's default
    (tmp / "corpus_odd" / "stdlib-bytes-8mb.bin").write_bytes(b"abc")
    paths = {"corpus_fifo": str(tmp / "corpus_fifo"), "corpus_odd": str(tmp / "corpus_odd"),
             "tokmeta_bin": str(tmp / "tokmeta.bin"), "truncated_bin": str(tmp / "truncated.bin"), "short_bin": str(tmp / "short.bin"),
             "nometa_bin": str(tmp / "nometa.bin"), "bigvocab_bin": str(tmp / "bigvocab.bin")}
    for i, (_, _, (dtype, values), meta) in enumerate(DATA_FILES):
        np.asarray(values, dtype=dtype).tofile(tmp / f"data{i}.bin")
        (tmp / f"data{i}.json").write_text(meta)
        paths[f"data_{i}"] = str(tmp / f"data{i}.bin")
    return paths


def _run_dirs(tmp: Path) -> dict[str, str]:
    """Earlier runs with a (garbage) step-2 checkpoint, and run directories with odd locks."""
    runs = {}
    for name in ("run", "busy_run", "remote_run", "garbage_run"):
        run = tmp / name
        ckpt = run / "checkpoints" / "step_00000002"
        ckpt.mkdir(parents=True)
        (run / "config.yaml").write_text("# an earlier run\n" if name != "garbage_run" else "train: [1, 2\n")
        (run / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n{"step": 2, "loss": 4.0}\n')
        files = {".metadata": b"\x80garbage-metadata", "__0_0.distcp": os.urandom(4096), "extra_rank0.pt": b"junk"}
        for fname, data in files.items():
            (ckpt / fname).write_bytes(data)
        (ckpt / "manifest.json").write_text(json.dumps(
            {"step": 2, "world_size": 1, "files": {n: len(d) for n, d in files.items()}}))
        (run / "checkpoints" / "latest").write_text("step_00000002\n")
        runs[name] = str(run)
    for name in ("fifo_lock_run", "link_lock_run"):
        (tmp / name).mkdir()
        runs[name] = str(tmp / name)
    for name in ("ckfile_run", "metricsdir_run"):  # a run entry of the wrong kind
        (tmp / name).mkdir()
        runs[name] = str(tmp / name)
    (tmp / "ckfile_run" / "checkpoints").write_text("not a directory\n")
    (tmp / "metricsdir_run" / "metrics.jsonl").mkdir()
    os.mkfifo(tmp / "fifo_lock_run" / ".train.lock")
    (tmp / "link_lock_run" / ".train.lock").symlink_to(tmp / "afile")
    # a run directory whose lock names a run on another host (a shared file system without coherent flock)
    (tmp / "remote_run" / ".train.lock").write_text(json.dumps({"host": "node-elsewhere", "pid": 4242}))
    (tmp / "busy_run" / ".train.lock").write_text(json.dumps({"host": "this-test", "pid": os.getpid()}))
    return runs


def resolve(case: Case, paths: dict[str, str]) -> tuple[list[str], str]:
    def fill(text: str) -> str:  # {placeholder} -> file; other braces (YAML flow mappings) stay
        return re.sub(r"\{(\w+)\}", lambda m: paths.get(m.group(1), m.group(0)), text)

    argv = [fill(a) for a in case.argv]
    if case.tool == "train" and case.argv[0] == "run" and "--out" not in argv:
        argv += ["--out", paths["run"]]
    return argv, fill(case.names)


def snapshot(root: Path) -> dict[str, str]:
    """Every entry under ``root``: content hash and mode of files, target of links, kind of
    the rest (FIFOs are never opened)."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        if stat.S_ISREG(st.st_mode):
            out[str(p.relative_to(root))] = f"{hashlib.sha256(p.read_bytes()).hexdigest()} {st.st_mode:o}"
        elif stat.S_ISLNK(st.st_mode):
            out[str(p.relative_to(root))] = f"-> {os.readlink(p)}"
        elif not stat.S_ISDIR(st.st_mode):
            out[str(p.relative_to(root))] = f"special {st.st_mode:o}"
    return out


class CaseTimeout(Exception):
    pass


@contextlib.contextmanager
def deadline(seconds: int):
    def expire(signum, frame):
        raise CaseTimeout(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
