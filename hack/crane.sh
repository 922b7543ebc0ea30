#!/usr/bin/env bash
# Prints the path of the crane binary (go-containerregistry) that `make image` assembles the image
# with and the release workflow pushes it with, building it from the Go module proxy into the cache
# directory outside git when it is not there yet. `CRANE=/path/to/crane` uses that binary instead.
set -euo pipefail

# The go-containerregistry release. Pinned here and nowhere else.
CRANE_VERSION=v0.22.1

CACHE_DIR=${KUBE_SVM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kube-svm}
OUT="$CACHE_DIR/bin/crane-$CRANE_VERSION/crane"

if [[ -n "${CRANE:-}" ]]; then
  [[ -x "$CRANE" ]] || { echo "crane: CRANE=$CRANE is not an executable" >&2; exit 1; }
  echo "$CRANE"
  exit 0
fi

if [[ ! -x "$OUT" ]]; then
  echo "crane: building $CRANE_VERSION from the Go module proxy" >&2
  started=$SECONDS
  mkdir -p "$(dirname "$OUT")"
  CGO_ENABLED=0 GOTOOLCHAIN=local GOBIN="$(dirname "$OUT")" \
    go install -trimpath -ldflags "-s -w" \
    "github.com/google/go-containerregistry/cmd/crane@$CRANE_VERSION"
  echo "crane: built in $((SECONDS - started))s" >&2
fi
echo "$OUT"
