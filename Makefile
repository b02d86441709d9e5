# OpenXLA GPU Lab Kit. `make lab` opens the lab; `make test` runs every test and notebook.
SHELL := /bin/bash
.DEFAULT_GOAL := help

# The environment: an active conda env that already holds the pinned jax (from
# environment.yml or environment-gpu.yml), else .venv, built here on first use.
JAX_PIN   := $(shell sed -n 's/^jax==\([^ ]*\).*/\1/p' constraints.txt | head -n 1)
CONDA_JAX := $(if $(CONDA_PREFIX),$(shell "$(CONDA_PREFIX)/bin/python" -c \
  'import importlib.metadata as m; print(m.version("jax"))' 2>/dev/null))
VENV  := $(if $(filter $(JAX_PIN),$(CONDA_JAX)),$(CONDA_PREFIX),.venv)
PY    := $(VENV)/bin/python
comma := ,
# CUDA 12 by default; `make setup CUDA=13` for JAX's CUDA 13 wheels (GPU servers whose driver
# is CUDA 13). One environment holds one of the two: setup removes the other's plugin.
CUDA ?= 12
C13   := $(if $(filter 13,$(CUDA)),13)
STAMP := $(VENV)/.labkit-installed$(if $(EXTRAS),-$(subst $(comma),-,$(EXTRAS)))$(if $(C13),-cuda13)
# With an NVIDIA GPU: the full CUDA stack. Without: the plugin + ptxas for H100 compiles.
# More optional extras: `make setup EXTRAS=kernels` (cuDNN for 09_kernels, about 1.4 GB).
EXTRA := $(shell nvidia-smi -L >/dev/null 2>&1 && echo cuda || echo aot)$(C13)
OTHER_CUDA := $(if $(C13),jax-cuda12-plugin jax-cuda12-pjrt,jax-cuda13-plugin jax-cuda13-pjrt)
# nbval starts the kernel each notebook names (python3, or labkit-torch for 02b), as Jupyter does.
NBVAL := --nbval-lax --nbval-cell-timeout=240 \
         --nbval-sanitize-with tests/nbval_sanitize.cfg
# Jupyter refuses to run as root unless told: containers and cloud VMs often are root.
LAB_ARGS := $(if $(filter 0,$(shell id -u)),--allow-root)
export TF_CPP_MIN_LOG_LEVEL ?= 2
export PYDEVD_DISABLE_FILE_VALIDATION := 1
# Two jobs: `make test` installs the lab's and PyTorch's environments side by side.
MAKEFLAGS += --jobs=2

.PHONY: help setup setup-torch setup-hub hub hub-stop lab test unit lint run gpu-check doctor bench lock sync outputs clean slides browser-deps slurm slurm-stop slurm-deps

help:  ## list the commands
	@grep -E '^[a-z][a-z0-9-]*:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

setup: $(STAMP)  ## make the pinned environment in .venv (Python >= 3.12)

$(STAMP): pyproject.toml constraints.txt tools/kernel-spec labkit/cli/kernel.py
	@if [ "$(VENV)" = .venv ] && { [ ! -x $(PY) ] || \
	    ! $(PY) -c 'import sys; sys.exit(sys.version_info < (3, 12))'; }; then \
	  python=$$(tools/find-python) || exit 1; \
	  echo "creating $(VENV) with $$python"; rm -rf $(VENV); "$$python" -m venv $(VENV) || exit 1; \
	fi
	@echo "installing the pinned packages into $(VENV) (first time: about 1 GB of downloads)"
	@if $(PY) -m pip show --quiet $(OTHER_CUDA) 2>/dev/null; then \
	  echo "CUDA=$(CUDA): removing $(OTHER_CUDA)"; \
	  $(PY) -m pip uninstall --quiet --yes $(OTHER_CUDA) || exit 1; \
	  find $(VENV) -maxdepth 1 -name '.labkit-installed*' -delete; \
	fi
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt \
	  -e ".[$(EXTRA),export,tf,lab,test$(if $(EXTRAS),$(comma)$(EXTRAS))]"
	$(PY) tools/kernel-spec
	@touch $(STAMP)
	@echo "environment ready: $(VENV) ($(EXTRA) stack); the command: $(VENV)/bin/labkit"

# JupyterLab's defaults for the lab (a learner can still change them): no pop-up asking to
# fetch Jupyter news, no update check. Defaults live in the environment's overrides.d.
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.d/labkit.json
lab: setup  ## open JupyterLab on 127.0.0.1 (with a token) in notebooks/
	@[ -f $(TORCH_SPEC) ] || echo "note: 02b_export_pytorch needs PyTorch's kernel: make setup-torch (3 GB)"
	@install -D -m 644 tools/jupyterlab_overrides.json $(LAB_OVERRIDES)
	@$(PY) -m labkit flags check --warn  # a bad XLA_FLAGS: its table and a warning, then on
	$(PY) -m jupyter lab --ip=127.0.0.1 --notebook-dir=notebooks \
	  --config=tools/jupyter_server_config.json $(LAB_ARGS)

