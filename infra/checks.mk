# Deployability checks (issue 4), included by the top-level Makefile:
#   make check-template   cfn-lint + sam validate --lint + checkov, offline
#   make build-lambdas    release bootstrap of every function with cargo-lambda (arm64 when
#                         the target's std can be installed, else the host architecture)
#   make smoke-lambdas    runs those very bootstraps under AWS's Runtime Interface Emulator
#                         against DynamoDB Local + moto and checks each response
#   make sam-local        those bootstraps under the real SAM CLI on Docker: sam local
#                         invoke of every function with its events/ fixtures, then
#                         sam local start-api (installs docker.io, qemu-user-static);
#                         a step of make test of its own
#   make check-infra      the first three
#   make sam-build        `sam build` as a deployer runs it (not part of make test)
# The template <-> code consistency tests are an ordinary workspace crate
# (infra/template-checks), so `cargo test --workspace` runs them.

TOOLS ?= .tools
VENV ?= $(TOOLS)/venv
PIP ?= $(VENV)/bin/pip

CFN_LINT_SPEC ?= cfn-lint==1.58.0
SAM_CLI_SPEC ?= aws-sam-cli==1.170.0
CARGO_LAMBDA_SPEC ?= cargo-lambda==1.9.2
ZIGLANG_SPEC ?= ziglang==0.17.1
CHECKOV_SPEC ?= checkov==3.3.30
# checkov pins boto3, botocore and packaging below what aws-sam-cli and moto need, so it
# lives in a venv of its own rather than downgrading the shared one.
CHECKOV_VENV ?= $(TOOLS)/checkov-venv

# Every function: its package and the [[bin]] its template Metadata names.
LAMBDA_PACKAGES := flashsale-grab flashsale-api flashsale-order-consumer flashsale-release flashsale-reconciler
LAMBDA_BINS := grab api order-consumer release reconciler
LAMBDA_DIR := target/lambda
ARM64_TARGET := aarch64-unknown-linux-gnu
# Where Debian's libc6-arm64-cross puts the aarch64 loader and libc, for qemu-aarch64 -L.
ARM64_SYSROOT := /usr/aarch64-linux-gnu

# sam and the SDKs need a region even offline; telemetry would try the network.
CHECK_ENV := AWS_DEFAULT_REGION=$${AWS_DEFAULT_REGION:-us-east-1} SAM_CLI_TELEMETRY=0

.PHONY: check-infra check-template build-lambdas smoke-lambdas qemu-user-tools sam-local sam-local-tools lambda-tools template-tools sam-build

check-infra: check-template build-lambdas smoke-lambdas

## --- tools (installed only when missing) --------------------------------------------

$(VENV)/bin/cfn-lint: | $(PIP)
	$(PIP) install -q '$(CFN_LINT_SPEC)'
	test -x $@

$(VENV)/bin/sam: | $(PIP)
	$(PIP) install -q '$(SAM_CLI_SPEC)'
	test -x $@

# cargo-lambda links with zig; the ziglang wheel provides it (`python -m ziglang`, and the
# python-zig script), which cargo-lambda finds with the venv's bin first on PATH.
$(VENV)/bin/cargo-lambda: | $(PIP)
	$(PIP) install -q '$(CARGO_LAMBDA_SPEC)' '$(ZIGLANG_SPEC)'
	test -x $@

$(CHECKOV_VENV)/bin/checkov:
	python3 -m venv --clear $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install -q --upgrade pip
	$(CHECKOV_VENV)/bin/pip install -q '$(CHECKOV_SPEC)'
	test -x $@

template-tools: $(VENV)/bin/cfn-lint $(VENV)/bin/sam $(CHECKOV_VENV)/bin/checkov

lambda-tools: $(VENV)/bin/cargo-lambda

# `make tools` installs these too: the template consistency tests (cargo test) expand
# the template with the venv's aws-sam-translator, which comes with aws-sam-cli.
tools: template-tools lambda-tools

## --- check-template -----------------------------------------------------------------

# All run offline: cfn-lint ships its specs, and `sam validate` translates locally (no
# managed policy is referenced by name, so it never asks IAM). --lint runs cfn-lint on the
# template again through SAM's own integration, as `sam validate --lint` users would.
# checkov runs its built-in policies (--skip-download: no platform policies); every
# exception it accepts is a `Metadata: checkov: skip:` on its resource, with the reason.
check-template: template-tools
	$(CHECK_ENV) $(VENV)/bin/cfn-lint --version
	$(CHECK_ENV) $(VENV)/bin/cfn-lint template.yaml
	$(CHECK_ENV) $(VENV)/bin/sam --version
	$(CHECK_ENV) $(VENV)/bin/sam validate --lint --template-file template.yaml
	$(CHECK_ENV) $(CHECKOV_VENV)/bin/checkov --version
	$(CHECK_ENV) BC_SKIP_MAPPING=TRUE $(CHECKOV_VENV)/bin/checkov --quiet --compact \
	  --framework cloudformation --skip-download --file template.yaml

## --- build-lambdas ------------------------------------------------------------------

