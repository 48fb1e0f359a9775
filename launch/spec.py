"""The one typed job description shared by every backend, plus input parsing.

Everything a user types goes through a parser here; a bad value raises
``SpecError`` (the CLI turns it into one line on stderr and exit status 2).
Nothing in this module knows about hardware: profiles and fabrics are data
(see ``catalog.py``).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from decimal import ROUND_DOWN, Decimal, localcontext
from typing import TYPE_CHECKING

from core.errors import SpecError
from core.homepath import refuse_home
from core.safety import NAME_MAX, canonical_path, control_chars, excerpt, longest_name, reserved_path, within
from launch import defaults
from launch.envnames import check_env_name, check_unique_env

if TYPE_CHECKING:  # annotations only: profiles and fabrics are loaded by the builder
    from core.catalog import Fabric, Profile

_DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_HOST_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?", re.ASCII)
# A host the nodes resolve (the rendezvous host): glibc's resolver and docker's / Compose's DNS
# also answer names with '_' (node_1), which RFC 1123 leaves out.
_RESOLVED_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?", re.ASCII)


@dataclass(frozen=True)
class Nodes:
    """Node count: fixed (``min == max``) or an elastic range."""

    min: int
    max: int

    @property
    def elastic(self) -> bool:
        return self.min != self.max

    @property
    def multi_node(self) -> bool:
        return self.max > 1

    @property
    def torchrun_value(self) -> str:
        return f"{self.min}:{self.max}" if self.elastic else str(self.min)


@dataclass(frozen=True)
class Rendezvous:
    """c10d rendezvous: where the store lives and the id every node agrees on."""

    host: str | None  # None: resolved by the backend (Slurm allocation, operator, runtime env)
    port: int
    id: str


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool = False
    options: tuple[str, ...] = ()  # as given after the second ':' (docker/podman -v options)


@dataclass(frozen=True)
class Resources:
    cpus: str | None = None  # per node (k8s cpu request, Slurm --cpus-per-task)
    memory: str | None = None  # per node, Kubernetes quantity (e.g. 512Gi)


@dataclass(frozen=True)
class Debug:
    nccl_debug: str | None = None  # NCCL_DEBUG level, off by default
    nccl_debug_subsys: str | None = None
    flight_recorder: int | None = None  # TORCH_FR_BUFFER_SIZE entries, off by default


@dataclass(frozen=True)
class NetworkOverrides:
    """Site-specific NCCL network settings a fabric may need from the user."""

    socket_ifname: str | None = None
    ib_hca: str | None = None
    ib_gid_index: str | None = None


@dataclass(frozen=True)
class Preflight:
    """``--preflight``: every node runs ``train preflight`` (one torchrun) before training."""

    enabled: bool = False
    min_fraction: float = defaults.PREFLIGHT_MIN_FRACTION
    busbw_GBps: float | None = None  # None: the fabric's declared busbw_GBps


@dataclass(frozen=True)
class JobSpec:
    name: str
    image: str
    profile: Profile
    fabric: Fabric
    nodes: Nodes
    nproc_per_node: int
    rdzv: Rendezvous
    max_restarts: int
    entrypoint: tuple[str, ...]
    train_args: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    mounts: tuple[Mount, ...] = ()
    checkpoint_dir: str = defaults.CHECKPOINT_DIR
    resources: Resources = field(default_factory=Resources)
    debug: Debug = field(default_factory=Debug)
    network: NetworkOverrides = field(default_factory=NetworkOverrides)
    p2p_broken: bool = False
    grace_period_s: int = defaults.GRACE_PERIOD_S
    allow_undocumented_nccl: bool = False
    preflight: Preflight = field(default_factory=Preflight)
    image_preloaded: bool = False  # --image-preloaded: on every node already, never pulled


# --------------------------------------------------------------------------- parsers


def reject_control_chars(what: str, value: str) -> str:
    """For names, paths and images: control characters have no business there."""
    ch = control_chars(value)
    if ch:
        raise SpecError(f"{what} contains a control character ({ch!r})")
    return value


# Linux's limit on one argument or environment string of execve (32 pages of 4 KiB, with its NUL).
MAX_ARG_STRLEN = 131072


def check_exec_string(what: str, text: str) -> str:
    """One argument or ``NAME=VALUE`` string a process is started with: no NUL, and shorter than
    Linux's MAX_ARG_STRLEN (execve refuses it: the job would render, then fail at every start)."""
    reject_nul(what, text)
    size = len(text.encode("utf-8", "surrogateescape"))
    if size >= MAX_ARG_STRLEN:
        raise SpecError(f"{what}: {size} bytes; Linux takes at most {MAX_ARG_STRLEN - 1} in one argument or "
                        "environment string (MAX_ARG_STRLEN)")
    return text


