"""Reading torch DCP checkpoints without running code from them.

``torch.distributed.checkpoint`` keeps a checkpoint's index in ``.metadata``, a Python pickle
that ``FileSystemReader.read_metadata`` reads with ``pickle.load``, and loads every non-tensor
entry (an optimizer's ``lr``, ``betas``...) with ``torch.load(weights_only=False)``
(``DefaultLoadPlanner.load_bytes``): a checkpoint directory copied from elsewhere could run
any code when a job resumes from it. Here:

* :class:`MetadataUnpickler` rebuilds only the types torch writes into ``.metadata``: the
  dataclasses and enums of DCP's metadata modules (``Metadata``, ``TensorStorageMetadata``,
  ``BytesStorageMetadata``, ``ChunkStorageMetadata``, ``TensorProperties``,
  ``MetadataIndex``, ``StorageMeta``, ``_StorageInfo``...: by module, so the names torch
  2.7 to 2.13 use all load), ``torch.Size``, torch dtypes, layouts and memory formats,
  ``pathlib`` paths and ``collections.OrderedDict``; ``builtins.getattr`` only as an enum
  member of those (Python 3.11.2 pickles one so). Any other global is
  :class:`UnsafeCheckpoint`, naming the file and the global.
* :class:`SafeReader` is ``FileSystemReader`` reading ``.metadata`` through it.
* :class:`SafePlanner` is ``DefaultLoadPlanner`` loading non-tensor entries with
  ``torch.load(weights_only=True)`` (tensors already are).
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import importlib
import io
import pathlib
import pickle
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
import torch.distributed.checkpoint.metadata
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from train.errors import CheckpointError

METADATA_FILE = ".metadata"

# Modules whose dataclasses and enums make up DCP metadata (the later modules are where older
# torch versions defined TensorProperties, the shard metadata and the memory-format enum).
DCP_MODULES = frozenset({
    "torch.distributed.checkpoint.metadata",
    "torch.distributed.checkpoint.filesystem",
    "torch.distributed._shard.metadata",
    "torch.distributed._shard.sharded_tensor.metadata",
})
PATH_CLASSES = frozenset({"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath", "Path", "PurePath"})


class UnsafeCheckpoint(CheckpointError):
    """A checkpoint file names a Python global that no checkpoint torch writes holds."""


def _allowed(module: str, name: str) -> Any:
    """The object ``module.name`` when it may appear in DCP metadata, else None."""
    if module in DCP_MODULES:
        try:
            obj = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            return None
        if isinstance(obj, type) and (dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum)):
            return obj
        return None
    if module == "torch":
        obj = getattr(torch, name, None)
        if obj is torch.Size or isinstance(obj, (torch.dtype, torch.layout, torch.memory_format)):
            return obj
        return None
    if module == "torch.serialization" and name == "_get_layout":  # how torch pickles a layout
        return getattr(torch.serialization, name, None)
    if module in ("pathlib", "pathlib._local") and name in PATH_CLASSES:
        return getattr(pathlib, name)
    if module == "collections" and name == "OrderedDict":
        return collections.OrderedDict
    return None


class MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP metadata and nothing else (see the module docstring)."""

    def __init__(self, file, where: str):
        super().__init__(file)
        self.where = where

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("builtins", "getattr"):
            return self._enum_member
        obj = _allowed(module, name)
        if obj is None:
            raise UnsafeCheckpoint(f"{self.where}: holds {module}.{name}, which is no part of a torch checkpoint's "
                                   "metadata; not loaded (it could run code)")
        return obj

    def _enum_member(self, cls: Any, name: Any) -> enum.Enum:
        """``getattr(cls, name)`` for a member of an enum that passed :meth:`find_class` and for
        nothing else: how Python 3.11.2 (Debian 12's python3) pickles an enum member, where
        later releases pickle ``cls(value)``."""
        if isinstance(cls, type) and issubclass(cls, enum.Enum) and isinstance(name, str) and name in cls.__members__:
            return cls[name]
        raise UnsafeCheckpoint(f"{self.where}: holds getattr({getattr(cls, '__name__', type(cls).__name__)}, "
                               f"{str(name)[:60]!r}), which is no part of a torch checkpoint's metadata; not loaded")

    def persistent_load(self, pid):  # torch never writes persistent ids into .metadata
        raise UnsafeCheckpoint(f"{self.where}: holds a persistent id, which is no part of a torch checkpoint's metadata")


def load_metadata(path: Path):
    """The DCP ``Metadata`` pickled in ``path`` (``.metadata``), read with :class:`MetadataUnpickler`."""
    with open(path, "rb") as fh:
        metadata = MetadataUnpickler(fh, str(path)).load()
    if not isinstance(metadata, dcp.Metadata):
        raise UnsafeCheckpoint(f"{path}: holds {type(metadata).__name__}, not a torch checkpoint's metadata")
    return metadata


class SafeReader(dcp.FileSystemReader):
    """``FileSystemReader`` whose ``.metadata`` goes through :class:`MetadataUnpickler`."""

    def read_metadata(self, *args: Any, **kwargs: Any):
        rank = kwargs.get("rank")
        name = METADATA_FILE if rank is None else f"__{rank}{METADATA_FILE}"
        metadata = load_metadata(Path(self.path) / name)
        storage_meta = getattr(torch.distributed.checkpoint.metadata, "StorageMeta", None)  # torch >= 2.4
        if storage_meta is not None and getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = storage_meta()
        if getattr(metadata, "storage_meta", None) is not None and hasattr(self, "load_id"):
            metadata.storage_meta.load_id = self.load_id  # what FileSystemReader.read_metadata does
        return metadata


class SafePlanner(DefaultLoadPlanner):
    """``DefaultLoadPlanner`` loading non-tensor entries with ``weights_only=True``."""

    def load_bytes(self, read_item, value) -> None:
        """The entry is read with ``weights_only=True``; what that rebuilt (plain values) is
        saved again and handed to torch's own placement, whose unpickling then meets only it."""
        checked = io.BytesIO()
        torch.save(torch.load(value, map_location="cpu", weights_only=True), checked)
        checked.seek(0)
        super().load_bytes(read_item, checked)


def load(state: dict, ckpt: Path) -> None:
    """``dcp.load`` of ``state`` from ``ckpt`` through :class:`SafeReader` and :class:`SafePlanner`."""
    dcp.load(state, storage_reader=SafeReader(str(ckpt)), planner=SafePlanner())
