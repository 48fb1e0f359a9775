"""Assemble the job environment: torch-side settings, profile, fabric, options, ``--env``.

Each variable carries a ``why`` that templates render as a comment. Two gates run
on the final result, whatever its source:

* NVLink SHARP is never switched on: ``NCCL_NVLS_ENABLE`` may only be ``0``
  (NVLS stays with NCCL's auto-detection; our test machines must never get
  multicast turned on by a generated script).
* Names that blog posts use but NCCL never read are refused with a hint.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.errors import SpecError
from launch.envnames import check_env_name
from launch.spec import JobSpec, check_exec_string, reject_nul

NVLS_VARIABLE = "NCCL_NVLS_ENABLE"

# CLI network options -> the NCCL variable each one sets.
NETWORK_OPTIONS = (
    ("socket_ifname", "NCCL_SOCKET_IFNAME", "--socket-ifname"),
    ("ib_hca", "NCCL_IB_HCA", "--ib-hca"),
    ("ib_gid_index", "NCCL_IB_GID_INDEX", "--ib-gid-index"),
)

SHUTDOWN_MARGIN_S = 30


@dataclass(frozen=True)
class EnvVar:
    name: str
    value: str
    why: str


@dataclass(frozen=True)
class EnvPlan:
    variables: tuple[EnvVar, ...]
    warnings: tuple[str, ...]

    def as_dict(self) -> dict[str, str]:
        return {v.name: v.value for v in self.variables}


def _torch_defaults(spec: JobSpec) -> list[tuple[str, str | None, str]]:
    shutdown = max(spec.grace_period_s - SHUTDOWN_MARGIN_S, 10)
    restarts = []
    if spec.max_restarts > 0:
        restarts.append((
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
            "1",
            "with --max-restarts a restarted worker group gets a fresh store; on the shared "
            "rendezvous store it can read the dead group's keys and fail to connect (pytorch#135712)",
        ))
    return restarts + [
        (
            "TORCH_NCCL_ASYNC_ERROR_HANDLING",
            "3",
            "on an NCCL error or collective timeout the watchdog tears the process down (3: without "
            "aborting the communicator, the current torch default) so the launcher restarts from "
            "the last checkpoint; set explicitly so older images behave the same",
        ),
        (
            "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
            str(shutdown),
            f"after forwarding SIGTERM torchrun waits this long before SIGKILL (default 30 s); "
            f"grace period {spec.grace_period_s} s minus a {SHUTDOWN_MARGIN_S} s margin leaves the "
            "training loop time to write its preemption checkpoint",
        ),
    ]


def _debug_settings(spec: JobSpec) -> list[tuple[str, str, str]]:
    dbg, out = spec.debug, []
    if dbg.nccl_debug:
        out.append(("NCCL_DEBUG", dbg.nccl_debug, "--nccl-debug: NCCL logging for this run (debugging only)"))
    if dbg.nccl_debug_subsys:
        out.append(("NCCL_DEBUG_SUBSYS", dbg.nccl_debug_subsys, "--nccl-debug-subsys: filter NCCL_DEBUG=INFO output"))
    if dbg.flight_recorder:
        out += [
            (
                "TORCH_FR_BUFFER_SIZE",
                str(dbg.flight_recorder),
                "--flight-recorder: keep the last N collectives per rank in torch's flight recorder",
            ),
            (
                "TORCH_NCCL_DUMP_ON_TIMEOUT",
                "1",
                "--flight-recorder: dump the flight recorder when a collective times out",
            ),
            (
                "TORCH_FR_DUMP_TEMP_FILE",
                spec.checkpoint_dir.rstrip("/") + "/nccl_trace_rank_",
                "--flight-recorder: write the dumps next to the checkpoints (persistent) instead of /tmp",
            ),
        ]
    return out


def build_env(spec: JobSpec, compute_domain: bool = False) -> EnvPlan:
    """``compute_domain``: the job has an IMEX domain (Kubernetes ComputeDomain), so the
    profile's ``compute_domain_env`` (multi-node NVLink) applies too."""
    entries: dict[str, EnvVar | tuple[str, str, str | None]] = {}
    warnings: list[str] = []

    def put(name: str, value: str | None, why: str, option: str | None = None, owner: str = "") -> None:
        if value is None:  # a site value the file (owner) asks for
            entries[name] = (owner, why, option)
        else:
            entries[name] = EnvVar(name, value, " ".join(why.split()))

    for name, value, why in _torch_defaults(spec):
        put(name, value, why)
    for source, owner in ((spec.profile, f"profile {spec.profile.name!r}"), (spec.fabric, f"fabric {spec.fabric.name!r}")):
        for entry in source.env:
            put(entry.name, entry.value, entry.why, entry.option, owner)
    if compute_domain:
        for entry in spec.profile.compute_domain_env:
            put(entry.name, entry.value, entry.why, entry.option, f"profile {spec.profile.name!r}")

    for attr, name, option in NETWORK_OPTIONS:
        value = getattr(spec.network, attr)
        if value is not None:
            previous = entries.get(name)
            why = previous.why if isinstance(previous, EnvVar) else (previous[1] if previous else "")
            put(name, value, f"{option}: {why}" if why else f"{option}: site-specific network setting")

    for name, value, why in _debug_settings(spec):
        put(name, value, why)

    if spec.p2p_broken:
        put(
            "NCCL_P2P_DISABLE",
            "1",
            "--p2p-broken: GPU peer-to-peer is broken on this platform (IOMMU/ACS redirects PCIe "
            "P2P), so NCCL must go through host shared memory; NCCL lists this under debugging "
            "variables - drop it once the platform is fixed",
        )
        if spec.profile.nvlink:
            warnings.append(
                f"--p2p-broken on profile {spec.profile.name!r} also disables NVLink peer-to-peer"
            )

    for name, value in spec.env:
        put(name, value, "set with --env")

    missing = [(n, e) for n, e in entries.items() if isinstance(e, tuple)]
    if missing:
        name, (owner, why, option) = missing[0]
        hint = f"pass {option} VALUE" if option else f"pass --env {name}=VALUE"
        raise SpecError(f"{owner} needs {name} for this site: {hint} ({why})")

    variables = tuple(e for e in entries.values() if isinstance(e, EnvVar))
    check_safe(variables, checked=frozenset(name for name, _ in spec.env))
    return EnvPlan(variables, tuple(warnings))


