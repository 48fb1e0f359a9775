"""Error types of ``train`` (a leaf module: it imports only ``core.errors``).

User errors (``InputError`` and its subclasses) become one line and exit 2 at the command
line; the runtime errors below become one line and exit 1. Everything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

from core.errors import InputError


class ConfigError(InputError):
    """A user error in the job configuration; the message names the key."""


class DataError(InputError, RuntimeError):
    """A token file or dataset that cannot be used as given."""


class RunDirBusy(ConfigError):
    """Another live run holds the run directory's lock."""


class CheckpointModelMismatch(ConfigError):
    """The checkpoint to resume holds another model than the job's (a tensor's shape, or a tensor
    one side lacks): no older checkpoint of the run is tried in its place."""


class NonFiniteLossError(RuntimeError):
    """The loss became NaN/Inf (agreed across ranks); the run stops without saving it."""


class OutOfMemory(RuntimeError):
    """The device ran out of memory; the message names the settings to lower."""


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read or written."""


class CollectiveError(RuntimeError):
    """A collective failed or timed out (a peer died or the network broke)."""


class PrepareError(Exception):
    """``train data prepare`` cannot produce the token file as asked."""


# The runtime errors the command line reports as one line (exit 1) instead of a traceback.
RUNTIME_ERRORS: tuple[type[BaseException], ...] = (
    CheckpointError, NonFiniteLossError, CollectiveError, OutOfMemory, FileNotFoundError,
    PermissionError, OSError)
