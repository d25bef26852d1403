# The sale page and the admin console in a real browser (issue 9), included by the
# top-level Makefile:
#   make browser-tools   Debian's chromium (apt, when /usr/bin/chromium is missing), and
#                        Playwright + pytest into the venv. Playwright drives the system
#                        chromium; it never downloads a browser of its own.
#   make browser-test    builds flashsale-local, and runs tests/browser: the tests start
#                        their own stack on free ports and stop it (no process is left).
#                        Every page a test opens is scanned with axe-core when the test
#                        ends, and at the states the tests name: no critical or serious
#                        accessibility violation passes.
#   UPDATE_SCREENSHOTS=1 make browser-test   also refreshes docs/screenshots/.

TOOLS ?= .tools
VENV ?= $(TOOLS)/venv
PIP ?= $(VENV)/bin/pip

CHROMIUM ?= /usr/bin/chromium
PLAYWRIGHT_SPEC ?= playwright==1.65.2
PYTEST_SPEC ?= pytest==9.2.0
# axe-core, the accessibility engine the tests inject into every page they visit. Its own
# npm prefix: a --no-save install into .tools would prune DynamoDB Local's.
AXE_VERSION ?= 4.14.1
AXE := $(TOOLS)/axe/node_modules/axe-core/axe.min.js

.PHONY: browser-tools browser-test chromium

chromium:
	@if [ ! -x '$(CHROMIUM)' ]; then \
	  echo "chromium not found: installing Debian's chromium"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	fi
	@test -x '$(CHROMIUM)'

# Playwright's own script marks the install: pytest alone is no mark, since schemathesis
# (fuzz-api, earlier in make test) brings it into the same venv.
$(VENV)/bin/playwright: | $(PIP)
	PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 $(PIP) install -q '$(PLAYWRIGHT_SPEC)' '$(PYTEST_SPEC)'
	test -x $@

$(AXE):
	mkdir -p $(TOOLS)/axe
	npm install --prefix $(TOOLS)/axe --no-save --no-audit --no-fund axe-core@$(AXE_VERSION)
	test -f $@

browser-tools: chromium $(VENV)/bin/playwright $(AXE)

# The local stack needs the emulators (the top-level Makefile names them).
browser-test: browser-tools java $(DYNAMODB_LOCAL) $(MOTO) debug-build
	FLASHSALE_LOCAL_BIN="$$(pwd)/$(DEBUG_BIN)/flashsale-local" \
	  FLASHSALE_CHROMIUM='$(CHROMIUM)' \
	  FLASHSALE_AXE="$$(pwd)/$(AXE)" \
	  $(VENV)/bin/pytest -q -p no:cacheprovider tests/browser

# The challenge in Chromium, measured (issue 16 §1), into docs/challenge.md: solve times
# per difficulty on one core, and the pulse's spread and fairness with the challenge off
# and on. Part of `make bench`, not `make test`: minutes of CPU.
.PHONY: bench-challenge
bench-challenge: browser-tools java $(DYNAMODB_LOCAL) $(MOTO) debug-build
	FLASHSALE_CHROMIUM='$(CHROMIUM)' $(VENV)/bin/python tests/browser/challenge_bench.py
