#!/usr/bin/env bash
# Build-time installer shared by docker/Dockerfile.hopper and docker/Dockerfile.blackwell.
# Runs as root inside the image build, from /opt/hopper-train (the WORKDIR).
#
#   install.sh base     torch, only if TORCH_SPEC is set (stand-in bases); records
#                       the versions of the base that must never change afterwards.
#   install.sh deps     the project's Python dependencies (pyproject.toml + EXTRAS)
#                       and the torchao that pairs with the base's torch.
#   install.sh project  the project itself (--no-deps), the non-root user, and the
#                       build-time checks (protected packages unchanged, torchao C++
#                       extensions load).
#
# Inputs (build args, visible here as environment variables):
#   TORCH_SPEC         ""   -> never install torch (NGC: torch ships in the base).
#                      e.g. "torch==2.13.0+cpu" for the offline CPU stand-in base.
#   TORCHAO_SPEC       auto -> keep a torchao the base already ships; otherwise pick
#                              the release that pairs with the base's torch.
#                      none -> do not install torchao.
#                      anything else is passed to pip as the requirement.
#   TORCHAO_CPP_CHECK  strict  -> fail on any sign that torchao's C++ extensions
#                                 did not load ("Skipping import of cpp extensions",
#                                 "Failed to load ...").
#                      version -> fail only on the torch/torchao version mismatch
#                                 (CPU stand-in: its .so files need CUDA libraries).
#                      off     -> no check.
#   EXTRAS             comma-separated extras of pyproject.toml (default train,dev).
#   APP_UID / APP_GID  numeric ids of the non-root run-time user.
# Optional mounts provided by the Dockerfile:
#   /run/secrets/pip_ca  extra CA bundle for pip (BuildKit/podman secret id=pip_ca)
#   /tmp/wheels          find-links directory (named build context "wheels")
set -euo pipefail

phase=${1:-}
SRC=/opt/hopper-train
STATE=/usr/local/share/hopper-train
PY=${PYTHON:-python3}

TORCH_SPEC=${TORCH_SPEC:-}
TORCHAO_SPEC=${TORCHAO_SPEC:-auto}
TORCHAO_CPP_CHECK=${TORCHAO_CPP_CHECK:-strict}
EXTRAS=${EXTRAS:-train,dev}
APP_UID=${APP_UID:-1000}
APP_GID=${APP_GID:-1000}
find_links=()

log() { printf '[install.sh %s] %s\n' "$phase" "$*"; }
die() { printf '[install.sh %s] ERROR: %s\n' "$phase" "$*" >&2; exit 1; }

setup_pip_env() {
    # NGC images (25.03 and later) carry /etc/pip/constraint.txt, which pins every
    # package the base was built with (torch, Transformer Engine, ...). Every pip
    # call below honours it, so no dependency can replace what NGC ships.
    if [[ -z ${PIP_CONSTRAINT:-} && -f /etc/pip/constraint.txt ]]; then
        export PIP_CONSTRAINT=/etc/pip/constraint.txt
    fi
    if [[ -n ${PIP_CONSTRAINT:-} ]]; then
        log "pip constraint file: ${PIP_CONSTRAINT}"
    fi
    # Extra CA bundle for TLS-intercepting proxies; mounted for this RUN step
    # only, never stored in a layer.
    if [[ -s /run/secrets/pip_ca ]]; then
        export PIP_CERT=/run/secrets/pip_ca
        log "pip trusts the CA bundle from the pip_ca build secret"
    fi
    # A Debian/Ubuntu system Python marks itself externally managed (PEP 668). In
    # an image the system interpreter is the application's interpreter.
    local stdlib
    stdlib=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
    if [[ -f "$stdlib/EXTERNALLY-MANAGED" ]]; then
        export PIP_BREAK_SYSTEM_PACKAGES=1
    fi
    export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_ROOT_USER_ACTION=ignore
    if [[ -d /tmp/wheels ]] && compgen -G '/tmp/wheels/*.whl' >/dev/null; then
        find_links=(--find-links /tmp/wheels)
    fi
}

pip_install() { "$PY" -m pip install "${find_links[@]}" "$@"; }