# Three workers on CI's two cores: while one waits (a timeout a test provokes, a server or a
# kernel starting, a SLURM job), the other two keep both cores busy; measured on a fresh clone,
# two workers left ~9% of the cores idle. pytest-xdist keeps each notebook's cells (nbval) and
# each test file together
# (xdist's loadscope); each whole-notebook papermill run goes to whichever worker is free, in
# the order tests/conftest.py gives. The PyTorch tests run in .venv-torch from one of those
# scopes (tests/test_torch_suite.py).
# No shared JAX compilation cache: it would save CPU compiles on the second run of a lesson,
# but an executable loaded from it cannot be serialized again (01_pjrt, tests/test_pjrt.py).
test: setup setup-torch setup-hub lint browser-deps slurm-deps  ## unit tests, every notebook under the papermill CLI, lessons under nbval
	$(PY) -m pytest tests $(wildcard notebooks/[0-9]*.ipynb) $(NBVAL) -n 3 --dist loadscope --no-loadscope-reorder --durations=40

unit: setup  ## unit tests only (fast)
	$(PY) -m pytest tests -m "not notebook"

lint: setup  ## ruff on code and notebooks, mypy on labkit and tests/typing
	$(PY) -m ruff check .
	$(PY) -m ruff format --check labkit tests benchmarks tools
	$(PY) -m mypy labkit tests/typing

run: setup  ## preflight: every notebook headless -> build/report.md (ARGS="-p MODE cpu")
	$(VENV)/bin/labkit run --out build $(ARGS)

# On a machine with NVIDIA GPUs (1 to 8), in under 10 minutes: every notebook in GPU mode,
# measured steps against the model, FP8 over bf16, XLA's autotune results kept for deviceless
# compiles. ARGS=--dry-run says what it would do, anywhere.
gpu-check: setup  ## the GPU run: notebooks, measured steps, autotune results (ARGS=--dry-run)
	$(VENV)/bin/labkit gpu-check $(ARGS)

slides: setup  ## one offline reveal.js deck per notebook -> slides/ (ARGS="--stored": no runs)
	$(PY) tools/slides.py $(ARGS)