def reject_nul(what: str, value: str) -> str:
    """Arguments and environment values may hold any character except NUL, which no
    process can receive; everything else is quoted on the way out."""
    if "\x00" in value:
        raise SpecError(f"{what} contains a NUL character")
    return value


CONTAINER_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*", re.ASCII)


def parse_name(value: str, rule: str = "container") -> str:
    """--name: Kubernetes jobs (``rule="dns1035"``) need a DNS-1035 label; the others a docker/podman
    container name ([a-zA-Z0-9][a-zA-Z0-9_.-]*, moby daemon/names), which Slurm's --job-name and the
    rendezvous id (at most 63 characters) take too."""
    if rule != "dns1035":
        if not value or len(value) > 63 or not CONTAINER_NAME.fullmatch(value):
            raise SpecError(f"--name {excerpt(value)}: at most 63 letters, digits, '_', '.' and '-', starting with a "
                            "letter or digit (a container and Slurm job name)")
        return value
    if not value or len(value) > 63 or not _DNS1035.fullmatch(value):
        raise SpecError(
            f"--name {value!r} is not a DNS-1035 label (lower-case letters, digits and '-', "
            "starting with a letter, ending with a letter or digit, at most 63 characters)"
        )
    return value


def parse_nnodes(value: str) -> Nodes:
    text = str(value).strip()
    parts = text.split(":")
    if len(parts) not in (1, 2) or not all(re.fullmatch(r"[0-9]{1,6}", p.strip()) for p in parts):
        raise SpecError(f"--nnodes {value!r}: expected N or MIN:MAX (positive integers)")
    lo, hi = (int(parts[0]), int(parts[-1]))
    if lo < 1 or hi < 1:
        raise SpecError(f"--nnodes {value!r}: node counts must be at least 1")
    if lo > hi:
        raise SpecError(f"--nnodes {value!r}: MIN ({lo}) is greater than MAX ({hi})")
    return Nodes(lo, hi)


def parse_positive_int(option: str, value: int, minimum: int = 1) -> int:
    if value is None or int(value) < minimum:
        raise SpecError(f"{option} must be at least {minimum} (got {value})")
    return int(value)


def parse_env_pairs(values: tuple[str, ...] | list[str], allow_undocumented_nccl: bool = False,
                    k8s: bool = False) -> tuple[tuple[str, str], ...]:
    pairs: list[tuple[str, str]] = []
    for item in values:
        if "=" not in item:
            raise SpecError(f"--env {item!r}: expected NAME=VALUE")
        name, val = item.split("=", 1)
        check_env_name("--env", name, allow_undocumented_nccl, k8s=k8s)
        reject_nul(f"--env {name}", val)
        pairs.append((name, val))
    check_unique_env(name for name, _ in pairs)
    return tuple(pairs)


