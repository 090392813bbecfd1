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

.PHONY: test lint policy-test generate generate-check gatekeeper-test go-test race fuzz differential load e2e demo bundle bench

PHASES := lint policy-test generate-check gatekeeper-test go-test race fuzz differential load e2e
# Each phase in turn, with its time, so a slow CI run says where it went.
test:
	@for phase in $(PHASES); do start=$$(date +%s); $(MAKE) --no-print-directory $$phase || exit 1; \
	echo "== $$phase took $$(( $$(date +%s) - start )) s"; done

lint:
	@echo "== lint: opa fmt, opa check --strict, regal, gofmt, go vet"
	@out="$$($(OPA) fmt -l policies)"; if [ -n "$$out" ]; then echo "opa fmt would change: $$out" >&2; $(OPA) fmt -d policies; exit 1; fi
	$(OPA) check --strict policies
	$(REGAL) lint policies
	@out="$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))"; if [ -n "$$out" ]; then echo "gofmt would change: $$out" >&2; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags e2e ./tests/e2e/ ./internal/cmd/demo/

policy-test:
	@echo "== opa test (with coverage)"
	$(OPA) test policies
	$(OPA) test --coverage policies | $(GO) run ./internal/cmd/coverage -min $(COVERAGE_MIN)

generate:
	$(GO) run ./internal/cmd/generate

generate-check:
	@echo "== generated files (constraints/, docs/policy.md, docs/decisions.md, versions) match policies/"
	$(GO) run ./internal/cmd/generate -check

gatekeeper-test:
	@echo "== gator verify and sync test"
	$(GATOR) verify constraints/
	$(GATOR) sync test --force-omit-gvk-manifest -n constraints/template.yaml -n constraints/syncset.yaml
	$(GATOR) sync test --force-omit-gvk-manifest -n constraints/template.yaml -n constraints/config.yaml

go-test:
	@echo "== go test (kustomize render, bundle build+sign+verify, Gatekeeper engine, enforcer, CLI)"
	$(GO) test $$($(GO) list ./... | grep -v /tests/differential)

# The concurrent paths (webhook under parallel reviews, informers, guard)
# again under the race detector.
race:
	@echo "== go test -race (webhook, serve, guard, informers)"
	$(GO) test -race ./enforcer/webhook/ ./enforcer/serve/ ./enforcer/guard/ ./enforcer/informers/ ./enforcer/freshread/

differential:
	@echo "== differential: enforcer vs Gatekeeper's engine on randomized inventories"
	$(GO) test -count=1 -v ./tests/differential/ -args -scenarios $(SCENARIOS)

# A bounded fuzz run of the webhook's request decoding. Minimizing each new
# input for the default 60s stalls the run (one exec a second here), so new
# inputs are kept as found. The budget is a count, not a duration: with a
# duration, Go 1.26's coordinator can fail the run with "context deadline
# exceeded" at the deadline, no input at fault (golang/go#75804, fixed in 1.27).
FUZZTIME ?= 50000x
fuzz:
	@echo "== fuzz: FuzzValidate, $(FUZZTIME) executions"
	$(GO) test ./enforcer/webhook/ -run '^$$' -fuzz FuzzValidate -fuzztime $(FUZZTIME) -fuzzminimizetime 1x

# End to end on a real kube-apiserver and etcd, built from Go modules by
# tests/e2e/tools/build.sh into the user cache (cold: minutes; then seconds).
e2e:
	@echo "== e2e: kube-apiserver + etcd + nodeguard serve + Gatekeeper"
	@start=$$(date +%s); bin=$$(bash tests/e2e/tools/build.sh) && echo "e2e tools ready in $$(( $$(date +%s) - start )) s: $$bin" && \
	NODEGUARD_E2E_BIN=$$bin $(GO) test -tags e2e -count=1 -v -timeout 30m ./tests/e2e/ ./internal/cmd/demo/

# The README's "run it": a narrated replay of scenarios 1 and 2 on a local
# kube-apiserver with nodeguard as its webhook (builds the binaries first).
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

# Decision latency and cache memory, enforcer next to Gatekeeper's engine
# (see docs/performance.md). Gatekeeper at 50k Machines takes minutes.
BENCH_SIZES ?= 100,1000,10000,50000
bench:
	$(GO) test ./tests/bench/ -run '^$$' -bench 'CPUBaseline' -benchtime 5000x
	$(GO) test ./tests/bench/ -run '^$$' -bench 'Decision/enforcer' -benchtime 2000x -timeout 60m -args -sizes $(BENCH_SIZES)
	$(GO) test ./tests/bench/ -run '^$$' -bench 'Decision/gatekeeper' -benchtime 5x -timeout 60m -args -sizes $(BENCH_SIZES)
	$(GO) test ./tests/bench/ -run '^$$' -bench 'CacheMemory' -benchtime 1x -timeout 60m -args -sizes $(BENCH_SIZES)
