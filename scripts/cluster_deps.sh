#!/usr/bin/env bash
# Install what the emulated-cluster tests (make test-cluster) need, only when missing:
# iproute2 (ip, tc), util-linux (unshare), Debian's slurm-wlm + slurm-client, munge.
# One `apt-get update` before the install; nothing is done when everything is present.
set -euo pipefail
missing=()
need() { command -v "$1" >/dev/null 2>&1 || missing+=("$2"); }
need ip iproute2
need tc iproute2
need unshare util-linux
need slurmctld slurm-wlm
need slurmd slurm-wlm
need sbatch slurm-client
need munged munge
need mungekey munge
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi
mapfile -t packages < <(printf '%s\n' "${missing[@]}" | sort -u)
if [[ $(id -u) -ne 0 ]]; then
  echo "cluster tests need ${packages[*]} (apt-get install as root); the tests will skip" >&2
  exit 0
fi
echo "installing ${packages[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${packages[@]}"
