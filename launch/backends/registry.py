"""The one table of backends: each backend module describes itself with a ``Backend`` and
calls :func:`register`; ``launch/cli.py`` builds one subcommand per entry, and the tests
iterate the same table (a golden file and a docs entry for each).

A backend is its module (this description and ``render``), its template and its test: the
command line, the owned environment names and the golden test need no other edit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from launch.envnames import Owned


def _none(extra: dict, job_options: dict) -> None:
    return None


def _nothing(*_args) -> tuple:
    return ()


@dataclass(frozen=True)
class Backend:
    """One ``launch NAME`` subcommand.

    ``params``: a function returning the click parameters of its own (fresh objects each call);
    ``parse(extra, job_options)``: those parameters' values (``extra``) to the backend's frozen
    options (``job_options``: the shared ones, read-only); ``builder_inputs(opts)``: values the
    shared builder needs from them (e.g. how ``--image`` is read); ``owned(spec, opts)``: the
    ``Owned`` name lists of the runtime the job runs under; ``secret_env(opts)``: the names a
    Secret sets; ``warnings(job, opts)``: lines for stderr; ``render(job, opts)``: the text."""

    name: str
    help: str
    render: Callable[[Any, Any], str]
    owned: Callable[[Any, Any], tuple[Owned, ...]]
    params: Callable[[], list] = field(default=lambda: [])
    parse: Callable[[dict, dict], Any] = _none
    builder_inputs: Callable[[Any], dict] = lambda opts: {}
    secret_env: Callable[[Any], tuple] = _nothing
    warnings: Callable[[Any, Any], list[str]] = lambda job, opts: []
    executable: bool = True  # -o FILE gets the executable bit (scripts)
    venv: Callable[[Any], str | None] = lambda opts: getattr(opts, "venv", None)


BACKENDS: dict[str, Backend] = {}


def register(backend: Backend) -> Backend:
    """Add ``backend`` to the table; a name given twice is a programming error."""
    if backend.name in BACKENDS and BACKENDS[backend.name] is not backend:
        raise ValueError(f"backend {backend.name!r} registered twice")
    BACKENDS[backend.name] = backend
    return backend


def owners(*owned: Owned) -> Callable[[Any, Any], tuple[Owned, ...]]:
    """``Backend.owned`` for a backend whose runtime does not depend on the job."""
    return lambda spec, opts: owned