def parse_endpoint(value: str | None, default_port: int) -> tuple[str | None, int]:
    """``HOST[:PORT]`` (IPv6 in brackets) -> (host, port)."""
    if value is None:
        return None, default_port
    text = value.strip()
    host, port = text, default_port
    match = re.fullmatch(r"(\[[^\]]+\]|[^:\[\]]+)(?::([0-9]{1,5}))?", text)
    if match:
        host = match.group(1)
        if match.group(2) is not None:
            port = int(match.group(2))
    if not match or not valid_host(host, resolved=True):
        raise SpecError(f"--rdzv-endpoint {excerpt(value)}: expected HOST[:PORT] (a DNS name of at most 253 characters "
                        "in labels of 1..63, an IPv4 address or [IPv6] without a %zone)")
    return host, parse_port(port)


def valid_host(host: str, resolved: bool = False) -> bool:
    """Every host a user names (rendezvous, registry): an RFC 1123 name (at most 253
    characters, dot-separated labels of 1..63 letters, digits and '-', the last one not all
    digits; ``resolved``, a name the nodes' resolver looks up: '_' too), a dotted-quad IPv4
    address or a bracketed IPv6."""
    if host.startswith("[") and host.endswith("]"):
        try:
            address = ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return False
        return address.scope_id is None  # fe80::1%eth0 names a link, which no other node shares
    labels = host.split(".")
    if labels[-1].isdigit():
        # RFC 1123 2.1: a name's top-level label is never all digits, so this is a dotted-quad
        # IPv4 address (each part 0..255) or nothing (999.999.999.999, 10.0.0, 4294967295)
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return False
        return True
    label_rule = _RESOLVED_LABEL if resolved else _HOST_LABEL
    return len(host) <= 253 and all(label_rule.fullmatch(label) for label in labels)


def parse_port(port: int, what: str = "rendezvous port") -> int:
    """Every TCP port a user names (rendezvous, registry): 1..65535."""
    if not 1 <= int(port) <= 65535:
        raise SpecError(f"{what} {port} is outside 1..65535")
    return int(port)


def parse_rdzv_id(value: str) -> str:
    """torchrun's --rdzv-id and the PyTorchJob's rdzvId, bounded as a Kubernetes label value (at
    most 63 of [A-Za-z0-9._-], alphanumeric at both ends) so that any backend can name or label
    things with it."""
    if not value or len(value) > 63 or not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", value):
        raise SpecError(f"--rdzv-id {excerpt(value)}: at most 63 letters, digits, '.', '_' and '-', "
                        "starting and ending with a letter or digit")
    return value


# docker/podman -v options (docs.docker.com bind mounts; podman-run(1) --volume): access, SELinux
# relabel (z shared, Z private: RHEL/Fedora hosts need them), propagation, and docker's no-ops.
PROPAGATION = ("shared", "slave", "private", "rshared", "rslave", "rprivate")
MOUNT_OPTIONS = ("ro", "rw", "z", "Z", *PROPAGATION, "consistent", "cached", "delegated")


def parse_mount(value: str) -> Mount:
    """``SRC:DST[:OPTIONS]``, OPTIONS a comma list of MOUNT_OPTIONS (at most one of ro/rw, one of
    z/Z, one propagation); paths are absolute and free of ',' ':' and control characters."""
    parts = value.split(":")
    options = tuple(parts[2].split(",")) if len(parts) == 3 else ()
    groups = (("ro", "rw"), ("z", "Z"), PROPAGATION)
    if (len(parts) not in (2, 3) or any(o not in MOUNT_OPTIONS for o in options) or len(set(options)) != len(options)
            or any(sum(o in g for o in options) > 1 for g in groups)):
        raise SpecError(f"--mount {excerpt(value)}: expected SRC:DST[:OPTIONS], OPTIONS comma-separated from "
                        f"{', '.join(MOUNT_OPTIONS)} (one of ro/rw, one of z/Z, one propagation; paths without ':' or ',')")
    src, dst, read_only = parts[0], parts[1], "ro" in options
    for path in (src, dst):
        check_path("--mount", path, writable=not read_only)
    return Mount(src, dst, read_only=read_only, options=options)


