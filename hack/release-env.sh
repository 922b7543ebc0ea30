#!/usr/bin/env bash
# Prints, as NAME=value lines for $GITHUB_ENV, what a release publishes and where, after checking
# that the tag being released is Cargo.toml's version: VERSION, IMAGE (the image's repository on
# ghcr.io), CHARTS (the chart's OCI repository) and IMAGE_SOURCE (the image's source label).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/Cargo.toml" | head -n 1)
if [[ "${GITHUB_REF_NAME:-}" != "v$version" ]]; then
  echo "release-env: the tag ${GITHUB_REF_NAME:-(none)} is not v$version, Cargo.toml's version" >&2
  exit 1
fi
# ghcr.io takes lower-case names only.
owner=${GITHUB_REPOSITORY_OWNER,,}
echo "VERSION=$version"
echo "IMAGE=ghcr.io/$owner/kube-svm"
echo "CHARTS=ghcr.io/$owner/charts"
echo "IMAGE_SOURCE=$GITHUB_SERVER_URL/$GITHUB_REPOSITORY"
