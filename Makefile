# graphsurgeon: `make demo` and `make test` set everything up on a fresh machine.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.graphsurgeon-installed

.PHONY: setup demo test lab bench fuzz lint format clean system-deps

setup: $(STAMP) system-deps

# Python side: the virtual environment, the CPU build of torch (a plain `pip install torch`
# would fetch a multi-GB CUDA build), then the project with its dev extra.
$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[dev]"
	@touch $@

# System side: graphviz's `dot` (rendering) and Chromium (the browser test).
system-deps:
	@bash tools/system-deps.sh

demo: setup
	$(PY) -m graphsurgeon demo

test: setup
	bash tools/run-tests.sh

# As root (a container, CI) Jupyter refuses to start without --allow-root.
lab: setup
	$(VENV)/bin/jupyter lab notebooks $$( [ "$$(id -u)" -eq 0 ] && echo --allow-root )

# Side-by-side performance runs against the anchors (several minutes on 2 cores).
bench: setup
	@for script in benchmarks/*.py; do echo "== $$script"; OMP_NUM_THREADS=1 $(PY) $$script || exit 1; done

fuzz: setup
	OMP_NUM_THREADS=1 $(PY) tools/fuzz.py --programs 10000

lint: setup
	$(VENV)/bin/ruff check graphsurgeon tests benchmarks tools
	$(VENV)/bin/ruff format --check graphsurgeon tests benchmarks tools

format: setup
	$(VENV)/bin/ruff check --fix graphsurgeon tests benchmarks tools
	$(VENV)/bin/ruff format graphsurgeon tests benchmarks tools

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
