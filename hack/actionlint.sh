#!/usr/bin/env bash
# Prints the path of the actionlint binary `make lint` checks the GitHub workflows with, building
# it from the Go module proxy into the cache directory outside git when it is not there yet.
# `ACTIONLINT=/path/to/actionlint` uses that binary instead.
set -euo pipefail

# The actionlint release. Pinned here and nowhere else.
ACTIONLINT_VERSION=v1.7.12

CACHE_DIR=${KUBE_SVM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kube-svm}
OUT="$CACHE_DIR/bin/actionlint-$ACTIONLINT_VERSION/actionlint"

if [[ -n "${ACTIONLINT:-}" ]]; then
  [[ -x "$ACTIONLINT" ]] || { echo "actionlint: ACTIONLINT=$ACTIONLINT is not an executable" >&2; exit 1; }
  echo "$ACTIONLINT"
  exit 0
fi

if [[ ! -x "$OUT" ]]; then
  echo "actionlint: building $ACTIONLINT_VERSION from the Go module proxy" >&2
  started=$SECONDS
  mkdir -p "$(dirname "$OUT")"
  CGO_ENABLED=0 GOTOOLCHAIN=local GOBIN="$(dirname "$OUT")" \
    go install -trimpath -ldflags "-s -w" \
    "github.com/rhysd/actionlint/cmd/actionlint@$ACTIONLINT_VERSION"
  echo "actionlint: built in $((SECONDS - started))s" >&2
fi
echo "$OUT"
