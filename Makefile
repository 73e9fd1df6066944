# charge-once — every command a developer or CI needs. `make test` on a fresh clone
# installs the test servers (moto and localstripe in .venv, dynalite and
# stripe-stateful-mock in node_modules) and runs everything; the test harness starts
# and stops the servers itself.

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV   := .venv
PYTHON ?= python3
CARGO  ?= cargo

.PHONY: help deps tools test test-build lint-canary model model-build model-mutants model-mutant sam-build soak bench lint fmt run confirm reset build validate watch invoke local-up local-down deploy clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

deps: $(VENV)/.installed node_modules/.installed ## install the test servers (moto, localstripe; dynalite, stripe-stateful-mock)

# The venv's packages are installed by uv (from PyPI, like the rest): it unpacks in
# parallel and compiles no bytecode up front, so the installs take less than half of
# pip's CPU (CI installs beside the test build, on two cores). Python compiles the
# modules that are used when they are first imported.
UV_VERSION  := 0.13.9
PIP_INSTALL := $(VENV)/bin/uv pip install --quiet --python $(VENV)/bin/python

$(VENV)/.installed: requirements-test.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)
	$(PIP_INSTALL) -r requirements-test.txt
	@touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	@touch $@

# LINT=1 (CI): clippy is the compiler of the workspace's own crates, as `cargo clippy`
# runs it (clippy-driver as RUSTC_WORKSPACE_WRAPPER, its arguments in CLIPPY_ARGS, every
# warning denied), so the test build is also the lint and nothing is compiled twice.
# Every cargo command of `make test` sees the same settings, so none rebuilds another's
# work. Without LINT, `make lint` is the lint.
# `ifeq`, not `ifdef`: make defines LINT itself (LINT = lint, a built-in default), so
# `ifdef LINT` held in every make, and sam build and make bench compiled through clippy.
# The arguments travel in clippy's private CLIPPY_ARGS format, so `make lint-canary`
# (run by `make lint` and by `make test-build LINT=1`) checks that they still deny a
# known warning: a clippy that read them otherwise would pass everything silently.
CLIPPY_DRIVER := $(shell rustc --print sysroot)/bin/clippy-driver
CLIPPY_DENY   := -D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__
ifeq ($(LINT),1)
export RUSTC_WORKSPACE_WRAPPER := $(CLIPPY_DRIVER)
export CLIPPY_ARGS := $(CLIPPY_DENY)
endif

# Every test command (and the model's build) compiles the workspace one way: all of it
# (--workspace, so the feature resolution never differs between commands) and with the
# crash points (tests/crash_points.rs needs them; they are inert unless its variable
# names one), so nothing one command built is compiled again by the next.
TEST_FLAGS := --locked --workspace --features charge-once/crash-points

test-build: ## compile every test of the workspace without running it (LINT=1: and lint it)
	$(if $(filter 1,$(LINT)),@$(MAKE) --no-print-directory lint-canary)
	$(CARGO) test $(TEST_FLAGS) --no-run

# A needless `return` through clippy-driver with LINT=1's CLIPPY_ARGS must be an error.
lint-canary:
	@mkdir -p target
	@printf 'pub fn canary() -> u8 {\n    return 1;\n}\n' > target/lint-canary.rs
	@if CLIPPY_ARGS='$(CLIPPY_DENY)' $(CLIPPY_DRIVER) rustc target/lint-canary.rs --crate-type lib \
	    --emit metadata -o target/lint-canary.rmeta 2> target/lint-canary.txt; then \
	  echo "lint canary: LINT=1 no longer denies clippy's warnings (a needless return passed)"; exit 1; \
	elif grep -q needless_return target/lint-canary.txt; then \
	  echo "lint canary: LINT=1 denies clippy's warnings (a needless return is an error)"; \
	else cat target/lint-canary.txt; echo "lint canary: clippy-driver failed for another reason"; exit 1; fi

