#!/usr/bin/env bash
# Prints the path of the promtool the chart's alerts are checked and unit-tested with: $PROMTOOL,
# a promtool on PATH, or the one in Debian's `prometheus` package, unpacked (not installed) into
# the cache directory outside git. Prints nothing, and says why on stderr, when none can be had;
# the tests then say they skipped the check.
set -euo pipefail

CACHE_DIR=${KUBE_SVM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kube-svm}
OUT="$CACHE_DIR/bin/promtool/usr/bin/promtool"

if [[ -n "${PROMTOOL:-}" ]]; then
  [[ -x "$PROMTOOL" ]] || { echo "promtool: PROMTOOL=$PROMTOOL is not an executable" >&2; exit 1; }
  echo "$PROMTOOL"
  exit 0
fi
if command -v promtool >/dev/null; then
  command -v promtool
  exit 0
fi
if [[ ! -x "$OUT" ]]; then
  if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then
    echo "promtool: not on PATH, and no apt-get to fetch Debian's prometheus package" >&2
    exit 0
  fi
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  echo "promtool: fetching Debian's prometheus package" >&2
  if ! (cd "$work" && { apt-get download prometheus >/dev/null 2>&1 \
      || { apt-get update -qq >/dev/null 2>&1 && apt-get download prometheus >/dev/null 2>&1; }; }); then
    echo "promtool: Debian's prometheus package could not be downloaded" >&2
    exit 0
  fi
  mkdir -p "$CACHE_DIR/bin/promtool"
  dpkg-deb -x "$work"/prometheus_*.deb "$work/unpacked"
  install -D -m 0755 "$work/unpacked/usr/bin/promtool" "$OUT"
fi
echo "$OUT"
