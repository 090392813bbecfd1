# nodeguard: `make test` runs everything CI runs.
GO ?= go
OPA := $(GO) tool opa
GATOR := $(GO) tool gator
# Regal has its own tools module: it does not build against OPA v1.22's deps.
REGAL := $(GO) tool -modfile=tools/regal/go.mod regal
# Bundle revision: the template version, then the commit (CHANGELOG.md).
REVISION ?= $(shell $(GO) run ./internal/cmd/generate -version)+$(shell git rev-parse --short=12 HEAD 2>/dev/null)
SIGNING_KEY ?=
COVERAGE_MIN ?= 95
# Randomized scenarios per constraint variant in the differential test.
SCENARIOS ?= 2000

# Everything builds as the image does (static, no file paths), so the image
# test links from the packages the tests compiled instead of compiling all of
# nodeguard's dependencies again; only the race detector needs cgo (race).
export CGO_ENABLED := 0
export GOFLAGS := $(strip $(filter-out -trimpath,$(GOFLAGS)) -trimpath)

.PHONY: test lint policy-test generate generate-check release-artifacts gatekeeper-test rules go-test race fuzz differential load e2e demo bundle bench bench-apiserver bench-fleet

PHASES := lint policy-test generate-check gatekeeper-test rules go-test race fuzz differential load e2e
PHASES += chart
# Each phase in turn, with its time, so a slow CI run says where it went.
test:
	@for phase in $(PHASES); do start=$$(date +%s); $(MAKE) --no-print-directory $$phase || exit 1; \
	echo "== $$phase took $$(( $$(date +%s) - start )) s"; done

# OPA's capabilities plus Gatekeeper's external_data builtin (declared in
# policies/gatekeeper.capabilities.json), which the K8sNodeGuardExternal entry
# point calls: opa check and opa test need it declared.
OPA_CAPABILITIES := build/opa-capabilities.json
.PHONY: $(OPA_CAPABILITIES)
$(OPA_CAPABILITIES):
	@mkdir -p build
	@$(OPA) capabilities --current > build/opa-capabilities.base.json
	@$(OPA) eval -f raw -i build/opa-capabilities.base.json -d policies/gatekeeper.capabilities.json \
		'json.marshal(object.union(input, {"builtins": array.concat(input.builtins, data.builtins)}))' > $@

lint: $(OPA_CAPABILITIES)
	@echo "== lint: opa fmt, opa check --strict, regal, gofmt, go vet"
	@out="$$($(OPA) fmt -l policies)"; if [ -n "$$out" ]; then echo "opa fmt would change: $$out" >&2; $(OPA) fmt -d policies; exit 1; fi
	$(OPA) check --strict --capabilities $(OPA_CAPABILITIES) policies
	$(REGAL) lint policies
	@out="$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))"; if [ -n "$$out" ]; then echo "gofmt would change: $$out" >&2; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags e2e ./tests/e2e/ ./internal/cmd/demo/
	$(GO) -C tools/promtool vet ./promqlnames

policy-test: $(OPA_CAPABILITIES)
	@echo "== opa test (with coverage)"
	$(OPA) test --capabilities $(OPA_CAPABILITIES) policies
	$(OPA) test --coverage --capabilities $(OPA_CAPABILITIES) policies | $(GO) run ./internal/cmd/coverage -min $(COVERAGE_MIN)

generate:
	$(GO) run ./internal/cmd/generate

# The clusterctl add-on provider's release artifacts (docs/install.md, "clusterctl").
release-artifacts:
	$(GO) run ./internal/cmd/release -out build/release

generate-check:
	@echo "== generated files (constraints/, docs/policy.md, docs/decisions.md, versions) match policies/"
	$(GO) run ./internal/cmd/generate -check

gatekeeper-test:
	@echo "== gator verify and sync test"
	$(GATOR) verify constraints/
	$(GATOR) sync test --force-omit-gvk-manifest -n constraints/template.yaml -n constraints/syncset.yaml
	$(GATOR) sync test --force-omit-gvk-manifest -n constraints/template.yaml -n constraints/config.yaml

# The alerts (internal/monitoring): promtool's rule unit tests, and every
# alert and dashboard query parsed and checked against the metrics nodeguard
# exports. promtool has its own tools module; its first build takes minutes,
# so it is built here, outside a test's timeout. remove_all_sd (Prometheus'
# build tag) leaves out every service discovery, which rule checks and tests
# never use: measured cold, 194 s of CPU to build promtool, the whole phase 438 s without.
PROMTOOL_GOFLAGS := $(strip $(GOFLAGS) -tags=remove_all_sd)
PROMTOOL := GOFLAGS="$(PROMTOOL_GOFLAGS)" $(GO) tool -modfile=tools/promtool/go.mod promtool
rules:
	@echo "== alerts: promtool check and test rules; queries read exported metrics; a runbook per alert"
	$(PROMTOOL) --version > /dev/null
	$(GO) test -count=1 ./internal/monitoring/