# The template deploys arm64. Its std comes from rustup; when rustup cannot fetch it (no
# network), the host architecture is built instead and the choice is printed and written
# to target/lambda/ARCH, which smoke-lambdas reads.
build-lambdas: lambda-tools
	@host=$$(uname -m); \
	if [ "$$host" = aarch64 ] || rustup target list --installed | grep -qx '$(ARM64_TARGET)' \
	   || timeout 300 rustup target add '$(ARM64_TARGET)'; then \
	  arch=arm64; flag=--arm64; \
	else \
	  arch=$$host; flag=--x86-64; \
	  echo "build-lambdas: the $(ARM64_TARGET) std cannot be installed here; building for the host ($$host) instead of arm64"; \
	fi; \
	echo "build-lambdas: cargo lambda build --release $$flag for $(LAMBDA_BINS)"; \
	PATH="$(abspath $(VENV))/bin:$$PATH" cargo lambda build --release --locked $$flag \
	  $(addprefix -p ,$(LAMBDA_PACKAGES)); \
	echo "$$arch" > $(LAMBDA_DIR)/ARCH; \
	echo "build-lambdas: architecture built: $$arch"; \
	for bin in $(LAMBDA_BINS); do \
	  f=$(LAMBDA_DIR)/$$bin/bootstrap; \
	  test -x "$$f" || { echo "build-lambdas: missing $$f"; exit 1; }; \
	  printf '  %-16s %9d bytes  %s\n' "$$bin" "$$(stat -c %s "$$f")" "$$(file -b "$$f" | cut -d, -f1-2)"; \
	done

## --- smoke-lambdas ------------------------------------------------------------------

# Runs the bootstraps that build-lambdas produced, as they are. An arm64 build on an
# x86_64 host runs under qemu-user (apt, installed when missing), with Debian's aarch64
# libc as the loader's root.
# (Before build-lambdas has written ARCH, as when make test installs it in the
# background, the template's arm64 is assumed.)
qemu-user-tools:
	@arch=$$(cat $(LAMBDA_DIR)/ARCH 2>/dev/null || echo arm64); \
	if [ "$$arch" = arm64 ] && [ "$$(uname -m)" != aarch64 ] \
	   && { ! command -v qemu-aarch64 >/dev/null 2>&1 || [ ! -d '$(ARM64_SYSROOT)/lib' ]; }; then \
	  echo "smoke-lambdas: installing qemu-user and libc6-arm64-cross to run the arm64 bootstraps"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user libc6-arm64-cross >/dev/null; \
	fi

smoke-lambdas: build-lambdas debug-build template-tools qemu-user-tools
	@arch=$$(cat $(LAMBDA_DIR)/ARCH); host=$$(uname -m); runner=""; \
	if [ "$$arch" = arm64 ] && [ "$$host" != aarch64 ]; then \
	  runner="qemu-aarch64 -L $(ARM64_SYSROOT)"; \
	fi; \
	echo "smoke-lambdas: running the $$arch bootstraps$${runner:+ under $$runner}"; \
	rie=$$(ls $(VENV)/lib/python3*/site-packages/samcli/local/rapid/aws-lambda-rie-$$(uname -m | sed 's/aarch64/arm64/') 2>/dev/null | head -1); \
	test -x "$$rie" || { echo "smoke-lambdas: no aws-lambda-rie in $(VENV) (aws-sam-cli bundles it)"; exit 1; }; \
	$(CHECK_ENV) $(DEBUG_BIN)/flashsale-smoke --rie "$$rie" \
	  --lambda-dir $(LAMBDA_DIR) --events events --template template.yaml \
	  $${runner:+--runner "$$runner"}

## --- sam-local ----------------------------------------------------------------------

# Docker's engine, and qemu-user-static for arm64 containers on another host (its binfmt
# handler is what lets the kernel run them; qemu-user, which smoke-lambdas uses, has none).
sam-local-tools:
	@missing=""; command -v dockerd >/dev/null 2>&1 || missing=" docker.io"; \
	arch=$$(cat $(LAMBDA_DIR)/ARCH 2>/dev/null || echo arm64); \
	if [ "$$arch" = arm64 ] && [ "$$(uname -m)" != aarch64 ] && [ ! -x /usr/bin/qemu-aarch64-static ]; then \
	  missing="$$missing qemu-user-static"; \
	fi; \
	if [ -n "$$missing" ]; then \
	  echo "sam-local: installing$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

sam-local: build-lambdas debug-build template-tools sam-local-tools
	$(CHECK_ENV) infra/sam-local/run.sh $(VENV)/bin/sam $(DEBUG_BIN)/flashsale-smoke $(LAMBDA_DIR)

## --- sam-build (not part of make test) ---------------------------------------------

# `sam build` exactly as a deployer runs it (rust-cargolambda: one cargo lambda build per
# function, arm64), into .aws-sam/build. Slower than build-lambdas, which builds all the
# functions in one cargo invocation; offline and without Docker all the same.
sam-build: template-tools lambda-tools
	PATH="$(abspath $(VENV))/bin:$$PATH" $(CHECK_ENV) $(VENV)/bin/sam build