test: deps tools ## all tests: unit, property, store contract (moto, dynalite, SQLite), handler, HTTP provider, CLI, queue, SigV4, template, metrics, operations, audit, system (300 orders with events; an outage; 50 orders settled without events; a drain against the rate limit), pinned crashes, the model checker and its mutants
	$(CARGO) test $(TEST_FLAGS) -- --skip three_hundred_orders --skip an_outage_of_the_provider --skip fifty_orders_without_any_event --skip a_backlog_drains
	@# The system runs on their own, so their summary lines show in the output; one
	@# after the other, so that the outage run's recovery time is its own and not moto
	@# serving both.
	$(CARGO) test $(TEST_FLAGS) --test system -- --nocapture --test-threads 1 three_hundred_orders an_outage_of_the_provider fifty_orders_without_any_event
	$(CARGO) test $(TEST_FLAGS) --test drain -- --nocapture --test-threads 1
	$(MAKE) --no-print-directory model
	$(MAKE) --no-print-directory model-mutants

# The model checker (ARCHITECTURE.md, "The proof") over the real core. It is built in the dev profile, so
# CI compiles no second, release build of the crate (and debug assertions stay on): the
# model's own crate is compiled with -C opt-level=3 (cargo rustc, this target only: 5 s)
# and stateright is optimised too (Cargo.toml); the core stays as the tests built it
# (same features: not compiled again).
# RELEASE=1 builds it all optimised. Each run has its own search depth; MODEL_DEPTH=<n>
# overrides it (0 = exhaustive, far beyond this machine).
MODEL := target/$(if $(RELEASE),release,debug)/examples/model
MODEL_ARGS = $(if $(MODEL_DEPTH),--depth $(MODEL_DEPTH))

model-build:
	@$(CARGO) rustc --locked --quiet --features crash-points $(if $(RELEASE),--release) --example model -- -C opt-level=3

model: model-build ## model-check the state machine (bounded, every property); MUTANT=<name> switches one rule off and must print a counterexample
	$(MODEL) $(MODEL_ARGS) $(if $(MUTANT),--mutant $(MUTANT))

model-mutants: model-build ## every mutant of the model must find a counterexample (make model MUTANT=<name> shows one); two at a time
	@$(MODEL) --list | awk '{print $$1}' | xargs -P 2 -I{} $(MAKE) --no-print-directory model-mutant M={}

# One mutant: it must fail with a counterexample (its first line is printed).
model-mutant:
	@if $(MODEL) $(MODEL_ARGS) --mutant $(M) > target/model-$(M).txt; then \
	  echo "mutant $(M): no counterexample (target/model-$(M).txt)"; exit 1; \
	elif grep -m1 '^counterexample' target/model-$(M).txt | sed "s/^/mutant $(M): /" | grep .; then :; \
	else cat target/model-$(M).txt; echo "mutant $(M): failed without a counterexample"; exit 1; fi

N ?= 5000
soak: deps ## the system test at scale: N orders (default 5000) through faults and kills; minutes, not in CI
	SOAK_ORDERS=$(N) $(CARGO) test --locked --test system soak -- --ignored --nocapture

bench: deps $(VENV)/.bench-installed bench/node_modules/.installed ## charge-once vs Powertools Python and TypeScript (release build): the drain first, then the rest (FULL=1 for the full matrix; BENCH_ONLY=drain for the drain alone, BENCH_ONLY=traces for traces off and on alone, BENCH_ONLY=settle for the settler's and the audit's reach, BENCH_ONLY=quiet for a quiet day's latency per order, BENCH_ONLY=refunds for a refund record's CPU beside a charge's); writes bench/results/<date>.{json,md,svg}, <date>-drain.{json,md}, <date>-traces.{json,md}, <date>-settle.{json,md}, <date>-quiet.{json,md} and <date>-refunds.{json,md}
	$(CARGO) build --locked --release --bin charge-once
	$(CARGO) run --locked --release -p bench