go-test:
	@echo "== go test (kustomize render, bundle build+sign+verify, Gatekeeper engine, enforcer, CLI)"
	$(GO) test $$($(GO) list ./... | grep -v -e /tests/differential -e /internal/monitoring)

# Every package of the enforcer whose code holds a lock or an atomic (it
# imports sync or sync/atomic), found by go list rather than named by hand,
# again under the race detector.
RACE_PKGS = $$($(GO) list -f '{{.ImportPath}} {{join .Imports " "}}' ./enforcer/... | awk '/ sync( |$$)| sync\/atomic( |$$)/ {print $$1}')
race:
	@echo "== go test -race (every enforcer package that imports sync or sync/atomic)"
	@pkgs="$(RACE_PKGS)"; [ -n "$$pkgs" ] || { echo "race: go list found no package" >&2; exit 1; }; \
		echo CGO_ENABLED=1 $(GO) test -race $$pkgs; CGO_ENABLED=1 $(GO) test -race $$pkgs

differential:
	@echo "== differential: enforcer vs Gatekeeper's engine (synced data, and nodeguard as its external data provider); the narrowed orphan judge and the verdicts written on the Nodes vs full passes"
	$(GO) test -count=1 -v ./tests/differential/ -args -scenarios $(SCENARIOS)

# A bounded fuzz run of the webhook's request decoding. Minimizing each new
# input for the default 60s stalls the run (one exec a second here), so new
# inputs are kept as found. The budget is a count, not a duration: with a
# duration, Go 1.26's coordinator can fail the run with "context deadline
# exceeded" at the deadline, no input at fault (golang/go#75804, fixed in 1.27).
FUZZTIME ?= 50000x
fuzz:
	@echo "== fuzz: FuzzValidate, $(FUZZTIME) executions"
	$(GO) test ./enforcer/admission/ -run '^$$' -fuzz FuzzValidate -fuzztime $(FUZZTIME) -fuzzminimizetime 1x

# End to end on a real kube-apiserver and etcd, built from Go modules by
# tests/e2e/tools/build.sh into the user cache (cold: minutes; then seconds).
e2e:
	@echo "== e2e: kube-apiserver + etcd + nodeguard serve + Gatekeeper + the Cluster API manager"
	@mkdir -p build; start=$$(date +%s); bin=$$(bash tests/e2e/tools/build.sh) && echo "e2e tools ready in $$(( $$(date +%s) - start )) s: $$bin" && \
	{ NODEGUARD_E2E_BIN=$$bin $(GO) test -tags e2e -count=1 -v -timeout 30m ./tests/e2e/ ./internal/cmd/demo/; echo $$? > build/e2e.rc; } 2>&1 | tee build/e2e.log && \
	if [ "$$(cat build/e2e.rc)" != 0 ]; then \
		bash tests/e2e/tools/failures.sh build/e2e.log; exit 1; fi && \
	echo "== e2e: API-server benchmark, smoke size" && \
	NODEGUARD_E2E_BIN=$$bin $(GO) test -tags e2e -count=1 ./tests/apibench/ -run '^$$' -bench . -benchtime 5x -args -sizes 100 -release-nodes 20 -revoke-nodes 10 -policy-rounds 2 -policy-requests 5

# The README's "Try it": a narrated replay of scenarios 2 and 9 on a local
# kube-apiserver with nodeguard as its webhook and the real CAPI manager
# (builds the binaries first).
demo:
	@bin=$$(bash tests/e2e/tools/build.sh) && $(GO) run ./internal/cmd/demo -bin "$$bin"

# A bounded load run: LOAD_REQUESTS AdmissionReviews over TLS on loopback
# against a cache of LOAD_MACHINES Machines; prints decisions/s and p50/p99.
LOAD_REQUESTS ?= 5000
LOAD_MACHINES ?= 10000
LOAD_PARALLELISM ?= 4
# The live path: reviews of LOAD_FRESH_REQUESTS Node deletes, each re-reading
# its Machine and DockerMachine from a real API server.
LOAD_FRESH_REQUESTS ?= 600
load:
	@echo "== load: webhook over TLS on loopback"
	$(GO) test ./tests/load/ -run '^$$' -bench 'Webhook$$' -benchtime $(LOAD_REQUESTS)x -timeout 10m -args -machines $(LOAD_MACHINES) -parallelism $(LOAD_PARALLELISM)
	@echo "== load: the live path, fresh reads from a real kube-apiserver at the shipped client rate limits"
	@bin=$$(bash tests/e2e/tools/build.sh) && NODEGUARD_E2E_BIN=$$bin $(GO) test ./tests/load/ -run '^$$' -bench 'WebhookFresh' -benchtime $(LOAD_FRESH_REQUESTS)x -timeout 10m -args -parallelism $(LOAD_PARALLELISM)

bundle:
	@mkdir -p build
	$(GO) run ./internal/cmd/bundle -o build/nodeguard-bundle.tar.gz -revision "$(REVISION)" $(if $(SIGNING_KEY),-signing-key "$(SIGNING_KEY)")

