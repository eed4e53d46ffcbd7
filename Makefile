# tabletflow — everything a fresh machine with Go needs goes through here.
# `make demo` runs the system, `make test` runs the tests (what CI runs).

SHELL := /bin/bash
export GOTOOLCHAIN := local
BIN := $(CURDIR)/bin
DATA := $(CURDIR)/.data
export PATH := $(BIN):$(PATH)

# Pinned tool versions, installed into ./bin.
TEMPORAL_CLI_VERSION := v1.5.1
PROTOC_GEN_GO_VERSION := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.0
STATICCHECK_VERSION := v0.8.2

BINARIES := tabletd worker starter

.PHONY: all build test bench bench-full soak proto lint demo stop tools clean

all: build

build: ## the binaries into ./bin
	go build -o $(BIN)/ $(addprefix ./,$(BINARIES))

test: build $(BIN)/temporal ## vet and every test: unit, loopback gRPC, e2e on a Temporal dev server
	go vet ./...
	go test -count=1 -timeout 20m ./...

bench: build $(BIN)/temporal ## benchmarks; results into bench/results
	mkdir -p bench/results
	BENCH_RESULTS=$(CURDIR)/bench/results go test -run '^$$' -bench GetChanges -benchtime 3s ./tabletd/cluster/
	go run ./bench/throughput --bin $(BIN) --out bench/results/throughput.json
	go run ./bench/reaction --bin $(BIN) --out bench/results/reaction.json

bench-full: build $(BIN)/temporal ## scale: one stream of 5000 tablets until every tablet streams, then 5 min steady (~30 min); bench/results/scale.json
	mkdir -p bench/results
	go run ./bench/scale --bin $(BIN) --tablets 5000 --out bench/results/scale.json

soak: build ## tabletd memory soak: 64 tablets × 3 replicas, 20k records/s, 10 minutes
	mkdir -p bench/results
	go run ./bench/soak --tabletd $(BIN)/tabletd --duration 10m --out bench/results/soak.json

$(BIN)/temporal:
	GOBIN=$(BIN) go install github.com/temporalio/cli/cmd/temporal@$(TEMPORAL_CLI_VERSION)

$(BIN)/protoc-gen-go:
	GOBIN=$(BIN) go install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)

$(BIN)/protoc-gen-go-grpc:
	GOBIN=$(BIN) go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

$(BIN)/staticcheck:
	GOBIN=$(BIN) go install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

tools: $(BIN)/temporal $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc $(BIN)/staticcheck

proto: $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc ## regenerate proto/sourcepb
	command -v protoc >/dev/null || { apt-get update && apt-get install -y protobuf-compiler; }
	protoc -I proto --go_out=proto/sourcepb --go_opt=paths=source_relative \
		--go-grpc_out=proto/sourcepb --go-grpc_opt=paths=source_relative proto/source.proto

lint: $(BIN)/staticcheck ## gofmt, go vet, staticcheck
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	go vet ./...
	$(BIN)/staticcheck ./...

demo: build $(BIN)/temporal ## Temporal dev server + Web UI, tabletd, worker and a live stream
	demo/demo.sh

stop: ## stop what `make demo` started, by recorded process IDs
	@for name in worker tabletd temporal; do \
		f=$(DATA)/$$name.pid; \
		[ -f "$$f" ] || continue; pid=$$(cat "$$f"); \
		if kill -0 "$$pid" 2>/dev/null; then kill "$$pid" && echo "stopped $$(basename "$$f" .pid) (pid $$pid)"; \
			for i in $$(seq 100); do kill -0 "$$pid" 2>/dev/null || break; sleep 0.1; done; fi; \
		rm -f "$$f"; \
	done

clean: stop
	rm -rf $(BIN) $(DATA)
