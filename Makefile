# OpenXLA GPU Lab Kit. `make lab` opens the lab; `make test` runs every test and notebook.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV  := .venv
PY    := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# With an NVIDIA GPU: the full CUDA stack. Without: the plugin + ptxas for H100 compiles.
EXTRA := $(shell nvidia-smi -L >/dev/null 2>&1 && echo cuda || echo aot)
NBVAL := --nbval-lax --nbval-current-env --nbval-cell-timeout=240 \
         --nbval-sanitize-with tests/nbval_sanitize.cfg
# Jupyter refuses to run as root unless told: containers and cloud VMs often are root.
LAB_ARGS := $(if $(filter 0,$(shell id -u)),--allow-root)
export TF_CPP_MIN_LOG_LEVEL ?= 2
export PYDEVD_DISABLE_FILE_VALIDATION := 1

.PHONY: help setup lab test unit lint run doctor bench lock sync outputs clean

help:  ## list the commands
	@grep -E '^[a-z]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

setup: $(STAMP)  ## make the pinned environment in .venv (Python >= 3.12)

$(STAMP): pyproject.toml constraints.txt
	@if [ ! -x $(PY) ] || ! $(PY) -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then \
	  python=$$(tools/find-python) || exit 1; \
	  echo "creating $(VENV) with $$python"; rm -rf $(VENV); "$$python" -m venv $(VENV) || exit 1; \
	fi
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt \
	  -e ".[$(EXTRA),lab,test]"
	@touch $(STAMP)
	@echo "environment ready: $(VENV) ($(EXTRA) stack)"

lab: setup  ## open JupyterLab on 127.0.0.1 (with a token) in notebooks/
	$(PY) -m jupyter lab --ip=127.0.0.1 --notebook-dir=notebooks $(LAB_ARGS)

test: setup lint  ## unit tests, every notebook under the papermill CLI, lessons under nbval
	$(PY) -m pytest tests $(wildcard notebooks/[0-9]*.ipynb) $(NBVAL)

unit: setup  ## unit tests only (fast)
	$(PY) -m pytest tests -m "not notebook"

lint: setup  ## ruff on code and notebooks
	$(PY) -m ruff check .
	$(PY) -m ruff format --check labkit tests benchmarks

run: setup  ## preflight: execute every notebook, write build/report.md and report.json
	$(PY) -m labkit run --out build $(ARGS)

doctor: setup  ## environment report
	$(PY) -m labkit doctor

bench: setup  ## print the speed budgets (compile times, notebook times)
	$(PY) benchmarks/budgets.py

sync: setup  ## re-pair notebooks and their MyST .md files with jupytext
	$(PY) -m jupytext --sync notebooks/*.ipynb notebooks/solutions/*.ipynb

lock: setup  ## rewrite constraints.txt from the current environment
	@{ sed -n '/^#/p' constraints.txt; $(PY) -m pip freeze --exclude-editable | grep -v '^labkit'; } > constraints.tmp
	@mv constraints.tmp constraints.txt

clean:  ## remove the environment and build outputs
	rm -rf $(VENV) build .pytest_cache

outputs: setup  ## re-run notebooks and store the outputs of NBVAL_CHECK_OUTPUT cells only
	$(PY) -m labkit outputs $(NB)