# Versions of what the base provides and we must never replace: torch, Transformer
# Engine, NCCL (pip wheels and the system library), and a base-provided torchao.
protected_snapshot() {
    "$PY" - <<'EOF'
import importlib.metadata as md
import re
pat = re.compile(r"^(torch|transformer[-_]engine.*|nvidia[-_]nccl.*|nccl.*|torchao)$", re.I)
seen = set()
for dist in md.distributions():
    name = dist.metadata["Name"] or ""
    key = re.sub(r"[-_.]+", "-", name).lower()
    if pat.match(name) and key not in seen:
        seen.add(key)
        print(f"{key}=={dist.version}")
EOF
    { ldconfig -p 2>/dev/null || true; } | awk '/libnccl\.so/ {print $NF}' \
        | xargs -r readlink -f | sort -u | sed 's/^/libnccl: /'
}

torch_version() {
    "$PY" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true
}

# torchao release that pairs with a given torch version. torchao >= 0.17 is
# ABI-stable against torch >= 2.11; older torch needs the torchao built against
# it (table: https://github.com/pytorch/ao/issues/2919).
torchao_for_torch() {
    local major minor patch
    read -r major minor patch < <(sed -E 's/^([0-9]+)\.([0-9]+)\.([0-9]+).*/\1 \2 \3/' <<<"$1")
    if ((major > 2 || (major == 2 && minor >= 11))); then echo "torchao>=0.17"
    elif ((major < 2 || minor < 5)); then return 1
    elif ((minor == 10)); then echo "torchao==0.16.0"
    elif ((minor == 9 && patch >= 1)); then echo "torchao==0.15.0"
    elif ((minor == 9)); then echo "torchao==0.14.1"
    elif ((minor == 8)); then echo "torchao==0.13.0"
    else echo "torchao==0.12.0"  # torch 2.5 - 2.7
    fi
}

project_requirements() {
    # Runtime dependencies + requested extras, read from pyproject.toml, so this
    # layer depends on pyproject.toml only and survives source edits.
    # torchao comes from TORCHAO_SPEC (the fp8 extra's floor only fits torch >= 2.11)
    # and Transformer Engine from the base image, so those two extras are skipped.
    "$PY" - "$EXTRAS" <<'EOF'
import sys
import tomllib
with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
reqs = list(project.get("dependencies", []))
optional = project.get("optional-dependencies", {})
for extra in filter(None, (e.strip() for e in sys.argv[1].split(","))):
    if extra in ("fp8", "te"):
        continue
    if extra not in optional:
        sys.exit(f"unknown extra {extra!r}; pyproject.toml has {sorted(optional)}")
    reqs += optional[extra]
print("\n".join(reqs))
EOF
}

phase_base() {
    mkdir -p "$STATE"
    if [[ -n $TORCH_SPEC ]]; then
        log "installing torch from TORCH_SPEC=${TORCH_SPEC} (stand-in bases only)"
        pip_install "$TORCH_SPEC"
    fi
    local tv
    tv=$(torch_version)
    [[ -n $tv ]] || die "no torch in the base image; NGC ships one, a stand-in base needs --build-arg TORCH_SPEC=..."
    log "torch ${tv}"
    protected_snapshot >"$STATE/protected.base"
    log "versions provided by the base (must not change):"
    sed 's/^/    /' "$STATE/protected.base"
}

phase_deps() {
    local tv
    tv=$(torch_version)
    project_requirements >"$STATE/requirements.txt"
    log "project requirements (EXTRAS=${EXTRAS}):"
    sed 's/^/    /' "$STATE/requirements.txt"
    pip_install -r "$STATE/requirements.txt"

    local ao_spec=$TORCHAO_SPEC
    if [[ $ao_spec == auto ]]; then
        if grep -q '^torchao==' "$STATE/protected.base"; then
            ao_spec=""
            log "torchao: keeping the version the base ships"
        else
            ao_spec=$(torchao_for_torch "$tv") \
                || die "no known torchao pairing for torch ${tv}; set TORCHAO_SPEC"
        fi
    elif [[ $ao_spec == none ]]; then
        ao_spec=""
    fi
    if [[ -n $ao_spec ]]; then
        log "installing ${ao_spec} (pairs with torch ${tv})"
        pip_install "$ao_spec"
    fi

    protected_snapshot >"$STATE/protected.expected"
    # What the base provided must stay identical, and no new NCCL / torch / TE
    # may appear; the one allowed change is a torchao installed on purpose above.
    local removed added
    removed=$(comm -23 <(sort "$STATE/protected.base") <(sort "$STATE/protected.expected"))
    added=$(comm -13 <(sort "$STATE/protected.base") <(sort "$STATE/protected.expected"))
    if [[ -n $ao_spec ]]; then
        removed=$(grep -v '^torchao==' <<<"$removed" || true)
        added=$(grep -v '^torchao==' <<<"$added" || true)
    fi
    if [[ -n $removed || -n $added ]]; then
        printf 'before: %s\nafter:  %s\n' "${removed:-<none>}" "${added:-<none>}" >&2
        die "installing dependencies changed torch / Transformer Engine / NCCL of the base"
    fi
}

