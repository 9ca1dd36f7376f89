# The two commands of the README: `make plan` and `make test`. Both set up .venv themselves.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STACK ?= dev
STAMP := $(VENV)/.installed
WVENV := .venv-workloads
WSTAMP := $(WVENV)/.installed

.PHONY: plan plan-json test test-fast lint typecheck unit bench golden clean

$(STAMP): requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $(STAMP)

$(WSTAMP): requirements-workloads.txt
	$(PYTHON) -m venv $(WVENV)
	$(WVENV)/bin/python -m pip install --quiet --upgrade pip
	$(WVENV)/bin/python -m pip install --quiet -r requirements-workloads.txt
	touch $(WSTAMP)

NSTAMP := node_modules/.installed
$(NSTAMP): package.json package-lock.json
	npm ci --silent --no-audit --no-fund
	touch $(NSTAMP)

plan: $(STAMP)  ## offline plan of a stack (STACK=dev by default)
	$(PY) -m tools.offline plan --stack $(STACK)

plan-json: $(STAMP)
	$(PY) -m tools.offline plan --stack $(STACK) --json

golden: $(STAMP)  ## regenerate tests/golden/<stack>.json after an intended change to a shipped stack's plan
	$(PY) -m tools.offline golden --write

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/pyright

unit: $(STAMP) $(WSTAMP) $(NSTAMP)
	WORKLOADS_PYTHON=$(WVENV)/bin/python $(PY) -m pytest

bench: $(STAMP) $(WSTAMP)  ## figures: offline-plan scale, workload throughput and checkpoint times
	$(PY) benchmarks/plan_scale.py
	$(PY) benchmarks/workloads.py --python $(WVENV)/bin/python

test: lint typecheck unit  ## everything CI runs

clean:
	rm -rf $(VENV) $(WVENV) node_modules .pytest_cache .ruff_cache
