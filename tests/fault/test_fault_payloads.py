"""No code runs from a file the project reads back. Each test plants a pickle (or YAML) payload
that would create a marker file when deserialised the unsafe way - and otherwise returns the
real content, so an unsafe load would go unnoticed - in one file a job reads back (a
checkpoint's DCP metadata, a DCP non-tensor entry, per-rank state, token-file metadata,
recorded config, data-prepare metadata), then runs the real code path and checks that the
marker is absent and the payload was named or refused."""

from __future__ import annotations

import io
import json
import logging
import pickle
import re
import shutil
from pathlib import Path

import pytest
import torch

from testlib import SMALL_RUN, train_cli, trained_tiny_llama
from train.checkpoint import CheckpointManager
from train.checkpoint import safe_load as dcp_safe
from train.distributed import DistInfo
from train.errors import CheckpointError

ONE = DistInfo(0, 0, 1, torch.device("cpu"), None)


class _Payload:
    """Unpickles (the unsafe way) as: create ``marker``, then return ``value``."""

    def __init__(self, marker: Path, value):
        self.marker, self.value = marker, value

    def __reduce__(self):
        code = (f"__import__('pathlib').Path({str(self.marker)!r}).write_text('ran') and "
                f"__import__('pickle').loads({pickle.dumps(self.value)!r})")
        return (eval, (code,))




def _fix_manifest(ckpt: Path) -> None:
    """Record the planted files' sizes, so only the payload is wrong with the checkpoint."""
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"] = {p.name: p.stat().st_size for p in ckpt.iterdir() if p.name != "manifest.json"}
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


def plant_metadata(ckpt: Path, marker: Path) -> None:
    real = dcp_safe.load_metadata(ckpt / ".metadata")
    (ckpt / ".metadata").write_bytes(pickle.dumps(_Payload(marker, real)))
    _fix_manifest(ckpt)


def plant_nested_metadata(ckpt: Path, marker: Path) -> None:
    """The payload deep inside otherwise real metadata (planner data)."""
    real = dcp_safe.load_metadata(ckpt / ".metadata")
    real.planner_data = {"x": _Payload(marker, 1)}
    (ckpt / ".metadata").write_bytes(pickle.dumps(real))
    _fix_manifest(ckpt)


def plant_bytes_entry(ckpt: Path, marker: Path) -> None:
    """A non-tensor DCP entry (an optimizer's lr) replaced by a torch.save'd payload returning the real value."""
    meta = dcp_safe.load_metadata(ckpt / ".metadata")
    key = next(k for k, v in meta.state_dict_metadata.items() if isinstance(v, dcp_safe.dcp.BytesStorageMetadata)
               and k.endswith(".lr"))
    index, info = next((i, s) for i, s in meta.storage_data.items() if i.fqn == key)
    shard = ckpt / info.relative_path
    with open(shard, "rb") as fh:
        fh.seek(info.offset)
        real = torch.load(io.BytesIO(fh.read(info.length)), weights_only=True)
    blob = io.BytesIO()
    torch.save(_Payload(marker, real), blob)
    info.offset, info.length = shard.stat().st_size, len(blob.getvalue())
    with open(shard, "ab") as fh:
        fh.write(blob.getvalue())
    (ckpt / ".metadata").write_bytes(pickle.dumps(meta))
    _fix_manifest(ckpt)


def plant_extra(ckpt: Path, marker: Path) -> None:
    extra = ckpt / "extra_rank0.pt"
    real = torch.load(extra, weights_only=True)
    torch.save(_Payload(marker, real), extra)
    _fix_manifest(ckpt)


PLANTS = {"metadata": plant_metadata, "metadata_nested": plant_nested_metadata,
          "dcp_bytes_entry": plant_bytes_entry, "per_rank_state": plant_extra}


@pytest.fixture(scope="module")
def _saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("payload") / "checkpoints"
    mgr = CheckpointManager(root, ONE, keep=3)
    for step in (2, 4):
        m, opt = trained_tiny_llama(step)
        mgr.save(step, m, opt, {"step": step})
    return root


@pytest.mark.parametrize("where", list(PLANTS))
def test_payload_in_a_checkpoint_never_runs(_saved, tmp_path, where, caplog):
    root = tmp_path / "checkpoints"
    shutil.copytree(_saved, root)
    marker = tmp_path / "ran"
    PLANTS[where](root / "step_00000004", marker)
    m, opt = trained_tiny_llama(99)
    logger = logging.getLogger("train.checkpoint")
    logger.addHandler(caplog.handler)
    try:
        path, extra = CheckpointManager(root, ONE, keep=3).load_latest(m, opt)
    finally:
        logger.removeHandler(caplog.handler)
    assert not marker.exists(), f"code ran from the planted {where}"
    assert path.name == "step_00000002" and extra["step"] == 2  # the planted one skipped, naming it
    assert "step_00000004" in caplog.text, caplog.text
    if where.startswith("metadata"):
        assert ".metadata" in caplog.text and "builtins.eval" in caplog.text, caplog.text


def test_metadata_reader_refuses_every_global_but_the_checkpoint_types(tmp_path):
    marker = tmp_path / "ran"
    for payload in (_Payload(marker, 1), {"a": [_Payload(marker, 2)]}):
        path = tmp_path / ".metadata"
        path.write_bytes(pickle.dumps(payload))
        with pytest.raises(dcp_safe.UnsafeCheckpoint, match=r"\.metadata: holds builtins\.eval"):
            dcp_safe.load_metadata(path)
    path.write_bytes(pickle.dumps({"plain": 1}))  # harmless, but no metadata
    with pytest.raises(CheckpointError, match="not a torch checkpoint's metadata"):
        dcp_safe.load_metadata(path)
    assert not marker.exists()


