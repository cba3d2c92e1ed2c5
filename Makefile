# Two commands on a fresh machine: `make run` (demo) and `make test` (whole suite).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install proto lint test test-unit bench run clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,bench,dev,plot]'
	touch $(STAMP)

proto: $(STAMP)
	$(PY) -m tools.genproto

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy ratelimit_sidecar simulator tools harness bench tests

test: $(STAMP)
	$(PY) -m pytest tests

test-unit: $(STAMP)
	$(PY) -m pytest tests/unit

bench: $(STAMP)
	bash bench/ensure-tools.sh
	$(PY) -m bench

run: $(STAMP)
	$(PY) -m harness.demo

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache
