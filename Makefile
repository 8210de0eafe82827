# zbd: the engine (Rust) and zbdlab (Python). `make demo` and `make test` work on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
CARGO ?= cargo
ZBD := target/release/zbd
export ZBD_BIN := $(abspath $(ZBD))

.PHONY: all deps build test test-rust test-lab demo bench check fmt clean

all: build

# System packages (fio, nbdkit, libnbd tools, qemu-utils, mkfs.*, zfs-fuse, chromium), idempotent.
deps: $(VENV)/.stamp
	@bash scripts/install-deps.sh --with-browser

$(VENV)/.stamp: lab/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e 'lab[test]'
	touch $@

build:
	$(CARGO) build --release --workspace

test: deps build
	$(MAKE) test-rust test-lab

test-rust:
	$(CARGO) test --workspace

test-lab:
	cd lab && ../$(VPY) -m pytest -q

demo: deps build
	bash scripts/demo.sh

# Same-run ratios under bench/results/ (docs/benchmarks.md); BENCH_ARGS=--quick for a short run.
bench: deps build
	bash scripts/bench.sh $(BENCH_ARGS)

check:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(VENV)/bin/ruff check lab
	$(VENV)/bin/ruff format --check lab

fmt:
	$(CARGO) fmt --all
	$(VENV)/bin/ruff format lab

clean:
	$(CARGO) clean
	rm -rf $(VENV)
