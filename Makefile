# numafit — two commands on a fresh machine: `make demo` and `make test`.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTHON ?= python3

.PHONY: setup test lint typecheck imports unit pytest demo clean test-real docs

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: setup
	$(VENV)/bin/mypy

# The import contracts of pyproject.toml ([tool.importlinter]): the layers, services independent.
imports: setup
	$(VENV)/bin/lint-imports --no-cache --no-logo

# The pure tier only (tests/tiers.py: tests that start nothing), in well under a minute.
unit: setup
	$(VENV)/bin/pytest -q -m pure

# Every tier (`-m services`, `e2e`, `chaos`, `ops`, `real` pick one).
pytest: setup
	$(VENV)/bin/pytest -q

test: lint typecheck imports pytest

# The real tier alone (tests/real): upstream etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler and kubelet from the folder KUBEBUILDER_ASSETS names (envtest's convention),
# by default .cache/k8s where `../shared/k8s/install .cache/k8s` unpacked them. Without them
# every real test is skipped with one line. `make test` runs the tier only when
# KUBEBUILDER_ASSETS is exported.
REAL_ASSETS := $(or $(KUBEBUILDER_ASSETS),$(if $(wildcard .cache/k8s/kube-apiserver),$(CURDIR)/.cache/k8s))
test-real: setup
	KUBEBUILDER_ASSETS=$(REAL_ASSETS) $(VENV)/bin/pytest -q -m real tests/real

demo: setup
	$(VENV)/bin/numafit demo

# The documentation site (mkdocs.yml, docs/) into site/; --strict makes every warning (a broken
# link or anchor, a page missing from the nav) an error. The docs extra is installed into the
# same .venv on first use, as `make setup` installs the test extra.
DOCS_STAMP := $(VENV)/.docs-installed
$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis

# Regenerate the device plugin API stubs (proto/v1beta1) after editing api.proto.
.PHONY: proto
proto: setup
	$(PY) -m grpc_tools.protoc -I . --python_out=. --pyi_out=. --grpc_python_out=. proto/v1beta1/api.proto
