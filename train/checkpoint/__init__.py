"""Checkpoints: what is saved, when, and how it is read back.

The one face the rest of ``train`` (and the tests) import from:

- ``Checkpointer`` (``checkpointer.py``): when to checkpoint (``maybe_save``) and resume;
- ``CheckpointManager`` (``manager.py``): sharded DCP save (sync or async), load, retention, ``latest``;
- the checkpointed state as ``Stateful`` objects (``state.py``);
- the files on disk (``files.py``): manifest verification, the ``latest`` pointer, failure causes;
- reading DCP files without running code from them (``safe_load.py``).
"""

from train.checkpoint.checkpointer import Checkpointer
from train.checkpoint.files import read_pointer, verify
from train.checkpoint.manager import CheckpointManager
from train.checkpoint.state import (
    RNG,
    ComponentState,
    DataPosition,
    ModelOptimizer,
    Progress,
    Schedule,
    rng_state,
    set_rng_state,
)

__all__ = ["RNG", "CheckpointManager", "Checkpointer", "ComponentState", "DataPosition", "ModelOptimizer",
           "Progress", "Schedule", "read_pointer", "rng_state", "set_rng_state", "verify"]
