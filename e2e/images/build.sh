#!/usr/bin/env bash
# Container images for the real-node tier, built here with buildah (vfs storage, chroot
# isolation: no daemon, no registry) and written as OCI archives that containerd imports.
#
#   e2e/images/build.sh bases             pause, base-cc, base-python: made locally (our
#                                         pause binary, Debian packages, debootstrap),
#                                         cached by key; prints the directory of their tars
#   e2e/images/build.sh operator OUT BIN  the operator image from ./Dockerfile (target
#                                         `prebuilt`, base-cc) around binary BIN -> OUT/operator.tar
#   e2e/images/build.sh worker OUT        the example worker from examples/worker/Dockerfile
#                                         (base-python) -> OUT/worker.tar, cached by its inputs
#
# Image names: localhost/harness-engine/<name>:<tag>; `tag NAME` prints the tag. Missing
# Debian packages (buildah, debootstrap) are installed with apt-get. Progress on stderr.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache_root=${HARNESS_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/harness-engine/e2e}
store=$cache_root/buildah
B=(buildah --root "$store/root" --runroot "$store/run" --storage-driver vfs)
log() { printf 'images: %s\n' "$*" >&2; }

need() { # command package...: apt-get install the packages when the command is missing
  local cmd=$1; shift
  command -v "$cmd" >/dev/null 2>&1 && return 0
  log "installing $* (for $cmd)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" >&2 ||
    { apt-get update >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" >&2; }
}

bases_key() { { cat "$here/build.sh" "$here/pause/"* "$here/base-cc/Dockerfile" "$here/base-python.Dockerfile"; go version; } | sha256sum | cut -c1-12; }

# archive NAME TAG CONTEXT [buildah bud args...]: build and write $out/NAME.tar
archive() {
  local name=$1 tag=$2 ctx=$3 started=$SECONDS; shift 3
  local img=localhost/harness-engine/$name:$tag
  "${B[@]}" bud --quiet --isolation chroot --layers=false -t "$img" "$@" "$ctx" >/dev/null
  rm -f "$out/$name.tar"
  "${B[@]}" push --quiet "$img" "oci-archive:$out/$name.tar:$img" >/dev/null
  log "$img built in $((SECONDS - started))s ($(du -h "$out/$name.tar" | cut -f1))"
}

bases() {
  local key; key=$(bases_key)
  out=$cache_root/images-$key
  if [[ -f $out/.complete ]]; then echo "$out"; return 0; fi
  need buildah buildah
  need debootstrap debootstrap
  mkdir -p "$out"
  local work; work=$(mktemp -d "$cache_root/images-build.XXXXXX")
  trap 'rm -rf "$work"' RETURN
  # pause: a static Go binary.
  mkdir -p "$work/pause"
  cp "$here/pause/Dockerfile" "$work/pause/"
  (cd "$here/pause" && CGO_ENABLED=0 GOTOOLCHAIN=local go build -trimpath -ldflags "-s -w" -o "$work/pause/pause" .)
  archive pause "$key" "$work/pause"
  # base-cc: glibc and libgcc from Debian's packages (the versions the host links
  # against), the CA bundle, nonroot in /etc/passwd, a sticky /tmp.
  local r=$work/cc/rootfs; mkdir -p "$r" "$work/debs"
  (cd "$work/debs" && apt-get download libc6 libgcc-s1 >/dev/null 2>&1) ||
    { apt-get update >&2 && (cd "$work/debs" && apt-get download libc6 libgcc-s1 >/dev/null); }
  local d; for d in "$work"/debs/*.deb; do dpkg-deb -x "$d" "$r"; done
  rm -rf "$r/usr/share/doc" "$r/usr/share/lintian" "$r/usr/share/locale" "$r/usr/lib/x86_64-linux-gnu/gconv"
  mkdir -p "$r/etc/ssl/certs" "$r/tmp" "$r/home/nonroot"
  cp /etc/ssl/certs/ca-certificates.crt "$r/etc/ssl/certs/"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$r/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n' >"$r/etc/group"
  chmod 1777 "$r/tmp"; chown 65532:65532 "$r/home/nonroot"
  cp "$here/base-cc/Dockerfile" "$work/cc/"
  archive base-cc "$key" "$work/cc"
  # base-python: Debian trixie minbase with Python 3.13 and venv (the lock needs 3.12+).
  local started=$SECONDS
  mkdir -p "$work/py"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates trixie "$work/py/rootfs" \
    "${HARNESS_E2E_DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$work/debootstrap.log" 2>&1 ||
    { tail -20 "$work/debootstrap.log" >&2; return 1; }
  rm -rf "$work/py/rootfs/var/cache/apt/archives/"*.deb "$work/py/rootfs/var/lib/apt/lists/"* "$work/py/rootfs/usr/share/doc" "$work/py/rootfs/usr/share/man"
  log "debootstrap trixie: $((SECONDS - started))s"
  cp "$here/base-python.Dockerfile" "$work/py/Dockerfile"
  archive base-python "$key" "$work/py"
  touch "$out/.complete"
  echo "$out"
}

# load_bases: the base images into buildah's store (a no-op when already there).
load_bases() {
  local dir key n; dir=$(bases); key=$(bases_key)
  for n in pause base-cc base-python; do
    "${B[@]}" inspect --type image "localhost/harness-engine/$n:$key" >/dev/null 2>&1 ||
      "${B[@]}" pull --quiet "oci-archive:$dir/$n.tar" >/dev/null
  done
}

case ${1:-} in
  bases) bases ;;
  tag) bases_key ;;
  operator)
    out=${2:?usage: build.sh operator OUT BIN}; bin=${3:?usage: build.sh operator OUT BIN}
    mkdir -p "$out"; load_bases
    ctx=$(mktemp -d); trap 'rm -rf "$ctx"' EXIT
    cp "$bin" "$ctx/harness-engine"; strip "$ctx/harness-engine" 2>/dev/null || true
    version=${VERSION:-$(cd "$repo" && git describe --always --dirty 2>/dev/null || echo dev)}
    archive operator "${TAG:-dev}" "$ctx" -f "$repo/Dockerfile" --target prebuilt \
      --build-arg "BASE_IMAGE=localhost/harness-engine/base-cc:$(bases_key)" \
      --build-arg "VERSION=$version" --build-arg "REVISION=$(cd "$repo" && git rev-parse HEAD 2>/dev/null || echo unknown)"
    ;;
  worker)
    out=${2:?usage: build.sh worker OUT}
    mkdir -p "$out"; load_bases
    wkey=$( { bases_key; cat "$repo/examples/worker/"* ; tar -C "$repo/clients/python" --sort=name --mtime=@0 --owner=0 --group=0 \
      --exclude=__pycache__ --exclude='*.egg-info' -cf - src pyproject.toml requirements.lock; } | sha256sum | cut -c1-12)
    cached=$cache_root/worker-$wkey.tar
    if [[ ! -f $cached ]]; then
      ctx=$(mktemp -d); trap 'rm -rf "$ctx"' EXIT
      mkdir -p "$ctx/clients" "$ctx/examples"
      cp -R "$repo/clients/python" "$ctx/clients/"; cp -R "$repo/examples/worker" "$ctx/examples/"
      find "$ctx" -name __pycache__ -prune -exec rm -rf {} + ; rm -rf "$ctx/clients/python/"*.egg-info "$ctx/clients/python/src/"*.egg-info
      # The wheels, downloaded on the host (its pip configuration reaches the index; the
      # image's Python 3.13 on manylinux x86_64), so the build itself needs no network.
      py=python3
      for c in "$(pyenv root 2>/dev/null || echo /nonexistent)"/versions/3.1[3-9]*/bin/python3 python3.13; do
        "$c" -m pip --version >/dev/null 2>&1 && { py=$c; break; }
      done
      "$py" -m pip download -q --dest "$ctx/examples/worker/wheels" --only-binary=:all: --python-version 3.13 \
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_34_x86_64 \
        -c "$repo/clients/python/requirements.lock" -r "$repo/examples/worker/requirements.txt" "setuptools>=69" >&2
      archive worker "${TAG:-dev}" "$ctx" -f "$ctx/examples/worker/Dockerfile" \
        --build-arg "BASE_IMAGE=localhost/harness-engine/base-python:$(bases_key)" --build-arg "VERSION=$wkey" --build-arg OFFLINE=true
      cp "$out/worker.tar" "$cached.tmp" && mv "$cached.tmp" "$cached"
    else
      cp "$cached" "$out/worker.tar"
    fi
    ;;
  *) echo "usage: $0 bases | tag | operator OUT BIN | worker OUT" >&2; exit 2 ;;
esac
