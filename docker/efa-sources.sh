#!/usr/bin/env bash
# Puts the libfabric and aws-ofi-nccl source tarballs that the EFA image variants build
# from into OUT_DIR (default build/efa-src), at the versions pinned in docker/efa-versions.env,
# and writes OUT_DIR/SOURCES (name, tag, commit, sha256, origin).
#
#   docker/efa-sources.sh [OUT_DIR]
#
# Where the sources come from, per project:
#   docker/efa-src/                    the vendored tarball, when its SOURCES line names the pin
#                                      and its sha256 matches (what CI uses: it reaches no GitHub);
#   LIBFABRIC_GIT / AWS_OFI_NCCL_GIT   a local git clone or mirror: `git archive <tag>`,
#                                      after checking that the tag points at the pinned commit;
#   otherwise                          GitHub's archive of the tag (curl), e.g.
#                                      https://github.com/aws/aws-ofi-nccl/archive/refs/tags/v1.21.1.tar.gz
# Both are plain source trees (no generated `configure`): docker/efa.sh runs autogen.sh.
# An existing tarball whose SOURCES line matches the pin is kept (no download).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:-$REPO/build/efa-src}
# shellcheck source=/dev/null  # docker/efa-versions.env
source "$REPO/docker/efa-versions.env"

die() { printf 'efa-sources.sh: %s\n' "$*" >&2; exit 2; }

# record NAME LINE: OUT/SOURCES gets LINE as NAME's one line
record() {
    touch "$OUT/SOURCES"
    grep -v "^$1 " "$OUT/SOURCES" >"$OUT/SOURCES.new" || true
    printf '%s\n' "$2" >>"$OUT/SOURCES.new"
    mv "$OUT/SOURCES.new" "$OUT/SOURCES"
}

# vendored NAME TAG COMMIT TARBALL: copy docker/efa-src's tarball when its SOURCES line names
# this pin and its sha256 matches (the repository carries them: CI reaches no GitHub)
vendored() {
    local name=$1 tag=$2 commit=$3 tarball=$4 src line sha
    src=$REPO/docker/efa-src/$name-${tag#v}.tar.gz
    [[ -s $src && -f $REPO/docker/efa-src/SOURCES ]] || return 1
    line=$(grep "^$name $tag $commit " "$REPO/docker/efa-src/SOURCES") || return 1
    sha=$(cut -d' ' -f4 <<<"$line")
    [[ $(sha256sum "$src" | cut -d' ' -f1) == "$sha" ]] || die "$src does not match its sha256 in docker/efa-src/SOURCES"
    cp "$src" "$tarball"
    record "$name" "$line (vendored: docker/efa-src)"
    echo "vendored: $tarball"
}

# fetch NAME GITHUB_REPO TAG COMMIT GIT_DIR: OUT/NAME-<version>.tar.gz
fetch() {
    local name=$1 gh=$2 tag=$3 commit=$4 git_dir=$5 tarball tmp got origin
    tarball=$OUT/$name-${tag#v}.tar.gz
    if [[ -s $tarball && -f $OUT/SOURCES ]] && grep -q "^$name $tag $commit " "$OUT/SOURCES"; then
        echo "cached: $tarball"
        return 0
    fi
    if vendored "$name" "$tag" "$commit" "$tarball"; then
        return 0
    fi
    tmp=$(mktemp -d)
    if [[ -n $git_dir ]]; then
        got=$(git -C "$git_dir" rev-parse --verify --quiet "$tag^{commit}") \
            || die "$git_dir has no tag $tag"
        [[ $got == "$commit" ]] || die "$name $tag is $got in $git_dir, pinned $commit"
        git -C "$git_dir" archive --format=tar --prefix="$name-${tag#v}/" "$tag" | tar -x -C "$tmp"
        origin="git archive $tag of $git_dir"
    else
        command -v curl >/dev/null || die "curl not found; set ${name^^}_GIT to a local clone"
        curl -fsSL "https://github.com/$gh/archive/refs/tags/$tag.tar.gz" | tar -xz -C "$tmp"
        mv "$tmp"/*/ "$tmp/$name-${tag#v}.tmp" && mv "$tmp/$name-${tag#v}.tmp" "$tmp/$name-${tag#v}"
        origin="https://github.com/$gh/archive/refs/tags/$tag.tar.gz"
    fi
    # aws-ofi-nccl's autogen reads its version from git or from .release_version
    printf '%s\n' "${tag#v}" >"$tmp/$name-${tag#v}/.release_version"
    tar -C "$tmp" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -czf "$tarball" "$name-${tag#v}"
    rm -rf "$tmp"
    record "$name" "$name $tag $commit $(sha256sum "$tarball" | cut -d' ' -f1) $origin"
    echo "wrote: $tarball ($origin)"
}

mkdir -p "$OUT"
fetch libfabric ofiwg/libfabric "$LIBFABRIC_VERSION" "$LIBFABRIC_COMMIT" "${LIBFABRIC_GIT:-}"
fetch aws-ofi-nccl aws/aws-ofi-nccl "$AWS_OFI_NCCL_VERSION" "$AWS_OFI_NCCL_COMMIT" "${AWS_OFI_NCCL_GIT:-}"
