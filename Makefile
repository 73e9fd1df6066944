# charge-once — every command a developer or CI needs. `make test` on a fresh clone
# installs the test servers (moto in .venv, dynalite in node_modules) and runs
# everything; the test harness starts and stops the servers itself.

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV   := .venv
PYTHON ?= python3
CARGO  ?= cargo

.PHONY: help deps test test-release lint fmt run reset clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

deps: $(VENV)/.installed node_modules/.installed ## install the test servers (moto, dynalite)

$(VENV)/.installed: requirements-test.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements-test.txt
	@touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	@touch $@

test: deps ## all tests: unit, property, store contract (moto + dynalite), handler
	$(CARGO) test --locked
	$(MAKE) --no-print-directory test-release

test-release: deps ## the panic-isolation handler test again, optimised (release profile)
	$(CARGO) test --locked --release --test handler panicking

lint: ## rustfmt and clippy, warnings are errors
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --locked --all-targets -- -D warnings

EVENT ?= events/sqs-batch.json
DB    ?= .local/charge-once.sqlite3

run: ## run the handler once on EVENT (default events/sqs-batch.json): SQLite + simulator, needs only cargo
	$(CARGO) run --quiet -- invoke $(EVENT) --db $(DB)

reset: ## forget every local record and the simulator's ledger
	rm -f $(DB) $(DB)-wal $(DB)-shm

fmt: ## format the code
	$(CARGO) fmt --all

clean: ## remove build output and installed test servers
	$(CARGO) clean
	rm -rf $(VENV) node_modules
