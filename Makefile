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

.PHONY: all build test bench soak proto lint demo stop tools clean

all: build

build: ## the binaries into ./bin
	go build -o $(BIN)/ $(addprefix ./,$(BINARIES))

test: build $(BIN)/temporal ## vet and every test: unit, loopback gRPC, e2e on a Temporal dev server
	go vet ./...
	go test -count=1 -timeout 20m ./...

bench: build ## benchmarks; results into bench/results
	mkdir -p bench/results
	BENCH_RESULTS=$(CURDIR)/bench/results go test -run '^$$' -bench GetChanges -benchtime 3s ./tabletd/cluster/

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

demo: build ## a tabletd cluster with a workload (the workflows join it as they land)
	@mkdir -p $(DATA)
	@if [ -f $(DATA)/tabletd.pid ] && kill -0 $$(cat $(DATA)/tabletd.pid) 2>/dev/null; then \
		echo "tabletd already running (pid $$(cat $(DATA)/tabletd.pid))"; \
	else \
		nohup $(BIN)/tabletd serve --listen 127.0.0.1:15991 --cells zone1,zone2,zone3 --servers-per-cell 2 \
			--tablets 8 --replicas 3 --rate 200 --lag 50ms --retention 1h > $(DATA)/tabletd.log 2>&1 & \
		echo $$! > $(DATA)/tabletd.pid; \
		for i in $$(seq 50); do $(BIN)/tabletd ctl list >/dev/null 2>&1 && break; sleep 0.1; done; \
		echo "tabletd started (pid $$(cat $(DATA)/tabletd.pid), log $(DATA)/tabletd.log)"; \
	fi
	@echo
	@echo "  bin/tabletd ctl list                                   # tablets, replicas, health, lag"
	@echo "  bin/tabletd ctl tail --tablet t-0003                   # watch changes flow"
	@echo "  bin/tabletd ctl fault --server zone1-0000000101 --down # take a server down"
	@echo "  bin/tabletd ctl heal --server zone1-0000000101"
	@echo "  bin/tabletd ctl split --tablet t-0003"
	@echo "  bin/tabletd ctl digest"
	@echo "  make stop                                              # stop what demo started"

stop: ## stop what `make demo` started, by recorded process IDs
	@for f in $(DATA)/*.pid; do \
		[ -f "$$f" ] || continue; pid=$$(cat "$$f"); \
		if kill -0 "$$pid" 2>/dev/null; then kill "$$pid" && echo "stopped $$(basename "$$f" .pid) (pid $$pid)"; fi; \
		rm -f "$$f"; \
	done

clean: stop
	rm -rf $(BIN) $(DATA)
