"""Which NCCL net plugin would NCCL load here? One line for `train doctor`.

NCCL's rule (src/plugin/net.cc of NCCL 2.2x, also the "NCCL_NET_PLUGIN" entry of its
environment-variable docs): with ``NCCL_NET_PLUGIN`` set, dlopen the value as given (a
library name or a path), then ``libnccl-net-<value>.so``; without it, ``libnccl-net.so``.
A bare name goes through the dynamic loader's search (LD_LIBRARY_PATH, ld.so.cache, ...),
so the probe runs in a child process that gets the environment NCCL would see: the loader
reads LD_LIBRARY_PATH once at process start. The child only dlopens the library
(RTLD_NOW | RTLD_LOCAL, like NCCL) and looks up its ``ncclNetPlugin_v<N>`` symbols; it
neither imports torch nor initialises NCCL or the plugin. When nothing loads (or the library
has no such symbol), NCCL uses its internal IB and socket transports; ``NCCL_NET_PLUGIN=none``
is the usual way to ask for that.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

ENV = "NCCL_NET_PLUGIN"
DEFAULT_NAME = "libnccl-net.so"
# Net plugin struct versions looked for, newest first (aws-ofi-nccl v1.21.1 exports v6 to v12).
SYMBOL_VERSIONS = range(16, 1, -1)

# Runs in the child: argv[1] is a JSON list of names to dlopen, in NCCL's order.
_PROBE = r"""
import ctypes, json, os, sys

class LinkMap(ctypes.Structure):
    _fields_ = [("l_addr", ctypes.c_void_p), ("l_name", ctypes.c_char_p)]

def where(lib):
    ptr = ctypes.POINTER(LinkMap)()
    try:
        dlinfo = ctypes.CDLL(None).dlinfo
    except AttributeError:
        dlinfo = ctypes.CDLL("libdl.so.2").dlinfo
    if dlinfo(ctypes.c_void_p(lib._handle), 2, ctypes.byref(ptr)) != 0:  # RTLD_DI_LINKMAP
        return None
    return os.path.realpath(ptr.contents.l_name.decode())

names, versions = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out = {"tried": [], "loaded": None, "path": None, "symbols": [], "errors": []}
for name in names:
    out["tried"].append(name)
    try:
        lib = ctypes.CDLL(name, mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as exc:
        out["errors"].append(str(exc))
        continue
    out["loaded"], out["path"] = name, where(lib)
    out["symbols"] = [f"ncclNetPlugin_v{v}" for v in versions if hasattr(lib, f"ncclNetPlugin_v{v}")]
    break
print(json.dumps(out))
"""


@dataclass(frozen=True)
class NetPlugin:
    env: str | None  # NCCL_NET_PLUGIN as set (None: unset or empty)
    tried: list[str] = field(default_factory=list)  # names dlopen'ed, in NCCL's order
    path: str | None = None  # the file that loaded (symlinks resolved)
    symbol: str | None = None  # newest ncclNetPlugin_v<N> it exports
    error: str | None = None  # a load failure other than "not found", or why the probe failed
    line: str = ""

    @property
    def usable(self) -> bool:
        return self.path is not None and self.symbol is not None

    def as_dict(self) -> dict:
        """For doctor's JSON report."""
        return {"env": self.env, "tried": list(self.tried), "path": self.path, "symbol": self.symbol,
                "usable": self.usable, "error": self.error, "line": self.line}


def candidates(env_value: str | None) -> list[str]:
    """The names NCCL dlopens, in its order, for this NCCL_NET_PLUGIN value."""
    if env_value:
        return [env_value, f"libnccl-net-{env_value}.so"]
    return [DEFAULT_NAME]


def _run_probe(names: list[str], env: Mapping[str, str], timeout: float) -> dict:
    cmd = [sys.executable, "-I", "-c", _PROBE, json.dumps(names), json.dumps(list(SYMBOL_VERSIONS))]
    proc = subprocess.run(cmd, env=dict(env), capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise RuntimeError(f"probe process failed: {last}")
    return json.loads(proc.stdout)


def _not_found(name: str, error: str) -> bool:
    """dlerror() for a library that is not there at all (as opposed to one that fails to load)."""
    return error.startswith(f"{name}: cannot open shared object file")


def probe(env: Mapping[str, str] | None = None, timeout: float = 30.0) -> NetPlugin:
    """Resolve the plugin NCCL would load under `env` (default: this process's environment)."""
    env = os.environ if env is None else env
    value = env.get(ENV) or None
    names = candidates(value)
    try:
        raw = _run_probe(names, env, timeout)
    except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
        return _with_line(NetPlugin(value, names, error=f"could not probe: {exc}"))
    failures = [e for n, e in zip(raw["tried"], raw["errors"]) if not _not_found(n, e)]
    error = failures[-1] if failures and raw["path"] is None else None
    symbol = raw["symbols"][0] if raw["symbols"] else None
    return _with_line(NetPlugin(value, raw["tried"], raw["path"], symbol, error))


def _with_line(p: NetPlugin) -> NetPlugin:
    return NetPlugin(p.env, p.tried, p.path, p.symbol, p.error, describe(p))


def describe(p: NetPlugin) -> str:
    """One line: which plugin NCCL loads, or why it falls back to its internal transports."""
    how = f"{ENV}={p.env}" if p.env else f"{ENV} unset"
    internal = f"NCCL uses its internal IB/socket transports ({how})"
    if p.path and p.symbol:
        return f"NCCL net plugin: {p.path} ({p.symbol}; {how})"
    if p.path:
        return f"NCCL net plugin: {p.path} loads but exports no ncclNetPlugin_v* symbol; {internal}"
    if p.error and p.error.startswith("could not probe"):
        return f"NCCL net plugin: {p.error}"
    if p.error:
        return f"NCCL net plugin: FAILS to load ({p.error}); {internal}"
    return f"NCCL net plugin: none found (tried {', '.join(p.tried)}); {internal}"
