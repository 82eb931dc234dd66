# strata — two commands: `make run` and `make test`.
CARGO      ?= cargo
RUN_DIR    ?= $(CURDIR)/run
DATASTORE  ?= $(RUN_DIR)/datastore
NBD_SOCK   ?= $(RUN_DIR)/nbd.sock
NBD_TCP    ?= 127.0.0.1:10809
STRATA     := target/release/strata

.PHONY: all build run test deps lint bench paper deb fuzz fuzz-cpu fuzz-tools clean

all: build

build:
	$(CARGO) build --release --bin strata

## Build, create the default datastore (with one 10 GiB thin disk) and serve it.
run: build
	@STRATA=$(STRATA) DATASTORE=$(DATASTORE) NBD_SOCK=$(NBD_SOCK) NBD_TCP=$(NBD_TCP) scripts/run.sh

## Install what the tests need (qemu-img, qemu-nbd, fio, nbdinfo), then run every test
## (scripts/run-tests.py: the benchmark smoke and the test binaries in LANES lanes, longest first).
LANES ?= 5
test: deps
	STRATA_REQUIRE_TOOLS=1 STRATA_MODEL_CASES=2000 STRATA_BENCH_QUICK=1 STRATA_TEST_LANES=$(LANES) \
		CARGO=$(CARGO) python3 scripts/run-tests.py

deps:
	@scripts/install-deps.sh

## Formatting, clippy (with the length ratchet of clippy.toml), and cargo deny's licence, ban and source checks
## (deny.toml; advisories need GitHub: `cargo deny check advisories`).
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	@command -v cargo-deny >/dev/null 2>&1 || $(CARGO) install cargo-deny --locked
	$(CARGO) deny --offline check licenses bans sources

## The seeds' figures reproduced: runs the paper's experiments (about an
## hour; PAPER_ARGS=--quick for minutes) into bench/paper.json and writes
## docs/SEEDS.md with a plot and a verdict per figure (docs/seeds/*.svg).
paper: deps build
	python3 bench/bench.py --paper $(PAPER_ARGS)

## The Debian package: target/debian/strata_VERSION_ARCH.deb (the binary,
## the strata@.service template, man pages, completions, docs).
deb:
	@scripts/make-deb.sh

## Benchmarks against qemu-nbd (raw, qcow2 chains) with fio; prints ratios.
bench: deps build
	python3 bench/bench.py $(BENCH_ARGS)

## Run every fuzz target for SECONDS each (default 60) from its committed
## corpus (fuzz/README.md); needs a nightly toolchain and cargo-fuzz,
## installed here if missing. A crash leaves its input in fuzz/artifacts/.
SECONDS ?= 60
FUZZ_TARGETS := nbd_session descriptor sparse_headers open_image vhost_chain datastore_pages datastore_open objstore_objects keyring_parse luks_image packed_grain
fuzz: fuzz-tools
	@set -e; cd fuzz; for t in $(FUZZ_TARGETS); do \
		mkdir -p corpus/$$t; work=$$(mktemp -d); cp -r corpus/$$t/. $$work/; \
		echo "== $$t for $(SECONDS) s"; \
		cargo +nightly fuzz run $$t $$work -- -max_total_time=$(SECONDS) \
			-rss_limit_mb=2048 -malloc_limit_mb=512 -max_len=1048576 -print_final_stats=1 2>&1 \
			| grep -E '^(#[0-9]+ +DONE|Done|stat::number_of_executed_units|==[0-9]+==|SUMMARY|thread .* panicked)' || true; \
		rm -rf $$work; \
		if ls artifacts/$$t/crash-* >/dev/null 2>&1; then echo "$$t: crashes in fuzz/artifacts/$$t"; exit 1; fi; \
	done

## Run every fuzz target (or TARGETS="a b") until it has used CPU_SECONDS
## of CPU time (default 3600), not wall time, one after another at nice 19;
## the corpora grow in FUZZ_WORK and each run's account is appended to
## FUZZ_WORK/cpu.tsv (scripts/fuzz-cpu.sh).
CPU_SECONDS ?= 3600
FUZZ_WORK ?= /var/tmp/strata-fuzz
TARGETS ?= $(FUZZ_TARGETS)
fuzz-cpu: fuzz-tools
	cd fuzz && cargo +nightly fuzz build
	@set -e; for t in $(TARGETS); do nice -n 19 scripts/fuzz-cpu.sh $$t $(CPU_SECONDS) $(FUZZ_WORK); done

# The nightly toolchain and cargo-fuzz, installed if missing.
fuzz-tools:
	@rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
	@command -v cargo-fuzz >/dev/null 2>&1 || $(CARGO) install cargo-fuzz --locked

clean:
	$(CARGO) clean
	rm -rf $(RUN_DIR)
