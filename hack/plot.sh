#!/usr/bin/env bash
# Draws docs/bench.png from docs/bench.json (written by `make bench`) with matplotlib, installed
# into a virtualenv in the cache the first time.
#
#   hack/plot.sh <bench.json> <out.png>
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE_DIR=${KUBE_SVM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kube-svm}
VENV="$CACHE_DIR/plot-venv"
if [[ ! -x "$VENV/bin/python" ]] || ! "$VENV/bin/python" -c 'import matplotlib' 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet 'matplotlib>=3.8'
fi
"$VENV/bin/python" "$ROOT/hack/plot.py" "$1" "$2"