# The browser tests drive Debian's Chromium (never Playwright's own download). As root it is
# installed here; otherwise those tests are skipped and say why.
browser-deps:  ## Chromium for the browser tests (Debian's package; needs root)
	@if [ -x /usr/bin/chromium ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing Debian's chromium for the browser tests (about 120 MB)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq --no-install-recommends chromium >/dev/null; \
	else \
	  echo "no /usr/bin/chromium and not root: the browser tests will be skipped"; \
	fi

# SLURM on this machine: Debian's slurm-wlm and munge, started
# without systemd by labkit.parallel.local_slurm, every daemon on loopback (SLURM_NODES=2: two
# simulated hosts in network namespaces). 07 runs its SLURM section on it; the SLURM tests
# start clusters of their own. As root the packages are installed here (9 packages, ~13 MB);
# otherwise those tests are skipped and say why.
SLURM_DIR   ?= build/slurm
SLURM_NODES ?= 1
# Under `make test` after browser-deps (two apt-get at once would fight over apt's locks).
slurm-deps: | $(if $(filter test,$(MAKECMDGOALS)),browser-deps)
slurm-deps:  ## Debian's slurm-wlm and munge for make slurm and the SLURM tests (needs root)
	@if command -v slurmctld >/dev/null && command -v munged >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing Debian's slurm-wlm and munge for the SLURM tests (about 13 MB)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null; \
	else \
	  echo "no slurmctld or munged and not root: the SLURM tests and 07's SLURM runs are skipped"; \
	fi

slurm: setup slurm-deps  ## a SLURM cluster on this machine, loopback only (root; SLURM_NODES=2)
	$(PY) -m labkit.parallel.local_slurm up --folder $(SLURM_DIR) --nodes $(SLURM_NODES)

slurm-stop:  ## stop make slurm's cluster: its jobs, daemons and namespaces, by pid
	@if [ -x $(PY) ]; then $(PY) -m labkit.parallel.local_slurm down --folder $(SLURM_DIR); \
	else echo "no $(VENV): no SLURM cluster to stop"; fi

doctor: setup  ## environment report: versions, devices, XLA_FLAGS, a test H100 compile
	$(VENV)/bin/labkit doctor

# PyTorch lives in an environment of its own: PyPI ships only CUDA builds of torch (about
# 3 GB), too much for the main one. .venv-torch holds labkit, jax and torch + torchax; its
# Jupyter kernel "labkit-torch" is registered in $(VENV), so JupyterLab, papermill and nbval
# find it by the name 02b_export_pytorch asks for. `make bench` times PyTorch in it too.
TORCH_VENV  := .venv-torch
TORCH_STAMP := $(TORCH_VENV)/.labkit-installed
TORCH_SPEC  := $(VENV)/share/jupyter/kernels/labkit-torch/kernel.json
setup-torch: $(TORCH_SPEC)  ## .venv-torch: PyTorch + torchax for 02b and make bench (3 GB download)

# Independent of $(STAMP), so `make test` (two jobs, see MAKEFLAGS) builds both at once.
$(TORCH_STAMP): pyproject.toml constraints.txt constraints-torch.txt
	@if [ ! -x $(TORCH_VENV)/bin/python ] || \
	    ! $(TORCH_VENV)/bin/python -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then \
	  python=$$(tools/find-python) || exit 1; \
	  echo "creating $(TORCH_VENV) with $$python"; rm -rf $(TORCH_VENV); \
	  "$$python" -m venv $(TORCH_VENV) || exit 1; \
	fi
	@echo "installing PyTorch and torchax into $(TORCH_VENV) (first time: about 3 GB of downloads)"
	$(TORCH_VENV)/bin/python -m pip install --quiet --disable-pip-version-check \
	  -c constraints.txt -c constraints-torch.txt -e ".[$(EXTRA),torch,lab,test]"
	@touch $(TORCH_STAMP)

# The kernel goes into the lab's environment, once that exists.
$(TORCH_SPEC): $(STAMP) $(TORCH_STAMP) tools/kernel-spec
	$(TORCH_VENV)/bin/python tools/kernel-spec --name labkit-torch $(VENV)

bench: setup setup-torch  ## speed budgets (compiles, every make test phase) and the kit vs PyTorch
	$(PY) benchmarks/budgets.py
	$(PY) benchmarks/capstone_bench.py

sync: setup  ## re-pair notebooks and their MyST .md files with jupytext
	$(PY) -m jupytext --sync notebooks/*.ipynb notebooks/solutions/*.ipynb

lock: setup setup-torch  ## rewrite constraints.txt (and -torch.txt, -hub.txt) from the environments
	@{ grep '^#' constraints.txt | grep -v '^# Editable'; $(PY) -m pip freeze --exclude-editable | grep -v '^labkit\|^# Editable'; } > constraints.tmp
	@mv constraints.tmp constraints.txt
	@{ grep '^#' constraints-torch.txt; $(TORCH_VENV)/bin/python -m pip freeze --exclude-editable \
	  | grep -v '^labkit\|^#' | grep -vxFf constraints.txt; } > constraints.tmp
	@mv constraints.tmp constraints-torch.txt
	@if [ -x $(HUB_VENV)/bin/python ]; then \
	  { grep '^#' constraints-hub.txt; $(PY) -m pip --python $(HUB_VENV)/bin/python freeze \
	    --path $$($(HUB_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') \
	    | grep -vxFf constraints.txt; } > constraints.tmp && mv constraints.tmp constraints-hub.txt; fi

clean:  ## remove .venv and build outputs (never a conda environment)
	rm -rf .venv build .pytest_cache

# The room: JupyterHub for many learners on this machine (README: "A lab room"). .venv-hub
# holds only JupyterHub and its helpers and reaches the kit's packages through a .pth file;
# learners' kernels are the kit's environment. As root, each learner is a system user.
HUB_VENV  := .venv-hub
HUB_STAMP := $(HUB_VENV)/.labkit-installed
HUB_IP    ?= 127.0.0.1
HUB_PORT  ?= 8000
HUB_ARGS  ?=
setup-hub: $(HUB_STAMP)  ## .venv-hub: JupyterHub 6, its proxy and idle culler, for make hub

$(HUB_STAMP): $(STAMP) pyproject.toml constraints.txt constraints-hub.txt tools/kernel-spec \
    tools/hub/build_env.py tools/hub/package.json tools/hub/package-lock.json
	$(PY) tools/hub/build_env.py $(HUB_VENV)
	@touch $(HUB_STAMP)

hub: setup-hub  ## open the room: JupyterHub for learners (HUB_IP, HUB_PORT, HUB_ARGS; README)
	$(HUB_VENV)/bin/python tools/hub/hubctl.py start --ip $(HUB_IP) --port $(HUB_PORT) \
	  --kit-env $(abspath $(VENV)) $(HUB_ARGS)

hub-stop:  ## close the room: stop JupyterHub, every learner's server and kernel
	@if [ -x $(HUB_VENV)/bin/python ]; then $(HUB_VENV)/bin/python tools/hub/hubctl.py stop; \
	else echo "no $(HUB_VENV): no room to stop"; fi

outputs: setup  ## re-run notebooks and store the outputs of NBVAL_CHECK_OUTPUT cells only
	$(VENV)/bin/labkit outputs $(NB)
