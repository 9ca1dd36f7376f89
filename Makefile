# The two commands of the README: `make plan` and `make test`. Both set up .venv themselves.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STACK ?= dev
STAMP := $(VENV)/.installed

.PHONY: plan plan-json test lint typecheck unit clean

$(STAMP): requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $(STAMP)

plan: $(STAMP)  ## offline plan of a stack (STACK=dev by default)
	$(PY) -m infra.offline plan --stack $(STACK)

plan-json: $(STAMP)
	$(PY) -m infra.offline plan --stack $(STACK) --json

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/pyright

unit: $(STAMP)
	$(PY) -m pytest

test: lint typecheck unit  ## everything CI runs

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