ensure_user() {
    local name=trainer
    if getent passwd "$APP_UID" >/dev/null; then
        # e.g. the 'ubuntu' user (uid 1000) of Ubuntu-based images: take it over
        local old
        old=$(getent passwd "$APP_UID" | cut -d: -f1)
        if [[ $old != "$name" ]]; then
            usermod --login "$name" --home "/home/$name" "$old"
        fi
    else
        getent group "$APP_GID" >/dev/null || groupadd --gid "$APP_GID" "$name"
        useradd --uid "$APP_UID" --gid "$APP_GID" --home-dir "/home/$name" \
            --no-create-home --shell /bin/bash "$name"
    fi
    mkdir -p "/home/$name" /workspace
    chown "$APP_UID:$APP_GID" "/home/$name" /workspace
}

torchao_check() {
    [[ $TORCHAO_CPP_CHECK == off ]] && { log "torchao C++ extension check: off"; return 0; }
    if ! "$PY" -c 'import importlib.metadata as m; m.version("torchao")' 2>/dev/null; then
        log "torchao not installed; C++ extension check skipped"
        return 0
    fi
    local out
    # torchao reports a skipped extension load through logging (warning or debug).
    out=$("$PY" -W default -c '
import logging
logging.basicConfig(level=logging.DEBUG, format="%(levelname)s:%(name)s:%(message)s")
for noisy in ("matplotlib", "PIL", "filelock", "urllib3"):
    logging.getLogger(noisy).setLevel(logging.WARNING)
import pathlib, torch, torchao
sos = sorted(p.name for p in pathlib.Path(torchao.__file__).parent.glob("_C*.so"))
print(f"torchao {torchao.__version__} with torch {torch.__version__}; compiled extensions: {sos or None}")
' 2>&1) || { printf '%s\n' "$out"; die "import torchao failed"; }
    printf '%s\n' "$out" | grep -v '^DEBUG:' | sed 's/^/    /'
    local bad='Skipping import of cpp extensions|Failed to load .*_C'
    [[ $TORCHAO_CPP_CHECK == version ]] && bad='incompatible torch version'
    if grep -E "$bad" <<<"$out" >&2; then
        die "torchao C++ extensions did not load (TORCHAO_CPP_CHECK=${TORCHAO_CPP_CHECK}): pick the TORCHAO_SPEC that pairs with this torch"
    fi
    log "torchao C++ extension check (${TORCHAO_CPP_CHECK}): ok"
}

phase_project() {
    # setuptools in the base (NGC and Debian ship one) avoids a PyPI round trip
    # for an isolated build environment.
    local iso=()
    if "$PY" -c 'import setuptools, sys; sys.exit(int(setuptools.__version__.split(".")[0]) < 64)' 2>/dev/null; then
        iso=(--no-build-isolation)
    fi
    pip_install --no-deps "${iso[@]}" "$SRC"
    rm -rf "$SRC/build" "$SRC"/*.egg-info
    "$PY" -m pip check || log "WARNING: pip check reports the conflicts above (inherited from the base image?)"

    protected_snapshot >"$STATE/protected.final"
    if ! diff -u "$STATE/protected.expected" "$STATE/protected.final"; then
        die "installing the project changed torch / Transformer Engine / NCCL / torchao"
    fi
    log "torch / Transformer Engine / NCCL untouched"

    torchao_check
    ensure_user
    if ! command -v train >/dev/null || ! command -v launch >/dev/null; then
        die "console scripts train/launch are not on PATH"
    fi
    log "done"
}

main() {
    case $phase in
        base) setup_pip_env; phase_base ;;
        deps) setup_pip_env; phase_deps ;;
        project) setup_pip_env; phase_project ;;
        *) die "usage: install.sh base|deps|project" ;;
    esac
}

# Sourcing the file (tests do) defines the functions without running anything.
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    main
fi
