#!/usr/bin/env bash
# Renders the plain manifests committed as config/deploy/kube-svm.yaml from the Helm chart with its
# default values, on standard output. `make manifests` writes the file; a test renders it again and
# fails when the committed copy has drifted from the chart.
#
#   hack/manifests.sh [helm]    helm defaults to what hack/helm.sh provides
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HELM=${1:-$("$ROOT/hack/helm.sh")}
NAMESPACE=kube-svm

cat <<HEADER
# kube-svm: the controller, its RBAC and metrics Service, rendered from charts/kube-svm with the
# default values by \`make manifests\`; do not edit. The CRDs are in config/crd/.
#
#   kubectl apply --server-side -f config/crd/ -f config/deploy/
---
apiVersion: v1
kind: Namespace
metadata:
  name: $NAMESPACE
HEADER
"$HELM" template kube-svm "$ROOT/charts/kube-svm" --namespace "$NAMESPACE" --set crds.install=false
