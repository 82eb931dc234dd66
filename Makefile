# strata — two commands: `make run` and `make test`.
CARGO      ?= cargo
RUN_DIR    ?= $(CURDIR)/run
DATASTORE  ?= $(RUN_DIR)/datastore
NBD_SOCK   ?= $(RUN_DIR)/nbd.sock
NBD_TCP    ?= 127.0.0.1:10809
STRATA     := target/release/strata

.PHONY: all build run test deps lint bench clean

all: build

build:
	$(CARGO) build --release --bin strata

## Build, create the default datastore (with one 10 GiB thin disk) and serve it.
run: build
	@STRATA=$(STRATA) DATASTORE=$(DATASTORE) NBD_SOCK=$(NBD_SOCK) NBD_TCP=$(NBD_TCP) scripts/run.sh

## Install what the tests need (qemu-img, qemu-nbd, fio, nbdinfo), then run every test.
test: deps
	STRATA_REQUIRE_TOOLS=1 STRATA_MODEL_CASES=2000 STRATA_BENCH_QUICK=1 $(CARGO) test --workspace --all-targets --no-fail-fast

deps:
	@scripts/install-deps.sh

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## Benchmarks against qemu-nbd (raw, qcow2 chains) with fio; prints ratios.
bench: deps build
	python3 bench/bench.py $(BENCH_ARGS)

clean:
	$(CARGO) clean
	rm -rf $(RUN_DIR)
