# The two commands of the README: `make plan` and `make test`. Both set up .venv themselves.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STACK ?= dev
STAMP := $(VENV)/.installed
PSTAMP := $(VENV)/.installed-plan
WVENV := .venv-workloads
WSTAMP := $(WVENV)/.installed

.PHONY: plan plan-json test test-fast lint typecheck unit bench golden lock agent-wheelhouse clean

# Installs come from the lock files (every package pinned, with hashes): `make lock` recompiles them
# from the requirements-*.txt files, which name the direct dependencies.
$(PSTAMP): requirements-plan.lock
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --require-hashes -r requirements-plan.lock
	touch $(PSTAMP)

$(STAMP): requirements-dev.lock
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --require-hashes -r requirements-dev.lock
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .  # the tpu-runs command (pyproject.toml)
	touch $(STAMP) $(PSTAMP)

$(WSTAMP): requirements-workloads.lock
	$(PYTHON) -m venv $(WVENV)
	$(WVENV)/bin/python -m pip install --quiet --upgrade pip
	$(WVENV)/bin/python -m pip install --quiet --require-hashes -r requirements-workloads.lock
	touch $(WSTAMP)

LOCK := $(VENV)/bin/uv pip compile --quiet --generate-hashes --python-version 3.11 --python-platform x86_64-manylinux_2_28
lock: $(STAMP)  ## recompile the *.lock files after editing a requirements-*.txt (and the examples' locks)
	for r in requirements requirements-plan requirements-dev requirements-workloads; do $(LOCK) $$r.txt -o $$r.lock; done
	# The VM agent's own environment (tools/agent_wheelhouse.py), resolved for the oldest Python it serves.
	$(subst 3.11,3.10,$(LOCK)) requirements-agent.txt -o requirements-agent.lock
	$(PY) -m tools.agent_wheelhouse --write-pin  # the digest of the wheelhouse that lock builds, which the plan names
	# What a VM installs for an example, by hash (vm_agent/installs.py); the TPU image brings the framework.
	$(LOCK) workloads/jax_mnist/requirements.txt -o workloads/jax_mnist/requirements.lock \
	  --no-emit-package jax --no-emit-package jaxlib --no-emit-package numpy --no-emit-package scipy \
	  --no-emit-package ml-dtypes --no-emit-package opt-einsum
	$(LOCK) workloads/tf_mnist/requirements.txt -o workloads/tf_mnist/requirements.lock
	# TensorFlow before 2.18 (Python 3.10 images) needs protobuf<5: a second lock the agent picks there.
	cd workloads/tf_mnist && $(subst 3.11,3.10,$(subst $(VENV),../../$(VENV),$(LOCK))) \
	  requirements-tf-before-2.18.txt -o requirements-tf-before-2.18.lock
	# What the start-up script installs by hash when an image lacks the pinned framework (infra/catalog).
	cd infra/catalog/framework_locks && for t in *.txt; do \
	  $(VENV:%=../../../%)/bin/uv pip compile --quiet --generate-hashes --python-platform x86_64-manylinux_2_31 \
	    --python-version $$(sed -n 's/^# python: //p' $$t) $$t -o $${t%.txt}.lock; done

# The agent's wheels for each Python it serves, from requirements-agent.lock by hash, as one archive named by
# its sha256 under build/agent-wheelhouse/ (it downloads from the package index; it installs nothing here),
# checked against the digest requirements-agent.wheelhouse pins, which the plan reads (a different build fails;
# `make lock` writes the pin). `pulumi up` uploads the archive; the tests' sandboxed VMs install from it.
WHEELHOUSE := build/agent-wheelhouse/$(shell sed -n 's/^sha256 //p' requirements-agent.wheelhouse).tar.gz
$(WHEELHOUSE): requirements-agent.lock | $(STAMP)
	$(PY) -m tools.agent_wheelhouse
agent-wheelhouse: $(STAMP)
	$(PY) -m tools.agent_wheelhouse

NSTAMP := node_modules/.installed
$(NSTAMP): package.json package-lock.json
	npm ci --silent --no-audit --no-fund
	touch $(NSTAMP)

plan: $(PSTAMP)  ## offline plan of a stack (STACK=dev by default)
	$(PY) -m tools.offline plan --stack $(STACK)

plan-json: $(PSTAMP)
	$(PY) -m tools.offline plan --stack $(STACK) --json

golden: $(STAMP)  ## regenerate tests/golden/<stack>.json after an intended change to a shipped stack's plan
	$(PY) -m tools.offline golden --write

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/pyright

# Tests run in JOBS processes (pytest-xdist): two, the cores of the machines this project is built on;
# a number, not `auto`, which counts the host's CPUs even where a container may use only two.
JOBS ?= 2
unit: $(STAMP) $(WSTAMP) $(NSTAMP) $(WHEELHOUSE)
	WORKLOADS_PYTHON=$(WVENV)/bin/python $(PY) -m pytest -n $(JOBS)

bench: $(STAMP) $(WSTAMP)  ## figures: offline-plan scale, workload throughput and checkpoint times, goodput model
	$(PY) benchmarks/plan_scale.py
	$(PY) benchmarks/goodput_model.py
	$(PY) benchmarks/goodput_recording.py
	$(PY) benchmarks/workloads.py --python $(WVENV)/bin/python

test-fast: $(STAMP) $(WHEELHOUSE)  ## the tests that need no TensorFlow, JAX or npm, and no real training
	$(PY) -m pytest -q -m "not slow and not workloads and not npm"

test: lint typecheck unit  ## everything CI runs

clean:
	rm -rf $(VENV) $(WVENV) node_modules .pytest_cache .ruff_cache
