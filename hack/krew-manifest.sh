#!/usr/bin/env bash
# Prints krew/svm.yaml filled in for a release: its version, homepage, and the URI and sha256 of
# each platform's archive, which the release workflow uploads to the GitHub release.
#
#   hack/krew-manifest.sh <version> <repository URL> <directory holding the archives>
#
# The archives are kube-svm-<version>-linux-<arch>.tar.gz, each holding the kube-svm binary.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VERSION=${1:?a version, such as 0.1.0}
REPOSITORY=${2:?the repository URL, such as https://github.com/OWNER/kube-svm}
DIST=${3:?the directory holding the archives}

fill=(-e "s|{{VERSION}}|$VERSION|g" -e "s|{{HOMEPAGE}}|$REPOSITORY|g")
for arch in amd64 arm64; do
  archive="kube-svm-$VERSION-linux-$arch.tar.gz"
  [[ -f "$DIST/$archive" ]] || { echo "krew-manifest: no $DIST/$archive" >&2; exit 1; }
  sum=$(sha256sum "$DIST/$archive" | cut -d ' ' -f 1)
  upper=${arch^^}
  fill+=(-e "s|{{URI_LINUX_$upper}}|$REPOSITORY/releases/download/v$VERSION/$archive|g")
  fill+=(-e "s|{{SHA256_LINUX_$upper}}|$sum|g")
done
manifest=$(sed "${fill[@]}" "$ROOT/krew/svm.yaml")
if grep -q '{{' <<<"$manifest"; then
  echo "krew-manifest: placeholders left: $(grep -o '{{[A-Z0-9_]*}}' <<<"$manifest" | sort -u | tr '\n' ' ')" >&2
  exit 1
fi
echo "$manifest"
