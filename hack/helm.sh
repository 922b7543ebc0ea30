#!/usr/bin/env bash
# Prints the path of the helm binary the chart is linted, rendered and tested with, building it
# from the Go module proxy into the cache directory outside git when it is not there yet.
# `HELM=/path/to/helm` uses that binary instead.
set -euo pipefail

# The helm release used for linting and rendering. Pinned here and nowhere else.
HELM_VERSION=v3.22.0

CACHE_DIR=${KUBE_SVM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kube-svm}
OUT="$CACHE_DIR/bin/helm-$HELM_VERSION/helm"

if [[ -n "${HELM:-}" ]]; then
  [[ -x "$HELM" ]] || { echo "helm: HELM=$HELM is not an executable" >&2; exit 1; }
  echo "$HELM"
  exit 0
fi

if [[ ! -x "$OUT" ]]; then
  echo "helm: building $HELM_VERSION from the Go module proxy" >&2
  started=$SECONDS
  mkdir -p "$(dirname "$OUT")"
  # helm's go.mod has no replace lines, so `go install` builds it directly.
  CGO_ENABLED=0 GOTOOLCHAIN=local GOBIN="$(dirname "$OUT")" \
    go install -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  echo "helm: built in $((SECONDS - started))s" >&2
fi
echo "$OUT"