# The Powertools peers of `make bench`: Python (+ awslambdaric) in .venv beside moto,
# TypeScript in bench/node_modules.
$(VENV)/.bench-installed: $(VENV)/.installed requirements-bench.txt
	$(PIP_INSTALL) -r requirements-bench.txt
	@touch $@

bench/node_modules/.installed: bench/package.json bench/package-lock.json
	cd bench && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

lint: lint-canary ## rustfmt and clippy, warnings are errors
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy $(TEST_FLAGS) --all-targets -- -D warnings

EVENT ?= events/sqs-batch.json
DB    ?= .local/charge-once.sqlite3

# Local runs are the local member's binary (local/): the SQLite file and the simulator,
# never linked into the Lambda build.
run: ## run the handler once on EVENT (default events/sqs-batch.json): SQLite + simulator (charge-once-local), needs only cargo
	$(CARGO) run --quiet -p charge-once-local -- invoke $(EVENT) --db $(DB)

REFUNDS ?= events/sqs-refunds.json
refund: ## run the refund function once on REFUNDS (default events/sqs-refunds.json) against what make run charged: SQLite + simulator
	$(CARGO) run --quiet -p charge-once-local -- refund $(REFUNDS) --db $(DB)

ORDER ?= ord-3006
confirm: ## play the customer of ORDER (default ord-3006, which make run leaves awaiting them): confirm its payment at the simulator, deliver Stripe's event to the handler
	$(CARGO) run --quiet -p charge-once-local -- confirm $(ORDER) --db $(DB)

reset: ## forget every local record and the simulator's ledger (the DB file of make run)
	rm -f $(DB) $(DB)-wal $(DB)-shm

# --- Lambda build, template, local Lambda mode -------------------------------------

ARCH ?= arm64
ifeq ($(ARCH),arm64)
LAMBDA_ARCH := --arm64
else ifeq ($(ARCH),x86_64)
LAMBDA_ARCH := --x86-64
else
$(error ARCH must be arm64 or x86_64, not $(ARCH))
endif
# cargo-lambda finds zig (from PyPI's ziglang) through the venv's python.
TOOLS_PATH := PATH="$(CURDIR)/$(VENV)/bin:$$PATH"

tools: $(VENV)/.tools ## install cargo-lambda (with zig), cfn-lint and the SAM CLI into .venv

$(VENV)/.tools: requirements-build.txt $(VENV)/.installed
	$(PIP_INSTALL) -r requirements-build.txt
	@touch $@

# SAM CLI, offline: no account, no Docker (sam build drives cargo-lambda here), no
# telemetry.
SAM := $(TOOLS_PATH) SAM_CLI_TELEMETRY=0 $(VENV)/bin/sam

# The built template's Architecture is pinned to the bootstrap's own (its ELF header):
# `sam deploy --guided` then offers what was built, and CloudFormation refuses another.
BUILT_TEMPLATE  := .aws-sam/build/template.yaml
BUILT_BOOTSTRAP := .aws-sam/build/ChargeFunction/bootstrap

sam-build: tools ## sam build for ARCH (arm64 default, or x86_64): cargo-lambda, release -> .aws-sam/build/ChargeFunction/bootstrap
	$(SAM) build --parameter-overrides Architecture=$(ARCH)
	@echo "built for $$(python3 scripts/built_architecture.py pin $(BUILT_TEMPLATE) $(BUILT_BOOTSTRAP))"

build: sam-build ## the Lambda build (= make sam-build): what make deploy ships

validate: tools ## cfn-lint and sam validate --lint (offline); the rules linters miss are in tests/template/
	$(VENV)/bin/cfn-lint template.yaml
	$(SAM) validate --lint --region us-east-1

local-up: deps tools ## start moto + localstripe on fixed ports, create table and customers
	scripts/local.sh up

local-down: ## stop them
	scripts/local.sh down

