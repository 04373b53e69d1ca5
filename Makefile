# fp8lab: two commands. `make lab` opens the notebooks; `make test` proves them.
# Both create .venv on first use and install the pinned versions from pyproject.toml.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.fp8lab-installed

.PHONY: setup lab test lint bench doctor clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[lab,test]"
	@touch $(STAMP)

lab: setup
	$(BIN)/python -m fp8lab lab

test: setup
	$(BIN)/ruff check fp8lab tests
	$(BIN)/python -m pytest

lint: setup
	$(BIN)/ruff check fp8lab tests
	$(BIN)/ruff format --check fp8lab tests

doctor: setup
	$(BIN)/python -m fp8lab doctor

bench: setup
	$(BIN)/python -m fp8lab bench all

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info
