# zbd: the engine (Rust) and zbdlab (Python). `make demo` and `make test` work on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
CARGO ?= cargo
ZBD := target/release/zbd
# Volumes in Ceph RADOS pools (`rados:POOL/NAME`); librados.so.2 is loaded only when one is opened.
FEATURES := --features zbd/ceph
export ZBD_BIN := $(abspath $(ZBD))

.PHONY: all deps deps-ceph build test test-rust test-lab test-heavy test-bit10 demo bench check fmt clean fuzz fuzz-seeds \
	man completions deb install-service

all: build

# System packages (fio, nbdkit, libnbd tools, qemu-utils, mkfs.*, zfs-fuse, chromium), idempotent.
deps: $(VENV)/.stamp
	@bash scripts/install-deps.sh --with-browser

# A throwaway Ceph cluster for the RADOS tests and benchmarks (scripts/ceph-cluster.sh).
deps-ceph:
	@bash scripts/install-deps.sh --with-ceph

$(VENV)/.stamp: lab/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e 'lab[test]'
	touch $@

build:
	$(CARGO) build --release --workspace $(FEATURES)

# The lab's tests run the test build's zbd (cargo test builds it): no release build, which
# would cost `make test` a second compile of everything (about 2 minutes on 2 cores).
test: deps deps-ceph
	$(MAKE) test-rust
	$(MAKE) test-lab ZBD_BIN=$(abspath target/debug/zbd)

test-rust:
	$(CARGO) test --workspace $(FEATURES)

test-lab:
	cd lab && ../$(VPY) -m pytest -q

demo: deps build
	bash scripts/demo.sh

# Every benchmark through `zbdlab bench` (docs/benchmarks.md): summaries in bench/results/<run>/,
# raw tool output in bench/raw/<run>/ (ignored). BENCH_ARGS=--quick: the ratio groups, short;
# BENCH_ARGS="--only GROUP": one group. A full run ends with the heavy tests; a failed group still
# leaves the others (and the tests) to run, and an interrupted run stops at once.
bench: deps deps-ceph build
	@status=0; $(VENV)/bin/zbdlab bench $(BENCH_ARGS) || status=$$?; \
	if [ $$status = 130 ]; then exit 130; fi; \
	$(if $(filter --quick --only%,$(BENCH_ARGS)),,$(MAKE) test-heavy || status=$$?;) \
	exit $$status

# What make test leaves out to stay short, in release: the sweeps it samples, whole
# (ZBD_TEST_HEAVY=1); the tests marked #[ignore = "heavy: ..."]; the engine tests with 4 KiB and
# 16 KiB compression units (default 8 KiB). make_fixture rewrites a committed file (only with
# ZBD_WRITE_FIXTURE=1).
test-heavy: build
	ZBD_TEST_HEAVY=1 $(CARGO) test --release -p zbd-core
	$(CARGO) test --release -p zbd-core -- --ignored --skip make_fixture
	for u in 4K 16K; do \
	  ZBD_TEST_UNIT_SIZE=$$u $(CARGO) test --release -p zbd-core --test model --test durability \
	    --test engine -- sequential:: crash:: faults::beyond_power_loss:: volume:: read::cache:: \
	    || exit 1; \
	done

# The engine, durability and model suites with every test volume keeping its map in metadata
# pages (checkpoint flag bit 10; docs/design.md, "Wiring"), then again with a stock of two
# extents, so that the carver supplies the page ids (small_area's bound on what fits assumes
# the area the test asked for, which the carver takes from), then with the pair-state list of
# 4,096 that volumes created before 6349d060 keep. About 18 minutes on 2 cores.
test-bit10: build
	ZBD_TEST_METADATA_PAGES=1 $(CARGO) test --release -p zbd-core --test engine --test durability \
	  --test model
	ZBD_TEST_METADATA_PAGES=1 ZBD_TEST_METADATA_STOCK=2 $(CARGO) test --release -p zbd-core \
	  --test engine --test durability --test model -- --skip writing_past_what_fits
	ZBD_TEST_METADATA_PAGES=1 ZBD_TEST_LIST_CAPACITY=4096 $(CARGO) test --release -p zbd-core \
	  --test engine --test durability --test model

# Fuzz every parser for FUZZ_SECONDS each (default 60); installs nightly + cargo-fuzz if missing.
fuzz:
	bash scripts/fuzz.sh

# Regenerates the committed seed corpus (fuzz/corpus) from real encodings.
fuzz-seeds:
	$(CARGO) run -q --manifest-path fuzz/Cargo.toml -p zbd-fuzz-seeds -- fuzz/corpus

# Manual pages and shell completions, generated from the CLI definition (zbd gen-man, zbd completions).
man: build
	$(ZBD) gen-man target/man/man1

completions: build
	mkdir -p target/completions
	for shell in bash zsh fish; do $(ZBD) completions $$shell >target/completions/zbd.$$shell || exit 1; done

# The Debian package (dpkg-deb): binary, units, /etc/zbd/volumes, man pages, completions, docs.
deb: build
	bash scripts/build-deb.sh --bin $(ZBD)

# Installs the binary, units and volume list on this host without a package (docs/operations.md).
install-service: build
	install -Dm755 $(ZBD) /usr/local/bin/zbd
	install -Dm644 packaging/systemd/zbd@.service /etc/systemd/system/zbd@.service
	install -Dm644 packaging/systemd/zbd-attach@.service /etc/systemd/system/zbd-attach@.service
	sed -i 's|/usr/bin/zbd|/usr/local/bin/zbd|' /etc/systemd/system/zbd@.service /etc/systemd/system/zbd-attach@.service
	test -e /etc/zbd/volumes || install -Dm644 packaging/volumes /etc/zbd/volumes

check:
	$(CARGO) fmt --all -- --check
	$(CARGO) fmt --manifest-path fuzz/Cargo.toml --all -- --check
	$(CARGO) check --manifest-path fuzz/Cargo.toml --workspace --bins  # targets and seeds still compile
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy --workspace --all-targets $(FEATURES) -- -D warnings
	python3 scripts/modgraph.py > /dev/null  # no import circles in zbd-core (docs/design.md, Layout)
	$(VENV)/bin/ruff check lab
	$(VENV)/bin/ruff format --check lab

fmt:
	$(CARGO) fmt --all
	$(CARGO) fmt --manifest-path fuzz/Cargo.toml --all
	$(VENV)/bin/ruff format lab

clean:
	$(CARGO) clean
	rm -rf $(VENV)
