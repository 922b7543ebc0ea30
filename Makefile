# kube-svm developer tasks. `make help` lists them.

SHELL := /bin/bash
.DEFAULT_GOAL := help

CARGO ?= cargo

# What the tests, the bench and the demo run against: etcd and kube-apiserver built from Go
# modules, and helm, all cached outside git (hack/control-plane.sh, hack/helm.sh).
ASSETS = KUBEBUILDER_ASSETS="$$(hack/control-plane.sh assets)" HELM="$$(hack/helm.sh)" PROMTOOL="$$(hack/promtool.sh)"

# Lists the targets with the comment that follows each one.
help:
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

demo: ## Show kube-svm migrating a CRD on a local control plane, with the proof from etcd
	$(CARGO) build --release --bin kube-svm --example demo
	$(ASSETS) KUBE_SVM_BINARY=target/release/kube-svm target/release/examples/demo

test: image ## Run unit and integration tests against a real kube-apiserver and etcd
	$(ASSETS) KUBE_SVM_IMAGE_LAYOUT=target/image $(CARGO) test

unit: ## Run the pure tests only: seconds, nothing to build but kube-svm
	$(CARGO) test --lib --bins

build: ## Build the kube-svm binary (debug)
	$(CARGO) build

PREFIX ?= $(HOME)/.local

install: ## Install kube-svm and the kubectl plugin link kubectl-svm into $(PREFIX)/bin
	$(CARGO) build --release --bin kube-svm
	install -D -m 0755 target/release/kube-svm $(PREFIX)/bin/kube-svm
	ln -sf kube-svm $(PREFIX)/bin/kubectl-svm

image: ## Build the container image without a container engine: target/image/ (OCI layout) and target/image.tar
	CARGO=$(CARGO) hack/image.sh

control-plane: ## Build etcd and kube-apiserver for the tests into ~/.cache/kube-svm (skipped when present)
	hack/control-plane.sh assets

helm: ## Build helm for the chart's checks into ~/.cache/kube-svm (skipped when present)
	hack/helm.sh

# The bench also runs kube-controller-manager (the in-tree migrator); the plot needs matplotlib,
# installed into a virtualenv in the cache.
BENCH_ASSETS = KUBEBUILDER_ASSETS="$$(hack/control-plane.sh bench-assets)" HELM="$$(hack/helm.sh)"

bench: ## Compare kube-svm with the apiserver's limit and its peers; writes docs/bench.{md,json,png}
	$(BENCH_ASSETS) $(CARGO) bench --bench compare
	$(ASSETS) $(CARGO) bench --bench sweep
	hack/plot.sh docs/bench.json docs/bench.png

lint: ## Check formatting, clippy lints, the Helm chart and the GitHub workflows
	$(CARGO) fmt --check
	$(CARGO) clippy --all-targets -- -D warnings
	"$$(hack/helm.sh)" lint --strict charts/kube-svm
	"$$(hack/actionlint.sh)"

crds: ## Regenerate the committed CRDs (config/ and the chart's template) from the Rust types
	$(CARGO) run --quiet -- crds > config/crd/migration.k8s.io.yaml
	$(CARGO) run --quiet -- crds --chart-template > charts/kube-svm/templates/crds.yaml

manifests: crds ## Regenerate config/deploy/ from the Helm chart
	hack/manifests.sh > config/deploy/kube-svm.yaml

.PHONY: help demo test unit build install image control-plane helm bench lint crds manifests
