# Two commands do all set-up: `make demo` and `make test`. Both create .venv if it is missing.
#
# torch: on a machine with an NVIDIA driver (nvidia-smi) the CUDA build comes from PyPI; on a
# CPU-only machine the CPU build is installed (a local torch-X+cpu wheel if pip's find-links has
# one, else PyTorch's CPU wheel index), so nothing downloads gigabytes of CUDA libraries.
# Override with TORCH_WHEEL=/path/to/torch.whl or TORCH_VERSION=x.y.z.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_WHEEL ?=
STAMP := $(VENV)/.robo_rl-installed
export MUJOCO_GL ?= egl
# pip keeps no second copy of every wheel in ~/.cache: the venv alone is about 2.6 GB.
export PIP_NO_CACHE_DIR ?= 1

.PHONY: demo test test-all bench install torch clean

demo: $(STAMP)
	$(BIN)/robo-rl demo

test: $(STAMP)
	$(BIN)/python -m pytest

test-all: $(STAMP)
	$(BIN)/python -m pytest -m "slow or not slow"

bench: $(STAMP)
	$(BIN)/python bench/data.py

install: $(STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

torch: $(BIN)/python
	@if $(BIN)/python -c "import torch" 2>/dev/null; then \
		echo "torch $$($(BIN)/python -c 'import torch; print(torch.__version__)') already installed"; \
	elif [ -n "$(TORCH_WHEEL)" ]; then \
		$(BIN)/pip install "$(TORCH_WHEEL)"; \
	elif command -v nvidia-smi >/dev/null 2>&1; then \
		echo "NVIDIA driver found: installing the CUDA build of torch $(TORCH_VERSION)"; \
		$(BIN)/pip install "torch==$(TORCH_VERSION)"; \
	else \
		dirs="$${PIP_FIND_LINKS:-} $$($(BIN)/pip config get global.find-links 2>/dev/null || true)"; \
		wheel=$$(for d in $$dirs; do ls "$${d#file://}"/torch-$(TORCH_VERSION)+cpu-*.whl 2>/dev/null; done | head -n1); \
		if [ -n "$$wheel" ]; then \
			echo "no GPU: installing the local CPU wheel $$wheel"; $(BIN)/pip install "$$wheel"; \
		else \
			echo "no GPU: installing the CPU build of torch $(TORCH_VERSION)"; \
			$(BIN)/pip install "torch==$(TORCH_VERSION)+cpu" --extra-index-url $(TORCH_CPU_INDEX); \
		fi; \
	fi

$(STAMP): pyproject.toml | $(BIN)/python
	$(MAKE) torch
	$(BIN)/pip install -e ".[dev,teleop,ogbench,viz]"
	touch $(STAMP)

clean:
	rm -rf $(VENV) .pytest_cache data/demo