class _ByGetattr:
    """Pickles as ``getattr(target, name)``: how Python 3.11.0-3.11.3 pickle an enum member."""

    def __init__(self, target, name):
        self.target, self.name = target, name

    def __reduce__(self):
        return getattr, (self.target, self.name)


def test_metadata_enum_members_by_getattr_load_and_nothing_else_does(tmp_path):
    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING, Metadata

    path = tmp_path / ".metadata"
    member = next(iter(_MEM_FORMAT_ENCODING))
    path.write_bytes(pickle.dumps(Metadata(state_dict_metadata={}, planner_data=_ByGetattr(_MEM_FORMAT_ENCODING,
                                                                                            member.name))))
    assert dcp_safe.load_metadata(path).planner_data is member
    for target, name in ((_MEM_FORMAT_ENCODING, "__init__"), (_MEM_FORMAT_ENCODING, "_missing_"),
                         (Metadata, "__init__"), (_MEM_FORMAT_ENCODING, 7)):
        path.write_bytes(pickle.dumps(Metadata(state_dict_metadata={}, planner_data=_ByGetattr(target, name))))
        with pytest.raises(dcp_safe.UnsafeCheckpoint, match=r"\.metadata: holds getattr\("):
            dcp_safe.load_metadata(path)


def _run(out: Path, *extra: str):
    return train_cli(["run", "--config", "tiny", "--steps", "2", "--out", str(out), "--set", "data.source=synthetic",
                      *SMALL_RUN, "--set", "metrics.progress=false", *extra])


def test_resume_from_a_planted_metadata_is_one_line_and_runs_nothing(tmp_path):
    out = tmp_path / "run"
    first = _run(out)
    assert first.returncode == 0, first.stderr
    ckpt = out / "checkpoints" / "step_00000002"
    marker = tmp_path / "ran"
    plant_metadata(ckpt, marker)
    resumed = _run(out, "--resume", "--steps", "3")
    assert not marker.exists()
    assert resumed.returncode != 0 and "Traceback" not in resumed.stderr, resumed.stderr
    assert ".metadata" in resumed.stderr and "builtins.eval" in resumed.stderr, resumed.stderr


def test_token_file_metadata_and_recorded_files_are_never_unpickled(tmp_path):
    """Token-file metadata (JSON) and a config (YAML) holding a payload: refused as malformed, nothing runs."""
    marker = tmp_path / "ran"
    tokens = tmp_path / "tok.bin"
    tokens.write_bytes(bytes(2 * 4096))
    (tmp_path / "tok.json").write_bytes(pickle.dumps(_Payload(marker, {"dtype": "uint16"})))
    r = train_cli(["run", "--config", "tiny", "--steps", "1", "--out", str(tmp_path / "a"), "--set", "data.source=file",
                   "--set", f"data.path={tokens}"])
    assert r.returncode == 2 and "Traceback" not in r.stderr and "tok.json" in r.stderr, r.stderr
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"train: !!python/object/apply:os.system ['touch {marker}']\n")
    r = train_cli(["run", "--config", str(cfg), "--out", str(tmp_path / "b")])
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert not marker.exists()


class _Py3112Pickler(pickle.Pickler):
    """Pickles an enum member as Python 3.11.2 (Debian 12's python3) does: ``getattr(cls, name)``."""

    def reducer_override(self, obj):
        if isinstance(obj, __import__("enum").Enum):
            return getattr, (type(obj), obj.name)
        return NotImplemented


def _pickle_3112(obj) -> bytes:
    buf = io.BytesIO()
    _Py3112Pickler(buf).dump(obj)
    return buf.getvalue()


def test_metadata_pickled_by_python_3112_loads_and_getattr_stays_closed(tmp_path):
    """Python 3.11.2 writes DCP metadata enums as builtins.getattr(cls, name): the reader
    takes exactly those (an enum member of a checkpoint type), and refuses getattr for anything else."""
    import torch.distributed.checkpoint as dcp

    ckpt = tmp_path / "ckpt"
    dcp.save({"w": torch.ones(3, 2), "lr": 0.5}, checkpoint_id=str(ckpt), no_dist=True)
    real = dcp_safe.load_metadata(ckpt / ".metadata")
    data = _pickle_3112(real)
    assert b"getattr" in data
    (ckpt / ".metadata").write_bytes(data)
    again = dcp_safe.load_metadata(ckpt / ".metadata")
    assert again.state_dict_metadata == real.state_dict_metadata
    state = {"w": torch.zeros(3, 2), "lr": 0.0}
    dcp_safe.load(state, ckpt)
    assert torch.equal(state["w"], torch.ones(3, 2)) and state["lr"] == 0.5
    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING as Encoding

    bad = tmp_path / ".metadata"
    for obj, name, named in ((Encoding, "__class__", "getattr(_MEM_FORMAT_ENCODING, '__class__')"),
                             (Encoding, "_missing_", "getattr(_MEM_FORMAT_ENCODING, '_missing_')"),
                             (torch.Size, "__reduce__", "getattr(Size, '__reduce__')"),
                             (__import__("signal").Signals, "SIGKILL", "signal.Signals"),
                             (Path, "home", "getattr(Path, 'home')")):
        bad.write_bytes(_pickle_getattr(obj, name))
        with pytest.raises(dcp_safe.UnsafeCheckpoint, match=re.escape(named)):
            dcp_safe.load_metadata(bad)


def _pickle_getattr(obj, name: str) -> bytes:
    class _Call:
        def __reduce__(self):
            return getattr, (obj, name)

    return pickle.dumps(_Call())
