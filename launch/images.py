"""Container image references: the OCI grammar, enroot's forms (Slurm + pyxis), the registry a
reference names (``registry_host``) and ``--registry``."""

from __future__ import annotations

import re

from core.errors import SpecError
from core.safety import excerpt
from launch import defaults
from launch.spec import check_path, parse_port, valid_host

# OCI / distribution reference grammar (github.com/distribution/reference, regexp.go):
# [HOST[:PORT]/]PATH[:TAG][@DIGEST]; lower-case path components, tags of at most 128 characters.
_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9A-Fa-f:]+\])(?::[0-9]+)?"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_NAME = rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_OCI_REFERENCE = re.compile(rf"(?P<name>{_NAME})(?::{_TAG})?(?:@{_DIGEST})?", re.ASCII)
# enroot (Slurm + pyxis) also takes REGISTRY#IMAGE and a local squashfs file.
_ENROOT_REFERENCE = re.compile(rf"(?:[A-Za-z0-9._-]+@)?{_DOMAIN}#{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
                               rf"(?::{_TAG})?(?:@{_DIGEST})?", re.ASCII)


def parse_image(value: str, enroot: bool = False) -> str:
    """A container image reference; never empty, never an option (``--privileged``)."""
    shown = repr(value) if len(value) <= 100 else repr(value[:100]) + "..."
    if not value:
        raise SpecError("--image is empty")
    if enroot and value.startswith(("/", ".")):  # pyxis: a squashfs file, never a pull
        if _squashfs_file(value):
            return value
        raise SpecError(f"--image {shown}: a squashfs file for Slurm + pyxis is /path/image.sqsh or "
                        "./path/image.sqsh (letters, digits and ._+@=- in each name)")
    match = _OCI_REFERENCE.fullmatch(value)
    ok = match is not None and len(match.group("name")) <= 255
    if not ok and enroot:
        ok = bool(_ENROOT_REFERENCE.fullmatch(value))
    if ok:
        _check_registry(value)
    if not ok:
        hint = " (Slurm + pyxis also take REGISTRY#IMAGE and a squashfs file, /path/image.sqsh or ./image.sqsh)" if enroot else ""
        raise SpecError(
            f"--image {shown}: not an image reference [HOST[:PORT]/]NAME[:TAG][@DIGEST] "
            f"(lower-case name, no spaces, no leading '-'){hint}"
        )
    return value


# A relative squashfs file: pyxis reads an image that starts with '/' or '.' as a file on the node
# (relative to the job's working directory).
_RELATIVE_FILE = re.compile(r"(?:\./(?:\.\./)*|(?:\.\./)+)(?:[A-Za-z0-9_+@=-][A-Za-z0-9._+@=-]*/)*[A-Za-z0-9_+@=-][A-Za-z0-9._+@=-]*")


def _squashfs_file(value: str) -> bool:
    """pyxis's ``--container-image PATH``: a squashfs file, absolute (a mount path's rules) or relative."""
    if value.startswith("/"):
        return check_path("--image", value, writable=False) == value
    return bool(_RELATIVE_FILE.fullmatch(value)) and len(value) <= 4096


def registry_host(value: str) -> str | None:
    """The registry an image reference names, None for a short name that each engine resolves
    its own way (docker: docker.io/library; podman: short-name aliases or an error; enroot: Docker
    Hub): the first path component with a '.' or ':' or ``localhost`` (distribution/reference's
    normalization), enroot's ``[USER@]HOST#``, or a squashfs file (``/path``, ``./path``: not a pull)."""
    if value.startswith(("/", "./", "../")):
        return "file"
    if "#" in value:
        return value.split("#", 1)[0].rsplit("@", 1)[-1]
    head, slash, _ = value.partition("/")
    if slash and ("." in head or ":" in head or head == "localhost"):
        return head
    return None


def parse_registry(value: str | None) -> str | None:
    """``--registry HOST[:PORT][/PATH]``: where ``make push`` put the image; the default image is
    REGISTRY/hopper-train:<image target>, the name ``make build-image push REGISTRY=...`` gives it."""
    if value is None:
        return None
    text = value.rstrip("/")
    probe = f"{text}/{defaults.IMAGE_REPOSITORY}:x"
    if not text or not _OCI_REFERENCE.fullmatch(probe) or registry_host(probe) is None:
        raise SpecError(f"--registry {excerpt(value)}: expected HOST[:PORT][/PATH] (a registry host with a '.' or "
                        "a port, or localhost), e.g. registry.example.com/team")
    try:
        _check_registry(probe)
    except SpecError as exc:
        raise SpecError(f"--registry {excerpt(value)}: {str(exc).split(': ', 1)[-1]}") from None
    return text


def _check_registry(value: str) -> None:
    """The registry host (``HOST[:PORT]/...``, or enroot's ``[USER@]HOST[:PORT]#...``) is a valid
    host name and its port 1..65535; a first path component without '.' or ':' is no registry."""
    if "#" in value:
        head = value.split("#", 1)[0].rsplit("@", 1)[-1]
    elif "/" in value and not value.startswith("/"):
        head = value.split("/", 1)[0]
    else:
        return
    host, _, port = head.rpartition(":") if re.search(r":[0-9]+$", head) else (head, "", "")
    if ("." in head or ":" in head or head.startswith("[")) and not valid_host(host):
        raise SpecError(f"--image {excerpt(head)}: the registry is not a valid host name")
    if port:
        parse_port(int(port), f"--image {excerpt(head)}: registry port")
