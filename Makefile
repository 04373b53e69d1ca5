# fp8lab: two commands. `make lab` opens the notebooks; `make test` proves them.
# Both create .venv on first use and install the pinned versions from pyproject.toml.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.fp8lab-installed

.PHONY: setup browser-deps lab test lint bench doctor clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[lab,test]"
	@$(BIN)/python -c "from fp8lab import kernels; print('fp8lab quantize:', kernels.status()[1])"
	@touch $(STAMP)

# The browser test (tests/test_browser.py) drives Debian's chromium with Playwright (pinned in
# the `test` extra; Playwright's own browser download is not used). apt-get only when missing.
# `make test BROWSER=0` skips both the browser test and this install (a laptop without apt).
BROWSER ?= 1

browser-deps:
	@[ "$(BROWSER)" = 0 ] || command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" -eq 0 ]; then SUDO=; elif command -v sudo >/dev/null 2>&1; then SUDO=sudo; \
	  else echo "make: the browser test needs chromium: install it (Debian: apt-get install chromium)" >&2; exit 1; fi; \
	  command -v apt-get >/dev/null 2>&1 || { echo "make: no apt-get here: install chromium yourself" >&2; exit 1; }; \
	  echo "installing Debian's chromium for the browser test (apt-get, ~15 s)"; \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null; \
	  command -v chromium >/dev/null 2>&1; }

lab: setup
	$(BIN)/python -m fp8lab lab

test: setup browser-deps
	$(BIN)/ruff check fp8lab tests
	$(BIN)/python -m pytest $(if $(filter 0,$(BROWSER)),-m "not browser") $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check fp8lab tests

doctor: setup
	$(BIN)/python -m fp8lab doctor

bench: setup
	$(BIN)/python -m fp8lab bench all

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info

# Checks of the checks, not part of `make test`: the mutation check (45 plausible bugs in the core,
# each must fail the fast tests; tools/mutate.py) and the C kernels' tests under AddressSanitizer
# (tools/asan.py; `make asan ARGS=--canary` proves it can fail).
.PHONY: mutate asan
mutate: setup
	$(BIN)/python tools/mutate.py $(ARGS)

asan: setup
	$(BIN)/python tools/asan.py $(ARGS)