# What a Node DELETE costs through the real API server with no webhook,
# nodeguard serve (with and without fresh reads) and Gatekeeper, at fleet
# sizes; start-up time and RSS of nodeguard (docs/performance.md). Gatekeeper
# is measured up to 10,000 Machines.
# The deletes run back to back; two fresh reads per decision would then hit
# nodeguard's own client limit (100/s) and measure that, not one delete, so
# the limit is raised here (APIBENCH_NODEGUARD_ARGS= measures the shipped one).
APIBENCH_SIZES ?= 1000,10000,50000
APIBENCH_REQUESTS ?= 200
APIBENCH_NODEGUARD_ARGS ?= --kube-api-qps=2000 --kube-api-burst=4000
bench-apiserver:
	@bin=$$(bash tests/e2e/tools/build.sh) && \
	NODEGUARD_E2E_BIN=$$bin $(GO) test -tags e2e -count=1 ./tests/apibench/ -run '^$$' -bench 'NodeDelete|ReleaseLatency|AdmissionPolicyAdded' -benchtime $(APIBENCH_REQUESTS)x -timeout 120m \
		-args -sizes $(APIBENCH_SIZES) -nodeguard-args "$(APIBENCH_NODEGUARD_ARGS)"

# Decision latency and cache memory, enforcer next to Gatekeeper's engine
# (see docs/performance.md). Gatekeeper at 50k Machines takes minutes.
BENCH_SIZES ?= 100,1000,10000,50000
bench:
	$(GO) test ./tests/bench/ -run '^$$' -bench 'CPUBaseline' -benchtime 5000x
	$(GO) test ./tests/bench/ -run '^$$' -bench 'Decision/enforcer' -benchtime 2000x -timeout 60m -args -sizes $(BENCH_SIZES)
	$(GO) test ./tests/bench/ -run '^$$' -bench 'Decision/gatekeeper' -benchtime 5x -timeout 60m -args -sizes $(BENCH_SIZES)
	$(GO) test ./tests/bench/ -run '^$$' -bench 'CacheMemory' -benchtime 1x -timeout 60m -args -sizes $(BENCH_SIZES)

# The orphan scan at fleet size (docs/performance.md, docs/orphans.md): 50,000
# Nodes in 10 simulated workload API servers, a window of FLEET_WINDOW with
# nothing changing (11m holds the scan's own full pass), ~3 minutes plus it.
FLEET_WINDOW ?= 2m
bench-fleet:
	$(GO) test ./tests/fleet/ -run '^$$' -bench 'OrphanFleet|FleetGuard' -benchtime 1x -timeout 60m -v -args -window $(FLEET_WINDOW)

# The container image, built without a Docker daemon (internal/cmd/image):
# an OCI layout in build/image holding one index for linux/amd64 and
# linux/arm64. Everything is fixed by the commit, so two builds of one commit
# give one digest: the last line printed. A work tree with uncommitted changes
# gets a -dirty version.
IMAGE_VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
IMAGE_REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
IMAGE_FLAGS = -o build/image -version $(IMAGE_VERSION) -revision $(IMAGE_REVISION) -source-date-epoch $(SOURCE_DATE_EPOCH)
.PHONY: image image-push image-pin chart
IMAGE_PLATFORMS ?= linux/amd64,linux/arm64
image:
	@echo "== the image test for $(IMAGE_PLATFORMS) (make test builds linux/amd64 only)"
	$(GO) test -count=1 ./internal/cmd/image/ -run TestImageIsReproducibleAndRuns -args -image-platforms $(IMAGE_PLATFORMS)
	@$(GO) run ./internal/cmd/image $(IMAGE_FLAGS) -platforms $(IMAGE_PLATFORMS)

# Pushes the same index to $(REGISTRY)/nodeguard:$(IMAGE_VERSION) (docker's
# credential config is used for the login).
image-push:
	@test -n "$(REGISTRY)" || { echo "usage: make image-push REGISTRY=registry.example.com/team" >&2; exit 1; }
	@$(GO) run ./internal/cmd/image $(IMAGE_FLAGS) -push $(REGISTRY)/nodeguard:$(IMAGE_VERSION)

# Points the chart (charts/nodeguard/values.yaml) and the kustomization
# (enforcer/deploy) at $(REGISTRY)/nodeguard:$(IMAGE_VERSION)@<digest>, the one
# place both take the image from; commit the result with the release.
image-pin:
	@test -n "$(REGISTRY)" || { echo "usage: make image-pin REGISTRY=registry.example.com/team" >&2; exit 1; }
	@$(GO) run ./internal/cmd/image $(IMAGE_FLAGS) -pin $(REGISTRY)/nodeguard

# The Helm chart, through the pinned helm of tools/helm (its own module, as
# Regal). charts/chart_test.go (in go-test) checks it against enforcer/deploy.
HELM := $(GO) tool -modfile=tools/helm/go.mod helm
chart:
	@echo "== helm lint and template"
	$(HELM) lint --strict charts/nodeguard
	$(HELM) template nodeguard charts/nodeguard --namespace nodeguard-system > /dev/null
