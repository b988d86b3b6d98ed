# Two commands do all the set-up: `make run` (the demo) and `make test` (every test).
# Both create .venv first when it is missing.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
TORCH_VERSION ?= 2.13.0
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: setup run test test-unit test-integration test-e2e lint fmt proto validate-deploy bench clean

setup: $(STAMP)

# torch first: with no torch installed, a dependency range would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "torch==$(TORCH_VERSION)"
	$(PIP) install -q -e ".[test,bench]"
	touch $(STAMP)

run: setup
	$(VENV)/bin/mutualrl up -c configs/demo.yaml

test: setup validate-deploy
	$(PY) -m pytest tests -q -ra $(PYTEST_ARGS)

test-unit: setup
	$(PY) -m pytest tests/unit -q $(PYTEST_ARGS)

test-integration: setup
	$(PY) -m pytest tests/integration -q $(PYTEST_ARGS)

test-e2e: setup
	$(PY) -m pytest tests/e2e -q $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .

fmt: setup
	$(VENV)/bin/ruff check --fix .

proto: setup
	$(PY) -m grpc_tools.protoc -Iproto --python_out=proto --grpc_python_out=proto \
		--pyi_out=proto proto/mutualrl/v1/*.proto

validate-deploy: setup
	PATH="$(abspath $(VENV))/bin:$$PATH" bash scripts/validate_deploy.sh

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache .hypothesis