def reject_long_names(option: str, path: str) -> str:
    """No component of ``path`` over NAME_MAX (255) bytes: no Linux file system holds it, and the
    rendered script would fail on every node only when it starts."""
    if (longest := longest_name(path)) > NAME_MAX:
        raise SpecError(f"{option} {excerpt(path)}: a name of {longest} bytes in the path (at most {NAME_MAX})")
    return path


# Never a mount or checkpoint directory (besides reserved_path): a home's credentials, and where the
# job writes (the checkpoint directory, a read-write mount) the system's data under /var; a
# subdirectory of /var/tmp is fine, and so is reading e.g. /var/lib/datasets.
SYSTEM_DATA_TREES = ("/var/empty", "/var/lib", "/var/log", "/var/spool", "/var/run", "/var/cache", "/var/mail",
                     "/var/lock", "/var/backups", "/var/db")
SYSTEM_DATA_PATHS = ("/var/tmp",)
CREDENTIAL_DIRS = (".ssh", ".gnupg")


def home_dot_dir(path: str, names: tuple[str, ...]) -> bool:
    """``path`` is (in) one of the dot-directories ``names`` of /root or /home/USER."""
    parts = canonical_path(path).split("/")
    top = parts[2] if parts[1:2] == ["root"] and len(parts) > 2 else (
        parts[3] if parts[1:2] == ["home"] and len(parts) > 3 else "")
    return top in names


def reserved_job_path(path: str, writable: bool = True) -> bool:
    """A mount or checkpoint path ``launch`` refuses: :func:`reserved_path`, a home's credentials
    (``~/.ssh``) and, where the job writes, the system's data under /var."""
    norm = canonical_path(path)
    return (reserved_path(norm) or home_dot_dir(norm, CREDENTIAL_DIRS)
            or writable and (norm in SYSTEM_DATA_PATHS or within(norm, SYSTEM_DATA_TREES)))


def check_path(option: str, path: str, writable: bool = True) -> str:
    reject_control_chars(option, path)
    reject_long_names(option, path)
    refuse_home(path, option, SpecError)
    if not path.startswith("/"):
        raise SpecError(f"{option} {excerpt(path)}: must be an absolute path")
    if "," in path or ":" in path:
        raise SpecError(f"{option} {excerpt(path)}: ',' and ':' are not allowed in mount paths")
    if any(part in (".", "..") for part in path.split("/")):
        raise SpecError(f"{option} {excerpt(path)}: '.' and '..' components are not allowed")
    if len(path) > 4096:
        raise SpecError(f"{option}: path longer than 4096 characters")
    if reserved_job_path(path, writable):
        raise SpecError(
            f"{option} {excerpt(path)}: a system directory (or /dev/shm, /proc, ~/.ssh...) cannot be mounted "
            f"{'read-write ' if writable else ''}or used for checkpoints; use a directory of its own, e.g. "
            "/checkpoints or /data"
        )
    return path


def check_checkpoint_dir(path: str) -> str:
    """--checkpoint-dir: a mount path the job writes (:func:`check_path`); the docker script creates it
    and hands only a directory it created to the image's user."""
    return check_path("--checkpoint-dir", path)


# Kubernetes resource.Quantity (apimachinery's grammar): an optional sign, a number (5, 5.5, 5.,
# .5), then a binary SI suffix (Ki..Ei), a decimal SI suffix (n, u, m, k, M, G, T, P, E; a bare
# trailing E is exa) or a decimal exponent (500e6, 1E3, 1e-3). Resources cannot be negative.
_QUANTITY = re.compile(r"([+-]?)([0-9]{1,18}(?:\.[0-9]{0,18})?|\.[0-9]{1,18})"
                       r"(n|u|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?[0-9]{1,3})?")


