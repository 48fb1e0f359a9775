"""Hardware profiles and network fabrics: YAML data files, the file stem being the name.

Search order (first match wins): the directories in ``LAUNCH_PROFILE_PATH`` /
``LAUNCH_FABRIC_PATH`` (``os.pathsep``-separated), then the built-in
``core/profiles`` and ``core/fabrics``. ``--profile`` / ``--fabric`` also
accept a path to a ``.yaml`` file.
"""

from __future__ import annotations

import itertools
import os
import stat
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from core.errors import SpecError
from core.homepath import expand_home
from core.safety import excerpt, excerpt_path, file_kind, probe_path

PACKAGE_DIR = Path(__file__).resolve().parent
PROFILE_PATH_ENV = "LAUNCH_PROFILE_PATH"
FABRIC_PATH_ENV = "LAUNCH_FABRIC_PATH"


@dataclass(frozen=True)
class EnvEntry:
    name: str
    value: str | None
    why: str
    option: str | None = None


@dataclass(frozen=True)
class RdmaResource:
    name: str
    count: int | None
    why: str


@dataclass(frozen=True)
class Profile:
    name: str
    path: Path
    description: str
    gpu_model: str
    arch: str
    gpus_per_node: int
    memory_gb: int | None
    cpu_arch: str
    cpus_per_node: int | None
    interconnect: str
    nvlink: bool
    nvswitch: bool
    multi_node_nvlink: bool
    fp8: tuple[str, ...]
    fp4: tuple[str, ...]
    image_target: str
    default_fabric_single: str
    default_fabric_multi: str
    env: tuple[EnvEntry, ...]
    node_selector: tuple[tuple[str, str], ...]
    notes: tuple[str, ...]
    compute_domain_env: tuple[EnvEntry, ...] = ()  # only with an IMEX domain (k8s ComputeDomain)
    k8s_resources: tuple[tuple[str, str, str], ...] = ()  # (cpu|memory, quantity, why) per trainer pod


@dataclass(frozen=True)
class Fabric:
    name: str
    path: Path
    description: str
    scope: str
    transport: str
    requires_nvlink: bool
    env: tuple[EnvEntry, ...]
    docker_devices: tuple[str, ...]
    docker_cap_add: tuple[str, ...]
    rdma_resource: RdmaResource | None
    ipc_lock: bool
    notes: tuple[str, ...]
    busbw_GBps: float | None = None  # declared all-reduce busbw of a healthy fabric (preflight gate)
    busbw_why: str = ""

    @property
    def multi_node(self) -> bool:
        return self.scope == "multi-node"


# --------------------------------------------------------------------------- discovery


def _search_dirs(kind: str) -> list[Path]:
    env_var = PROFILE_PATH_ENV if kind == "profiles" else FABRIC_PATH_ENV
    where = f"environment {env_var}: directory"  # '~' expanded as in every path a user gives
    user = [Path(expand_home(p, where)) for p in os.environ.get(env_var, "").split(os.pathsep) if p]
    return user + [PACKAGE_DIR / kind]


def available(kind: str) -> dict[str, Path]:
    """Name -> file for ``kind`` in ("profiles", "fabrics"); earlier directories win."""
    found: dict[str, Path] = {}
    for directory in _search_dirs(kind):
        try:
            for path in sorted(directory.glob("*.yaml")) if directory.is_dir() else ():
                found.setdefault(path.stem, path)
        except OSError as exc:  # a name too long, a directory that cannot be listed...
            env_var = PROFILE_PATH_ENV if kind == "profiles" else FABRIC_PATH_ENV
            raise SpecError(f"environment {env_var}: directory {excerpt_path(directory)}: cannot read "
                            f"({exc.strerror or type(exc).__name__})") from None
    return dict(sorted(found.items()))


def _resolve(kind: str, name: str) -> Path:
    singular = kind[:-1]
    if name.endswith((".yaml", ".yml")):
        st = probe_path(name, f"--{singular}")  # a name the file system refuses: one line naming it
        if st is not None and stat.S_ISREG(st.st_mode):
            return Path(name)
        if st is not None:
            raise SpecError(f"--{singular} {excerpt(name)}: is {file_kind(st.st_mode)}; give a YAML file or a known name")
    known = available(kind)
    if name not in known:
        raise SpecError(f"unknown {singular} {excerpt(name)} (known: {', '.join(known) or 'none'})")
    return known[name]


# --------------------------------------------------------------------------- loading


def _read_yaml(path: Path) -> dict:
    try:
        stamp = path.stat().st_mtime_ns
    except OSError as exc:
        raise SpecError(f"{excerpt_path(path)}: cannot read ({exc.strerror})") from None
    return _parse_yaml(str(path), stamp)


@lru_cache(maxsize=64)
def _parse_yaml(path_str: str, _stamp: int) -> dict:
    from core.safety import load_yaml_file

    data = load_yaml_file(Path(path_str), "")
    if not isinstance(data, dict):
        raise SpecError(f"{excerpt(path_str)}: expected a mapping at the top level")
    return data


def validate(data: dict, schema: dict, path: Path) -> None:
    # data is the cached parse of this file version (_parse_yaml): its identity is the key
    # (never repr(data): an aliased value would be expanded)
    key = (str(path), id(schema), id(data))
    if key in _VALIDATED:
        return
    _validate(data, schema, path)
    _VALIDATED.add(key)