# NVLink multicast switches: the one value each may take (the device machines need
# multicast off; nothing launch renders may switch it on).
MULTICAST_OFF = {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def check_safe(variables: tuple[EnvVar, ...] | list[EnvVar], checked: frozenset[str] = frozenset()) -> None:
    """Multicast stays off; every name valid and unreserved (``checked``: --env names, already
    checked by their backend's rule, which for Kubernetes also takes '.' and '-')."""
    for var in variables:
        if var.name == NVLS_VARIABLE and var.value.strip() != "0":
            raise SpecError(
                f"{NVLS_VARIABLE}={var.value!r} refused: launch never enables NVLink SHARP; "
                "NCCL auto-detects it (only NCCL_NVLS_ENABLE=0 is allowed)"
            )
        if var.name in MULTICAST_OFF and var.value.strip() != MULTICAST_OFF[var.name]:
            raise SpecError(
                f"{var.name}={var.value!r} refused: NVLink multicast stays off "
                f"(only {var.name}={MULTICAST_OFF[var.name]} is allowed)"
            )
        # profile and fabric files too: a valid, unreserved name ("NAME\n" is none). An NCCL name a
        # catalog file sets need not be in NCCL's documentation (site fabrics carry their network
        # plugin's variables, e.g. GCP's TCPXO ones); --env names were checked for that where they were parsed.
        check_env_name("environment variable", var.name, allow_undocumented_nccl=True, k8s=var.name in checked)
        reject_nul(f"environment variable {var.name}", var.value)  # no process can receive it
        check_exec_string(f"environment variable {var.name} (as NAME=VALUE)", f"{var.name}={var.value}")
