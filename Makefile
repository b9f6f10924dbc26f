# Each target installs what it needs first, into a virtual environment in .venv, so `make train` and
# `make test` work on a fresh clone. `make train` installs what training needs; `make test` adds the
# test extras (pytest, ray, pygame-ce).
#
# torch: an already installed torch is reused (the venv sees the system's site-packages). Otherwise
# TORCH=auto (default) installs the CUDA build where `nvidia-smi` is found and the CPU build (about
# 1 GB smaller installed, no nvidia/triton packages) elsewhere; force one with TORCH=cpu or TORCH=cuda.
# The CPU build is torch==$(TORCH_VERSION)+cpu, from the configured package sources or else from
# TORCH_CPU_INDEX (PyTorch's CPU wheel index); the CUDA build is the default torch wheel of the index.
PYTHON          ?= python3
VENV            ?= .venv
BIN             := $(VENV)/bin
ENV             ?= pong_v3
ARGS            ?=
TORCH           ?= auto
TORCH_VERSION   ?= 2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
TRAIN_STAMP     := $(VENV)/.installed-train
TEST_STAMP      := $(VENV)/.installed-test
# the default suite runs on every core (pytest-xdist, work stealing; the Ray tests take turns through a
# lock file); PYTEST_WORKERS= runs it in one process
PYTEST_WORKERS  ?= -n auto --dist worksteal

.PHONY: install install-test torch test test-slow train bench clean

$(BIN)/python:
	$(PYTHON) -m venv --system-site-packages $(VENV)

# torch first, so that installing madqn does not pull the index's default (CUDA) build
torch: $(BIN)/python
	@kind="$(TORCH)"; why="TORCH=$$kind"; \
	if [ "$$kind" = auto ]; then \
	  if $(BIN)/python -c "import torch" 2>/dev/null; then exit 0; fi; \
	  if command -v nvidia-smi >/dev/null 2>&1; then kind=cuda; why="nvidia-smi found"; \
	  else kind=cpu; why="no nvidia-smi: no NVIDIA GPU"; fi; \
	elif $(BIN)/python -c "import sys, torch; sys.exit(('+cpu' in torch.__version__) != ('$$kind' == 'cpu'))" 2>/dev/null; then \
	  exit 0; \
	fi; \
	if [ "$$kind" = cuda ]; then \
	  echo "installing torch, CUDA build ($$why; TORCH=cpu for the CPU build)"; \
	  $(BIN)/python -m pip install -q "torch>=2.2,<3"; \
	elif [ "$$kind" = cpu ]; then \
	  echo "installing torch $(TORCH_VERSION), CPU build ($$why; TORCH=cuda for the CUDA build)"; \
	  $(BIN)/python -m pip install -q "torch==$(TORCH_VERSION)+cpu" 2>/dev/null || \
	  $(BIN)/python -m pip install -q --extra-index-url "$(TORCH_CPU_INDEX)" "torch==$(TORCH_VERSION)+cpu"; \
	else \
	  echo "TORCH must be auto, cpu or cuda, got '$$kind'" >&2; exit 2; \
	fi

$(TRAIN_STAMP): pyproject.toml
	$(MAKE) --no-print-directory torch
	$(BIN)/python -m pip install -q -e .
	touch $@

$(TEST_STAMP): $(TRAIN_STAMP)
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $@

# TORCH=cpu or TORCH=cuda also switches the build of an existing .venv
ifneq ($(TORCH),auto)
$(TRAIN_STAMP) $(TEST_STAMP): torch
endif

install: $(TRAIN_STAMP)

install-test: $(TEST_STAMP)

test: $(TEST_STAMP)
	$(BIN)/python -m pytest $(PYTEST_WORKERS)

test-slow: $(TEST_STAMP)
	$(BIN)/python -m pytest -m slow

bench: $(TRAIN_STAMP)
	$(BIN)/madqn bench --quick $(ARGS)

train: $(TRAIN_STAMP)
	$(BIN)/madqn train --env $(ENV) $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
