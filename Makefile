# kube-svm developer tasks. `make help` lists them.

SHELL := /bin/bash
.DEFAULT_GOAL := help

CARGO ?= cargo

# Lists the targets with the comment that follows each one.
help:
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

build: ## Build the kube-svm binary (debug)
	$(CARGO) build

control-plane: ## Build etcd and kube-apiserver for the tests into ~/.cache/kube-svm (skipped when present)
	hack/control-plane.sh assets

test: ## Run unit and integration tests against a real kube-apiserver and etcd
	KUBEBUILDER_ASSETS="$$(hack/control-plane.sh assets)" $(CARGO) test

bench-engine: ## Measure engine throughput and requests per object on a local control plane
	KUBEBUILDER_ASSETS="$$(hack/control-plane.sh assets)" $(CARGO) bench --bench engine

lint: ## Check formatting and clippy lints
	$(CARGO) fmt --check
	$(CARGO) clippy --all-targets -- -D warnings

crds: ## Regenerate the committed CRDs from the Rust types
	$(CARGO) run --quiet -- crds > config/crd/migration.k8s.io.yaml

.PHONY: help build control-plane test bench-engine lint crds