def parse_quantity(option: str, value: str | None) -> str | None:
    """A Kubernetes quantity of at least 1m, canonical: no sign, the number as 0.5 / 5 (.5 and 5.
    written out), the suffix as given (the API server reads both forms alike)."""
    if value is None:
        return None
    match = _QUANTITY.fullmatch(value)
    if not match:
        raise SpecError(f"{option} {value!r}: expected a Kubernetes quantity such as 64, 500m, 512Gi")
    sign, number, suffix = match.group(1), match.group(2), match.group(3) or ""
    number = ("0" + number if number.startswith(".") else number).rstrip(".")
    canonical = number + suffix
    if sign == "-" or not re.search(r"[1-9]", number):
        raise SpecError(f"{option} {value!r}: must be more than zero")
    base = quantity_value(canonical)
    if base > _QUANTITY_MAX:
        raise SpecError(f"{option} {value!r}: larger than Kubernetes accepts (2^63-1 in the base unit)")
    if base != base.quantize(Decimal("0.001"), rounding=ROUND_DOWN):
        raise SpecError(f"{option} {value!r}: finer than Kubernetes' precision of 1m (0.001)")
    return canonical


_QUANTITY_MAX = Decimal(2**63 - 1)
_SUFFIX = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("0.001"), "": Decimal(1), "k": Decimal(10**3),
           "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12), "P": Decimal(10**15), "E": Decimal(10**18),
           **{s: Decimal(2 ** (10 * (i + 1))) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))}}


def quantity_value(value: str) -> Decimal:
    """A quantity ``parse_quantity`` returned, in its base unit (cores, bytes), exactly."""
    with localcontext() as ctx:
        ctx.prec = 80  # exact: at most 37 digits times 2^60, 10^18 or 10^999
        exponent = re.fullmatch(r"([0-9.]+)[eE]([+-]?[0-9]+)", value)
        if exponent:
            return Decimal(exponent.group(1)) * Decimal(10) ** int(exponent.group(2))
        match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", value)
        return Decimal(match.group(1)) * _SUFFIX[match.group(2)]


_DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "TRACE")


def parse_debug(level: str | None, subsys: str | None, fr_entries: int | None) -> Debug:
    if level is not None and level.upper() not in _DEBUG_LEVELS:
        raise SpecError(f"--nccl-debug {level!r}: one of {', '.join(_DEBUG_LEVELS)}")
    if subsys is not None:
        reject_control_chars("--nccl-debug-subsys", subsys)
        if not re.fullmatch(r"\^?[A-Za-z_]+(,\^?[A-Za-z_]+)*", subsys):
            raise SpecError(f"--nccl-debug-subsys {subsys!r}: comma-separated subsystem names")
    if fr_entries is not None and fr_entries < 1:
        raise SpecError("--flight-recorder needs a positive number of entries")
    return Debug(level.upper() if level else None, subsys, fr_entries)


SAFE_TOKEN = re.compile(r"[A-Za-z0-9=^_.,:/+@-]+")


# Slurm partition/account/GRES names and NCCL device lists (mlx5_0:1,... for 18 NICs is ~200)
MAX_TOKEN_CHARS = 1024


def parse_safe_token(option: str, value: str | None) -> str | None:
    """Values that end up in line-oriented places (#SBATCH lines, NCCL device lists)."""
    if value is None:
        return None
    if len(value) > MAX_TOKEN_CHARS:
        raise SpecError(f"{option} {excerpt(value)}: {len(value)} characters, more than {MAX_TOKEN_CHARS}")
    if not SAFE_TOKEN.fullmatch(value):
        raise SpecError(f"{option} {excerpt(value)}: only letters, digits and =^_.,:/+@- are allowed")
    return value


def torchrun_max_restarts(nodes: Nodes, requested: int | None) -> int:
    """Elastic jobs restart the worker group on membership change; fixed jobs default to 0
    (the scheduler - Slurm requeue, Kubernetes backoffLimit - owns retries there)."""
    if requested is not None:
        if requested < 0:
            raise SpecError("--max-restarts must be 0 or more")
        return requested
    return defaults.ELASTIC_MAX_RESTARTS if nodes.elastic else 0