watch: local-up ## the binary in Lambda mode under cargo lambda watch (Runtime API on 127.0.0.1:9000)
	set -a; . .local/env; set +a; $(TOOLS_PATH) cargo lambda watch --invoke-address 127.0.0.1 --invoke-port 9000 --timeout 60

EVENT_LAMBDA ?= events/sqs-single.json
invoke: tools ## send EVENT_LAMBDA (default events/sqs-single.json) to `make watch`
	$(TOOLS_PATH) cargo lambda invoke charge-once --invoke-address 127.0.0.1 --invoke-port 9000 --data-file $(EVENT_LAMBDA)

# Deploys what `make build` built, for the architecture it was built for; an ARCH named
# on the command line that differs is refused (no rebuild behind the operator's back).
# Guided (sam's prompts) unless SAMCONFIG names a configuration file or PARAMS gives the
# parameters (with STACK and AWS_REGION): then nothing is asked, as a pipeline needs, and
# standard input is closed so that nothing can be. The built template allows only its
# own architecture, so a deploy from a file or PARAMS needs no Architecture.
#
# The region: a SAMCONFIG file's own `region` wins; else AWS_REGION, else
# AWS_DEFAULT_REGION, passed as --region (the SAM CLI reads only AWS_DEFAULT_REGION and
# its profile, and says "Unable to resolve a region" with AWS_REGION alone). A deploy
# with no prompt and no region stops here with one line.
SAMCONFIG ?=
PARAMS    ?=
STACK     ?= charge-once
DEPLOY_REGION = $(or $(AWS_REGION),$(AWS_DEFAULT_REGION))
SAMCONFIG_REGION = $(if $(SAMCONFIG),$(shell sed -n 's/^[[:space:]]*region[[:space:]]*=[[:space:]]*"\([^"]*\)".*/\1/p' $(SAMCONFIG) 2>/dev/null | head -n 1))
REGION_FLAG = $(if $(SAMCONFIG_REGION),,$(if $(DEPLOY_REGION),--region $(DEPLOY_REGION)))
DEPLOY_UNATTENDED = --template-file $(BUILT_TEMPLATE) --no-confirm-changeset --no-fail-on-empty-changeset \
	$(if $(SAMCONFIG),--config-file $(abspath $(SAMCONFIG)),--stack-name $(STACK) --capabilities CAPABILITY_IAM --resolve-s3) \
	$(REGION_FLAG) $(if $(PARAMS),--parameter-overrides $(PARAMS))
deploy: tools ## deploy the last make build for its architecture (needs an AWS account): guided, or with SAMCONFIG=<file> or PARAMS="Key=Value ..." no prompt at all (region: the file's, else AWS_REGION or AWS_DEFAULT_REGION)
	@$(if $(SAMCONFIG),test -r $(SAMCONFIG) || { echo "make deploy: SAMCONFIG=$(SAMCONFIG) is not a readable file"; exit 1; })
	@$(if $(SAMCONFIG)$(PARAMS),$(if $(SAMCONFIG_REGION)$(DEPLOY_REGION),,echo "make deploy: no region: set AWS_REGION or AWS_DEFAULT_REGION (or region in the SAMCONFIG file)"; exit 1))
	@arch=$$(python3 scripts/built_architecture.py check $(BUILT_TEMPLATE) $(BUILT_BOOTSTRAP) \
	    $(if $(filter command line environment,$(origin ARCH)),$(ARCH))) && \
	  echo "deploying the $$arch build" && \
	  $(if $(SAMCONFIG)$(PARAMS),$(SAM) deploy $(DEPLOY_UNATTENDED) < /dev/null,$(SAM) deploy --template-file $(BUILT_TEMPLATE) --guided $(REGION_FLAG) --parameter-overrides Architecture=$$arch)

fmt: ## format the code
	$(CARGO) fmt --all

clean: ## remove build output and installed test servers
	$(CARGO) clean
	rm -rf $(VENV) node_modules bench/node_modules