_VALIDATED: set = set()


def _validate(data: dict, schema: dict, path: Path) -> None:
    """Validate with jsonschema when installed (dev extra); otherwise check required keys."""
    try:
        import jsonschema
    except ImportError:  # runtime install without the dev extra
        missing = [key for key in schema.get("required", ()) if key not in data]
        if missing:
            raise SpecError(f"{path}: missing required keys: {', '.join(missing)}") from None
        return
    errors = sorted(itertools.islice(_strict_validator(jsonschema)(schema).iter_errors(data), MAX_ERRORS), key=str)
    if errors:
        err = errors[0]
        where = "/".join(str(p) for p in err.absolute_path) or "(top level)"
        raise SpecError(f"{path}: {where}: {err.message}".replace("\n", " "))
    for key in ("fp8", "fp4"):  # the schema bounds these lists (no uniqueItems: see core.schema)
        items = data.get(key, [])
        if isinstance(items, list) and len(set(items)) != len(items):
            raise SpecError(f"{path}: {key}: an item is listed twice")


MAX_ERRORS = 50  # schema errors looked at (the first by text is reported)


def _strict_validator(jsonschema):
    """Draft 2020-12 with ``integer`` meaning a YAML integer: the draft counts 8.0 as an integer,
    and ``gpus_per_node: 8.0`` would render ``--nproc-per-node 8.0``, ``--cpus-per-task=112.0``."""
    base = jsonschema.Draft202012Validator
    checker = base.TYPE_CHECKER.redefine("integer", lambda _, value: isinstance(value, int)
                                         and not isinstance(value, bool))
    return jsonschema.validators.extend(base, type_checker=checker)


def _env_entries(raw: dict) -> tuple[EnvEntry, ...]:
    return tuple(
        EnvEntry(name, item["value"], " ".join(item["why"].split()), item.get("option"))
        for name, item in raw.items()
    )


def load_profile(name: str) -> Profile:
    from core.schema import PROFILE_SCHEMA

    path = _resolve("profiles", name)
    data = _read_yaml(path)
    validate(data, PROFILE_SCHEMA, path)
    gpu, link = data["gpu"], data["interconnect"]
    return Profile(
        name=path.stem,
        path=path,
        description=data["description"],
        gpu_model=gpu["model"],
        arch=gpu["arch"],
        gpus_per_node=gpu["gpus_per_node"],
        memory_gb=gpu.get("memory_gb"),
        cpu_arch=data["cpu_arch"],
        cpus_per_node=data.get("cpus_per_node"),
        interconnect=link["summary"],
        nvlink=link["nvlink"],
        nvswitch=link["nvswitch"],
        multi_node_nvlink=link["multi_node_nvlink"],
        fp8=tuple(data["fp8"]),
        fp4=tuple(data.get("fp4", ())),
        image_target=data["image_target"],
        default_fabric_single=data["default_fabric"]["single_node"],
        default_fabric_multi=data["default_fabric"]["multi_node"],
        env=_env_entries(data["env"]),
        node_selector=tuple(sorted(data.get("k8s", {}).get("node_selector", {}).items())),
        notes=tuple(data.get("notes", ())),
        compute_domain_env=_env_entries(data.get("compute_domain_env", {})),
        k8s_resources=tuple((key, item["value"], " ".join(item["why"].split()))
                            for key, item in sorted(data.get("k8s", {}).get("resources", {}).items())),
    )


def load_fabric(name: str) -> Fabric:
    from core.schema import FABRIC_SCHEMA

    path = _resolve("fabrics", name)
    data = _read_yaml(path)
    validate(data, FABRIC_SCHEMA, path)
    docker, k8s = data.get("docker", {}), data.get("k8s", {})
    rdma = k8s.get("rdma_resource")
    return Fabric(
        name=path.stem,
        path=path,
        description=data["description"],
        scope=data["scope"],
        transport=data["transport"],
        requires_nvlink=data.get("requires_nvlink", False),
        env=_env_entries(data["env"]),
        docker_devices=tuple(docker.get("devices", ())),
        docker_cap_add=tuple(docker.get("cap_add", ())),
        rdma_resource=RdmaResource(rdma["name"], rdma["count"], " ".join(rdma["why"].split()))
        if rdma
        else None,
        ipc_lock=k8s.get("ipc_lock", False),
        notes=tuple(data.get("notes", ())),
        busbw_GBps=float(data["busbw_GBps"]["value"]) if "busbw_GBps" in data else None,
        busbw_why=" ".join(data["busbw_GBps"]["why"].split()) if "busbw_GBps" in data else "",
    )


def check_compatible(profile: Profile, fabric: Fabric, multi_node: bool) -> None:
    if multi_node and not fabric.multi_node:
        multi = [n for n in available("fabrics") if _peek_scope(n) == "multi-node"]
        raise SpecError(
            f"fabric {fabric.name!r} is single-node; a multi-node job needs one of: {', '.join(multi)}"
        )
    if fabric.requires_nvlink and not profile.nvlink:
        raise SpecError(
            f"fabric {fabric.name!r} needs NVLink but profile {profile.name!r} has none "
            f"({profile.interconnect}); use --fabric {profile.default_fabric_single}"
        )


def _peek_scope(name: str) -> str | None:
    try:
        return load_fabric(name).scope
    except SpecError:
        return None
