# fp8lab: two commands. `make lab` opens the notebooks; `make test` proves them.
# Both create .venv on first use and install fp8lab with the exact versions of constraints.txt
# (pyproject.toml holds the ranges the package accepts; constraints.txt the lab's versions).
# `make lab` installs the package and JupyterLab only; `make setup` (and `make test`) adds the
# test tools (pytest, Playwright, ...).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
LOCK   := constraints.txt
PIP    := $(BIN)/python -m pip install --quiet -c $(LOCK)
LAB_STAMP  := $(VENV)/.fp8lab-lab
TEST_STAMP := $(VENV)/.fp8lab-test
BOOK_STAMP := $(VENV)/.fp8lab-book
PYTHON_FLOOR := 3.11

.PHONY: setup lab-env book-env browser-deps lab test test-machines test-loaded compat lint bench doctor book clean

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < tuple(map(int, "$(PYTHON_FLOOR)".split("."))))' || { \
	  echo "make: fp8lab needs Python $(PYTHON_FLOOR) or newer; $(PYTHON) is $$($(PYTHON) -V 2>&1)." \
	       "Run with PYTHON=python3.12 (or another), or use conda (environment.yml) or Binder." >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# the lab: fp8lab, its dependencies and JupyterLab (no test tools)
lab-env: $(LAB_STAMP)

$(LAB_STAMP): pyproject.toml $(LOCK) | $(BIN)/python
	$(PIP) -e ".[lab]"
	@$(BIN)/python -c "from fp8lab.numerics import kernels; print('fp8lab quantize:', kernels.status()[1])"
	@touch $(LAB_STAMP)

# development and CI: the lab plus the test tools
setup: $(TEST_STAMP)

$(TEST_STAMP): pyproject.toml $(LOCK) | $(BIN)/python
	$(PIP) -e ".[lab,test]"
	@$(BIN)/python -c "from fp8lab.numerics import kernels; print('fp8lab quantize:', kernels.status()[1])"
	@touch $(LAB_STAMP) $(TEST_STAMP) $(BOOK_STAMP)  # the test extra brings the book extra

# The browser test (tests/notebooks/test_browser.py) drives Debian's chromium with Playwright (pinned in
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

lab: lab-env
	$(BIN)/python -m fp8lab lab $(LAB_ARGS)

# the static book: every notebook executed at workshop size and rendered as HTML pages in build/book
# (tools/book.py; open build/book/index.html). BOOK_ARGS=--smoke builds it at small sizes, quickly.
book-env: $(BOOK_STAMP)

$(BOOK_STAMP): pyproject.toml $(LOCK) | $(BIN)/python
	$(PIP) -e ".[lab,book]"
	@touch $(LAB_STAMP) $(BOOK_STAMP)

book: book-env
	$(BIN)/python tools/book.py $(BOOK_ARGS)

test: setup browser-deps
	$(BIN)/ruff check fp8lab tests
	$(BIN)/python -m pytest $(if $(filter 0,$(BROWSER)),-m "not browser") $(PYTEST_ARGS)

# The tests whose numbers move with the machine (MACHINE_SENSITIVE in tests/conftest.py: trained losses,
# the answer key, notebooks 06-08's claims) again, as two other machines run them: one thread with MKL's
# compatible code path, and AVX2 math libraries (the CPUs of many laptops) on this CPU. CI runs it.
# The machines run side by side (the one-thread run leaves a core to the other), each line of their
# output marked with its machine; the numbers do not depend on the load, only the time does.
MACHINES ?= OMP_NUM_THREADS=1,MKL_CBWR=COMPATIBLE ONEDNN_MAX_CPU_ISA=AVX2,MKL_ENABLE_INSTRUCTIONS=AVX2
test-machines: setup
	@codes=$$(mktemp -d); i=0; for m in $(MACHINES); do i=$$((i + 1)); echo "make test-machines: [$$i] $$m"; \
	  { ( env $$(echo $$m | tr , ' ') $(BIN)/python -m pytest -m machine -v -p no:cacheprovider $(PYTEST_ARGS) 2>&1; \
	      echo $$? > $$codes/$$i ) | sed -u "s/^/[$$i] /"; } & done; wait; \
	failed=$$(cd $$codes && for f in *; do [ "$$(cat $$f)" = 0 ] || echo "[$$f]"; done); rm -rf $$codes; \
	[ -z "$$failed" ] || { echo "make test-machines: failed on $$failed" >&2; exit 1; }

# The oldest supported versions (compat.txt, pyproject's floors): a second venv holding them; the core tests,
# the distributed tests (FSDP2 under torchrun) and every notebook (smoke mode, then workshop size with its
# claims) run there. torch from PyPI is a CUDA build: several GB on the first run.
COMPAT_VENV := .venv-compat
COMPAT_TESTS := tests/numerics/test_formats.py tests/numerics/test_quantize.py tests/gemm/test_gemm.py \
                tests/numerics/test_scaling_metrics_recipes.py tests/test_nn.py tests/numerics/test_kernels.py \
                tests/training/test_train.py tests/lab/test_widgets.py
COMPAT_RUNS  := tests/training/test_distributed.py tests/notebooks/test_notebooks.py
compat:
	@[ -x $(COMPAT_VENV)/bin/python ] || $(PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/python -m pip install --quiet -r compat.txt pytest hypothesis nbclient nbformat ipykernel
	$(COMPAT_VENV)/bin/python -m pip install --quiet --no-deps -e .
	$(COMPAT_VENV)/bin/python -m fp8lab doctor | sed -n '/^versions/,/^$$/p'
	$(COMPAT_VENV)/bin/python -m pytest -p no:cacheprovider -q -m "not slow" $(COMPAT_TESTS) $(PYTEST_ARGS)
	$(COMPAT_VENV)/bin/python -m pytest -p no:cacheprovider -q $(COMPAT_RUNS) $(PYTEST_ARGS)

# `make test` while two busy processes hold both cores (tools/under_load.py): the suite judges no time
test-loaded: setup browser-deps
	$(BIN)/python tools/under_load.py --busy 2 -- $(MAKE) test

lint: setup
	$(BIN)/ruff check fp8lab tests

doctor: lab-env
	$(BIN)/python -m fp8lab doctor

bench: lab-env
	$(BIN)/python -m fp8lab bench all

clean:
	rm -rf $(VENV) $(COMPAT_VENV) .pytest_cache .ruff_cache build *.egg-info

# Checks of the checks, not part of `make test`: the mutation check (plausible bugs in the core,
# each must fail the tests that guard it; tools/mutate.py) and the C kernels' tests under AddressSanitizer
# (tools/asan.py; `make asan ARGS=--canary` proves it can fail).
.PHONY: mutate asan
mutate: setup
	$(BIN)/python tools/mutate.py $(ARGS)

asan: setup
	$(BIN)/python tools/asan.py $(ARGS)
