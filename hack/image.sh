#!/usr/bin/env bash
# Builds kube-svm's container image without a container engine, for the build machine's
# architecture (linux/amd64 or linux/arm64):
#
#   target/image/      an OCI image layout (oci-layout, index.json, blobs/)
#   target/image.tar   the same image as a `docker save` tarball, named kube-svm:<version>, that
#                      `docker load`, `podman load` and `crane push` take
#
# and prints its digest, which is the same whichever of the two is pushed. The image holds a
# static kube-svm binary (glibc linked in), the CA certificates of the build machine's
# ca-certificates package (kube-svm trusts the system's roots where a kubeconfig names no CA),
# and /etc/passwd and /etc/group naming the nonroot user 65532 it runs as; no shell, nothing else.
# Its entrypoint, `kube-svm controller`, is the one the chart's Deployment relies on.
#
# Reproducible: files carry the commit's time (SOURCE_DATE_EPOCH when set), sorted, owned by
# numbers; the config's only time is that same created time. Two builds of one commit with the
# same toolchain and CA bundle give one digest.
#
# crane (hack/crane.sh) assembles the image, through a registry of its own served in memory on
# a loopback port for the length of the build. Environment:
#   IMAGE_SOURCE  the org.opencontainers.image.source label (the release sets its repository)
#   CA_BUNDLE     the CA certificates to ship (default /etc/ssl/certs/ca-certificates.crt)
#   CARGO         cargo (default cargo); CARGO_TARGET_DIR is honoured
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
CARGO=${CARGO:-cargo}
CRANE=$("$ROOT/hack/crane.sh")
OUT_DIR="$ROOT/target"

log() { echo "image: $*" >&2; }

case "$(uname -m)" in
  x86_64) ARCH=amd64 TRIPLE=x86_64-unknown-linux-gnu ;;
  aarch64) ARCH=arm64 TRIPLE=aarch64-unknown-linux-gnu ;;
  *) log "no image for $(uname -m): build on linux/amd64 or linux/arm64"; exit 1 ;;
esac
for tool in git jq readelf tar; do
  command -v "$tool" >/dev/null || { log "$tool is needed"; exit 1; }
done

VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
REVISION=$(git rev-parse HEAD)
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}
CREATED=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
SOURCE=${IMAGE_SOURCE:-https://github.com/OWNER/kube-svm}
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
[[ -s "$CA_BUNDLE" ]] || { log "no CA bundle at $CA_BUNDLE (Debian's ca-certificates package)"; exit 1; }
if [[ -n "$(git status --porcelain --untracked-files=no)" ]]; then
  log "the work tree has changes: the image is labelled with $REVISION, which does not hold them"
fi

# The binary: glibc linked in statically, paths of the build machine left out.
log "building kube-svm $VERSION for linux/$ARCH"
RUSTFLAGS="-C target-feature=+crt-static --remap-path-prefix=$ROOT=/src --remap-path-prefix=${CARGO_HOME:-$HOME/.cargo}=/cargo" \
  "$CARGO" build --release --locked --target "$TRIPLE" --bin kube-svm
binary="${CARGO_TARGET_DIR:-$ROOT/target}/$TRIPLE/release/kube-svm"
headers=$(readelf --program-headers --dynamic --wide "$binary")
if grep -q -e 'program interpreter' -e '(NEEDED)' <<<"$headers"; then
  log "$binary is linked dynamically: the image has no libraries for it"
  exit 1
fi

work=$(mktemp -d)
registry_pid=
cleanup() {
  local status=$?
  if ((status != 0)) && [[ -s "$work/crane.log" ]]; then
    log "crane said:"
    cat "$work/crane.log" >&2
  fi
  [[ -n "$registry_pid" ]] && kill "$registry_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

# The root filesystem, as distroless's static nonroot image lays it out.
rootfs="$work/rootfs"
install -d -m 0755 "$rootfs/etc/ssl/certs" "$rootfs/home" "$rootfs/usr/local/bin"
install -d -m 0700 "$rootfs/home/nonroot"
install -d -m 1777 "$rootfs/tmp"
install -m 0755 "$binary" "$rootfs/usr/local/bin/kube-svm"
install -m 0644 "$CA_BUNDLE" "$rootfs/etc/ssl/certs/ca-certificates.crt"
printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' \
  'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' \
  'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >"$work/passwd"
printf '%s\n' 'root:x:0:' 'nobody:x:65534:' 'nonroot:x:65532:' >"$work/group"
install -m 0644 "$work/passwd" "$work/group" "$rootfs/etc/"

# One layer: every entry with the commit's time, in name order, owned by root but nonroot's home.
layer="$work/layer.tar"
reproducible=(--sort=name --format=posix --mtime="@$SOURCE_DATE_EPOCH" --numeric-owner
  '--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime')
tar --create --file "$layer" --directory "$rootfs" "${reproducible[@]}" --owner=0 --group=0 \
  --exclude=home/nonroot etc home tmp usr
tar --append --file "$layer" --directory "$rootfs" "${reproducible[@]}" --owner=65532 \
  --group=65532 --no-recursion home/nonroot

# The log exists before the registry does: on a busy machine the loop below may read it before
# the registry's shell has opened it.
: >"$work/registry.log"
"$CRANE" registry serve --address 127.0.0.1:0 2>>"$work/registry.log" &
registry_pid=$!
for _ in $(seq 100); do
  port=$(sed -n 's/.*serving on port \([0-9]*\).*/\1/p' "$work/registry.log")
  [[ -n "$port" ]] && break
  sleep 0.1
done
[[ -n "$port" ]] || { log "crane's registry did not start: $(cat "$work/registry.log")"; exit 1; }
ref="127.0.0.1:$port/kube-svm:$VERSION"
# crane's own log lines (each blob pushed) are shown only when a step fails.
crane() { "$CRANE" "$@" 2>>"$work/crane.log"; }

# Docker's media types: a tarball records none, so `crane push target/image.tar` gives the
# digest of the layout only when the layout uses the ones it assumes.
crane append --new_layer "$layer" --new_tag "$ref" >/dev/null
crane mutate "$ref" --tag "$ref" --set-platform "linux/$ARCH" \
  --entrypoint /usr/local/bin/kube-svm,controller --user 65532:65532 --exposed-ports 2112/tcp \
  --label "org.opencontainers.image.source=$SOURCE" \
  --label "org.opencontainers.image.revision=$REVISION" \
  --label "org.opencontainers.image.version=$VERSION" \
  --label "org.opencontainers.image.title=kube-svm" \
  --label "org.opencontainers.image.licenses=Apache-2.0" >/dev/null
# crane leaves the created times at the zero time; they become the commit's. `crane edit config`
# (not in crane's help yet) replaces the config with what it reads on standard input.
crane config "$ref" |
  jq --compact-output --join-output --arg created "$CREATED" \
    '.created = $created | .history |= map(.created = $created | .created_by = "hack/image.sh")' |
  crane edit config "$ref" --tag "$ref" >/dev/null
# That manifest comes out with its keys sorted; a mutate that changes nothing writes it the way
# every other crane command does, the way a tarball's image gets it too.
crane mutate "$ref" --tag "$ref" >/dev/null

rm -rf "$OUT_DIR/image" "$OUT_DIR/image.tar"
mkdir -p "$OUT_DIR"
crane pull --format=oci "$ref" "$OUT_DIR/image"
# The same image again, unchanged, under the name `docker load` gives it.
crane mutate "$ref" --tag "kube-svm:$VERSION" --output "$OUT_DIR/image.tar" >/dev/null

digest=$(crane digest "$ref")
tarball_digest=$(crane digest --tarball "$OUT_DIR/image.tar")
if [[ "$digest" != "$tarball_digest" ]]; then
  log "target/image.tar holds $tarball_digest, not $digest"
  exit 1
fi
log "target/image/ and target/image.tar: kube-svm:$VERSION linux/$ARCH, $REVISION"
echo "$digest"
