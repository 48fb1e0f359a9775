"""Turn the common CLI options into a validated ``JobSpec`` (+ warnings for stderr)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from core import catalog, limits
from core.safety import canonical_path
from launch import defaults
from launch.commandline import PREFLIGHT_PORT_OFFSET
from launch.entrypoint import parse_entrypoint
from launch.images import parse_image, parse_registry, registry_host
from launch.spec import (
    JobSpec,
    NetworkOverrides,
    Preflight,
    Rendezvous,
    Resources,
    SpecError,
    check_checkpoint_dir,
    check_exec_string,
    parse_debug,
    parse_endpoint,
    parse_env_pairs,
    parse_mount,
    parse_name,
    parse_nnodes,
    parse_port,
    parse_positive_int,
    parse_quantity,
    parse_rdzv_id,
    parse_safe_token,
    torchrun_max_restarts,
)


@dataclass
class Built:
    spec: JobSpec
    warnings: list[str]


def default_image(profile: catalog.Profile, registry: str | None = None) -> str:
    """``[REGISTRY/]hopper-train:<image target>``: the name ``make build-image`` / ``make push``
    give the image (docker/docker.mk, ``IMAGE_NAME``)."""
    name = f"{defaults.IMAGE_REPOSITORY}:{profile.image_target}"
    return f"{registry}/{name}" if registry else name


def _image(o: dict, profile: catalog.Profile) -> str:
    registry = parse_registry(o.get("registry"))
    if registry and o["image"] is not None:
        raise SpecError("--registry and --image: give one (--registry REG renders REG/"
                        f"{defaults.IMAGE_REPOSITORY}:<image target>)")
    return parse_image(default_image(profile, registry) if o["image"] is None else o["image"],
                       enroot=o.get("image_syntax") == "enroot")


def check_pullable(spec: JobSpec, backend: str, explicit: bool, warnings: list[str]) -> None:
    """A backend whose nodes pull the image (Kubernetes, Slurm + pyxis) gets a registry-qualified
    reference, or ``--image-preloaded`` saying it is on every node already. A short name the user
    gives (``--image ubuntu:22.04``) is Docker Hub's, as Kubernetes and enroot read it; only this
    project's own image under its short name (what ``make build-image`` leaves on one machine) is
    refused."""
    if spec.image_preloaded or registry_host(spec.image) is not None:
        return
    repository = re.split(r"[:@]", spec.image, maxsplit=1)[0]
    if explicit and repository != defaults.IMAGE_REPOSITORY:
        warnings.append(f"--image {spec.image}: no registry in the name; the nodes of `launch {backend}` "
                        f"pull it from Docker Hub (docker.io/{spec.image if '/' in repository else 'library/' + spec.image})")
        return
    raise SpecError(f"--image {spec.image}: a short name that the nodes of `launch {backend}` cannot pull; "
                    "give --registry HOST[/PATH] (the REGISTRY of `make push`), a registry-qualified --image, "
                    "or --image-preloaded if the image is loaded on every node")


def build(o: dict) -> Built:
    warnings: list[str] = []
    profile = catalog.load_profile(o["profile"])
    nodes = parse_nnodes(o["nnodes"])
    for option in ("fabric", "rdzv_id"):
        if o.get(option) is not None and not str(o[option]).strip():
            raise SpecError(f"--{option.replace('_', '-')} is empty")
    fabric_name = o["fabric"] or (
        profile.default_fabric_multi if nodes.multi_node else profile.default_fabric_single
    )
    fabric = catalog.load_fabric(fabric_name)
    catalog.check_compatible(profile, fabric, nodes.multi_node)

    nproc = _nproc_per_node(o["nproc_per_node"], profile, warnings)
    name = parse_name(o["name"], o.get("name_rule", "container"))
    image = _image(o, profile)
    allow_nccl = bool(o.get("allow_undocumented_nccl"))
    host, port = parse_endpoint(o["rdzv_endpoint"], parse_port(o["rdzv_port"]))
    # the job name (at most 63 characters, parse_name) as rendezvous id, alphanumeric at the end: run1- -> run1
    rdzv = Rendezvous(host, port, parse_rdzv_id(o["rdzv_id"]) if o["rdzv_id"] else name.rstrip("._-"))

    for arg in o["train_args"]:
        check_exec_string("training argument", arg)

    spec = JobSpec(
        name=name,
        image=image,
        profile=profile,
        fabric=fabric,
        nodes=nodes,
        nproc_per_node=nproc,
        rdzv=rdzv,
        max_restarts=torchrun_max_restarts(nodes, o["max_restarts"]),
        entrypoint=parse_entrypoint(o["entrypoint"]),
        train_args=tuple(o["train_args"]),
        env=parse_env_pairs(o["env"], allow_nccl, k8s=o.get("env_names") == "k8s"),
        mounts=tuple(parse_mount(m) for m in o["mount"]),
        checkpoint_dir=check_checkpoint_dir(o["checkpoint_dir"]),
        resources=Resources(
            cpus=parse_quantity("--cpus", o["cpus"]),
            memory="0" if o["memory"] == "0" else parse_quantity("--memory", o["memory"]),  # 0: Slurm's whole node
        ),
        debug=parse_debug(o["nccl_debug"], o["nccl_debug_subsys"], o["flight_recorder"]),
        network=NetworkOverrides(
            socket_ifname=parse_safe_token("--socket-ifname", o["socket_ifname"]),
            ib_hca=parse_safe_token("--ib-hca", o["ib_hca"]),
            ib_gid_index=_gid_index(o["ib_gid_index"]),
        ),
        p2p_broken=o["p2p_broken"],
        grace_period_s=parse_positive_int("--grace-period", o["grace_period"], minimum=30),
        allow_undocumented_nccl=allow_nccl,
        preflight=_preflight(o, rdzv.port),
        image_preloaded=bool(o.get("image_preloaded")),
    )
    _check_mount_targets(spec)
    if o.get("pulls_image"):
        check_pullable(spec, o["pulls_image"], o["image"] is not None, warnings)
    return Built(spec, warnings)


def _nproc_per_node(value: int | None, profile: catalog.Profile, warnings: list[str]) -> int:
    nproc = parse_positive_int("--nproc-per-node", profile.gpus_per_node if value is None else value)
    if nproc > profile.gpus_per_node:
        warnings.append(
            f"--nproc-per-node {nproc} exceeds the {profile.gpus_per_node} GPUs per node of "
            f"profile {profile.name!r}"
        )
    return nproc


def _preflight(o: dict, port: int) -> Preflight:
    fraction = o.get("preflight_min_fraction")
    busbw = o.get("preflight_busbw")
    enabled = bool(o.get("preflight"))
    if fraction is None:
        fraction = defaults.PREFLIGHT_MIN_FRACTION
    elif not 0 < fraction <= 1:
        raise SpecError(f"--preflight-min-fraction {fraction!r}: must be in (0, 1]")
    if busbw is not None and not busbw > 0:
        raise SpecError(f"--preflight-busbw {busbw!r}: must be > 0 (GB/s)")
    if busbw is not None and busbw > limits.MAX_BUSBW_GBPS:
        raise SpecError(f"--preflight-busbw {busbw:g}: more than {limits.MAX_BUSBW_GBPS:g} GB/s")
    if not enabled and (o.get("preflight_min_fraction") is not None or busbw is not None):
        raise SpecError("--preflight-min-fraction / --preflight-busbw need --preflight")
    if enabled and port + PREFLIGHT_PORT_OFFSET > 65535:  # the preflight meets on the next port
        raise SpecError(f"--preflight: its rendezvous uses port {port} + {PREFLIGHT_PORT_OFFSET}, outside 1..65535; "
                        "pick a lower --rdzv-port / --rdzv-endpoint port")
    return Preflight(enabled, float(fraction), None if busbw is None else float(busbw))


def _check_mount_targets(spec: JobSpec) -> None:
    """Every mount point once: docker and enroot refuse a second mount on the same path."""
    seen = {canonical_path(spec.checkpoint_dir): "--checkpoint-dir"}
    for mount in spec.mounts:
        target = canonical_path(mount.target)
        if target in seen:
            raise SpecError(f"--mount {mount.source}:{mount.target}: {mount.target!r} is already mounted "
                            f"({seen[target]})")
        seen[target] = "--mount"


# A port's RoCE GID table is small (NVIDIA's RoCE guide: 128 hardware entries a port on
# ConnectX-3; show_gids lists it): one byte covers every table, 9999 is a typo.
MAX_GID_INDEX = 255


def _gid_index(value: str | None) -> str | None:
    if value is None:
        return None
    if not re.fullmatch(r"-?[0-9]{1,3}", value) or not -1 <= int(value) <= MAX_GID_INDEX:
        raise SpecError(f"--ib-gid-index {value!r}: a GID table index 0..{MAX_GID_INDEX} (show_gids), "
                        "or -1 for NCCL's auto-selection")
    return value
