# Two commands on a fresh machine: `make run` (demo) and `make test` (whole suite).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
CLIENTS := tests/clients/node_modules/.installed
# The suites that exercise the gRPC port, run again on the grpcio transport (the default run
# uses the fast one); the in-process gRPC and RLQS tests are parametrized over both already.
GRPCIO_TESTS := tests/e2e tests/integration/test_workers.py tests/integration/test_cli.py \
	tests/integration/test_rlqs_service.py
# The request path is compiled with mypyc (tools/compile.py), and rebuilt by every target that runs
# it once a source changed; `make <target> BUILD=pure` runs the pure-Python sources instead. The
# package's unit tests also run on the sources alone (SIDECAR_SOURCES_ONLY: tests/unit/conftest.py),
# so that both builds are tested.
BUILD ?= compiled
PACKAGE_UNIT_TESTS := tests/unit --ignore=tests/unit/simulator --ignore=tests/unit/bench

.PHONY: install proto lint test test-unit bench run clean compile uncompile

install: $(STAMP) $(CLIENTS) compile

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,bench,dev,plot]'
	touch $(STAMP)

# Test clients beyond Python: h2load, node (bench/ensure-tools.sh installs them as root), and
# @grpc/grpc-js from npm. A missing one fails its tests with how to install it.
$(CLIENTS): tests/clients/package.json
	-bash bench/ensure-tools.sh
	-cd tests/clients && npm install --no-audit --no-fund --silent && touch node_modules/.installed

proto: $(STAMP)
	$(PY) -m tools.genproto

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy ratelimit_sidecar simulator tools harness bench tests setup.py

test: install
ifneq ($(BUILD),pure)
	SIDECAR_SOURCES_ONLY=1 $(PY) -m pytest -q $(PACKAGE_UNIT_TESTS)
endif
	$(PY) -m pytest tests
	RLS_TRANSPORT=grpcio $(PY) -m pytest $(GRPCIO_TESTS)

test-unit: $(STAMP) compile
	$(PY) -m pytest tests/unit

bench: $(STAMP) compile
	bash bench/ensure-tools.sh
	$(PY) -m bench

run: $(STAMP) compile
	$(PY) -m harness.demo

# With BUILD=pure, `compile` removes the build instead: the targets that depend on it run the sources.
ifeq ($(BUILD),pure)
compile: uncompile
else
compile: $(STAMP)
	$(PY) -m tools.compile
endif

uncompile:
	$(PY) -m tools.compile --clean

clean:
	find ratelimit_sidecar -name '*.so' -delete
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache
